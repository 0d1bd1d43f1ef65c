"""The ``ollapy`` command line (typer). Must not import llama_cpp at import time (fast start).

- :mod:`.main`: the typer app, built from the command modules, with every usage line as click writes it
  (:mod:`.usage`: ``pull [OPTIONS] NAME``); :mod:`.errors_out` turns every exception into one stderr line and an
  exit code (0 ok, 1 error, 2 usage, 130 interrupted).
- Commands: :mod:`.run_cmd` (``run``: one-shot, piped, ``--each-line`` via :mod:`.batch`, the REPL in
  :mod:`.repl`; images from ``--image`` and prompt paths in :mod:`.images`), :mod:`.models_cmd` (``pull``,
  ``list``, ``show``, ``rm``, ``cp``, ``create``),
  :mod:`.serve_cmd` (``serve``, ``ps``, ``stop``), :mod:`.cache_cmd`, :mod:`.embed_cmd`, :mod:`.info_cmd`,
  :mod:`.launch_cmd` (coding agents; the newer ones and their configuration files in :mod:`.launch_agents`),
  :mod:`.rpc_cmd`; :mod:`.quantize_progress` (``create --quantize``'s bar).
- What ``run`` talks to: :mod:`.session` picks :mod:`.remote` (a running ``ollapy serve``, through the httpx
  client in :mod:`.client`) or :mod:`.embedded` (a model loaded in this process).
- :mod:`.output`: model text to stdout, stats and warnings to stderr, no ANSI codes off a TTY.
"""
from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point: imports the app, then runs :func:`ollapy.cli.main.main`.

    The import is inside the function so that a Ctrl-C during start-up
    (while typer and rich import) exits 130 without a traceback too.
    """
    try:
        from ollapy.cli.main import main as run_main
    except KeyboardInterrupt:
        sys.exit(130)
    run_main()
