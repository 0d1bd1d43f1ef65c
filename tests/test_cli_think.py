"""``ollapy run --think / --hidethinking`` on a real thinking model, in-process, through a server and in the REPL.

``smol-think`` (tests/think_models.py: SmolLM2 with an R1-style template) reasons, closes the section and
answers, greedily and exactly; ``smol`` (SmolLM2's own template) has no thinking.
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pexpect
import pytest
from conftest import ROOT, live_server, run_cli
from think_models import ANSWER, THINKING, Q, think_modelfile

G = ("-o", "temperature=0", "-o", "repeat_penalty=1", "-o", "num_predict=40")
PLAIN = f"Thinking...\n{THINKING}\n...done thinking.\n\n{ANSWER}\n".encode()
REFUSED = b'Error: "smol" does not support thinking\n'


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    """A store with ``smol-think`` and ``smol``; ``env`` points the CLI at it (and at no server)."""
    base = tmp_path_factory.mktemp("cli-think")
    env = {"OLLAPY_MODELS": str(base / "models"), "OLLAPY_HOST": "127.0.0.1:9"}
    (base / "Modelfile").write_text(think_modelfile(smollm2_path))
    (base / "Modelfile.smol").write_text(f"FROM {smollm2_path}\n")
    for name, mf in (("smol-think", "Modelfile"), ("smol", "Modelfile.smol")):
        p = run_cli("create", name, "-f", str(base / mf), env=env)
        assert p.returncode == 0, p.stderr
    return SimpleNamespace(base=base, env=env)


def _run(store, *args, input=None, env=None):
    return run_cli("run", *args, input=input, env={**store.env, **(env or {})})


def test_thinking_model_prints_reasoning_then_answer_plainly_when_piped(store):
    for flags in ((), ("--think",), ("--think=low",)):  # unset means on for a thinking model, as in Ollama
        p = _run(store, "smol-think", *G, *flags, Q)
        assert p.returncode == 0, p.stderr
        assert p.stdout == PLAIN, flags  # stdout is a pipe: the marker lines, and no escape codes
        assert b"\x1b" not in p.stdout + p.stderr
    p = _run(store, "smol-think", *G, input=Q + "\n")  # piped prompt
    assert (p.returncode, p.stdout) == (0, PLAIN), p.stderr
    # `--think VALUE` with a space: the flag is bare (on) and the word is the prompt, as with Ollama's --think
    p = _run(store, "smol-think", *G, "--think", Q)
    assert p.stdout == PLAIN, p.stderr


def test_hidethinking_and_think_false_print_the_answer_only(store):
    for flags in (("--hidethinking",), ("--think=false",), ("--think=high", "--hidethinking")):
        p = _run(store, "smol-think", *G, *flags, Q)
        assert (p.returncode, p.stdout) == (0, f"{ANSWER}\n".encode()), (flags, p.stderr)


def test_think_on_a_model_without_thinking_is_one_error_line(store):
    for flags in (("--think",), ("--think=high",)):
        p = _run(store, "smol", *flags, Q)
        assert (p.returncode, p.stdout, p.stderr) == (1, b"", REFUSED), flags
    p = _run(store, "smol", "--think=maybe", Q)
    assert p.returncode == 2 and b"invalid think value" in p.stderr and p.stderr.count(b"\n") == 1
    p = _run(store, "smol", *G, "-o", "num_predict=8", "--think=false", Q)  # false is accepted and ignored
    assert p.returncode == 0 and p.stdout.strip() and b"Thinking" not in p.stdout, p.stderr


def test_each_line_json_has_a_thinking_field(store):
    p = _run(store, "smol-think", *G, "--each-line", "--json", input=f"{Q}\n\n")
    assert p.returncode == 0, p.stderr
    recs = [json.loads(ln) for ln in p.stdout.decode().splitlines()]
    assert (recs[0]["thinking"], recs[0]["response"]) == (THINKING, ANSWER)
    assert "thinking" not in recs[1]  # a blank line: nothing generated
    p = _run(store, "smol-think", *G, "--each-line", input=f"{Q}\n")  # plain lines: the answer only
    assert p.stdout == f"{ANSWER}\n".encode(), p.stderr
    p = _run(store, "smol-think", *G, "--each-line", "--json", "--hidethinking", input=f"{Q}\n")
    assert "thinking" not in json.loads(p.stdout) and json.loads(p.stdout)["response"] == ANSWER


def test_through_a_running_server_the_output_is_the_same(store):
    import httpx

    with live_server(store.base) as url:  # the server's store is the one the models were created in
        env = {"OLLAPY_HOST": url.removeprefix("http://")}
        p = _run(store, "smol-think", *G, Q, env=env)
        assert (p.returncode, p.stdout) == (0, PLAIN), p.stderr
        assert [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]] == ["smol-think:latest"]
        p = _run(store, "smol-think", *G, "--hidethinking", Q, env=env)
        assert p.stdout == f"{ANSWER}\n".encode(), p.stderr
        p = _run(store, "smol", "--think", Q, env=env)
        assert (p.returncode, p.stdout, p.stderr) == (1, b"", REFUSED)
        p = _run(store, "smol-think", *G, "--each-line", "--json", input=f"{Q}\n", env=env)
        rec = json.loads(p.stdout)
        assert (rec["thinking"], rec["response"]) == (THINKING, ANSWER), p.stderr
        assert "draft" not in rec and "image_encode_duration" not in rec  # as in-process: only when they apply


def test_repl_set_think_and_nothink(store):
    env = {**os.environ, **store.env, "OLLAPY_NOHISTORY": "1"}
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", "smol-think", *G], env=env, encoding="utf-8",
                      timeout=120, cwd=str(ROOT), dimensions=(40, 200))
    c.expect_exact(">>> ")
    c.sendline("/show info")
    c.expect_exact("Capabilities")
    c.expect_exact("thinking")
    c.expect(r"think +on \(default\)")
    c.expect_exact(">>> ")
    c.sendline("/set nothink")
    c.expect_exact("Set 'nothink' mode.")
    c.expect_exact(">>> ")
    c.sendline(Q)
    c.expect_exact(ANSWER)
    c.expect_exact(">>> ")
    assert "Thinking..." not in c.before
    c.sendline("/load smol-think")  # a fresh chat with the model's MESSAGE example (/clear would drop it too)
    c.expect_exact(">>> ")
    c.sendline("/set think")
    c.expect_exact("Set 'think' mode.")
    c.expect_exact(">>> ")
    c.sendline(Q)
    c.expect_exact("\x1b[38;5;245m\x1b[1mThinking...\r\n")  # on a terminal: dimmed, as Ollama prints it
    c.expect_exact(THINKING)
    c.expect_exact("...done thinking.")
    c.expect_exact(ANSWER)
    c.expect_exact(">>> ")
    c.sendline("/help /set")
    c.expect_exact("/set nothink")
    c.expect_exact(">>> ")
    c.sendline("/load smol")
    c.expect_exact(">>> ")
    c.sendline("/set think high")
    c.expect_exact('Error: "smol" does not support thinking')
    c.expect_exact(">>> ")
    c.sendline("/bye")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
