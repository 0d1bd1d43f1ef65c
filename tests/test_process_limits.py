"""Process limits raised at start (issue 53): the soft RLIMIT_NOFILE goes to the hard limit, as Go programs such as
Ollama do, in the CLI (and so the server it runs) and in a child runner."""
from __future__ import annotations

import subprocess
import sys

PROBE = """
import atexit, resource, sys
atexit.register(lambda: print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True))
{call}
"""


def _soft_after(call: str) -> int:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))

    proc = subprocess.run([sys.executable, "-c", PROBE.format(call=call)], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)
    line = [x for x in proc.stdout.splitlines() if x.startswith("soft ")]
    assert line, (proc.stdout, proc.stderr[-2000:])
    return int(line[-1].split()[1])


def test_the_cli_raises_its_soft_descriptor_limit_to_the_hard_one():
    assert _soft_after("sys.argv = ['ollapy', '--version']\nfrom ollapy.cli.main import main\nmain()") == 2048


def test_a_child_runner_raises_it_too():
    assert _soft_after("from ollapy.runner.child import prepare_process\nprepare_process()") == 2048


def test_nothing_to_raise_is_fine():
    assert _soft_after("from ollapy.fsutil import raise_open_file_limit\n"
                       "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))\n"
                       "assert raise_open_file_limit() == (100, 100)") == 100
