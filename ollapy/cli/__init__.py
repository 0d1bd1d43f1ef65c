"""The typer command-line app. Must not import llama_cpp at import time (fast start)."""
from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point: imports the app, then runs :func:`ollapy.cli.main.main`.

    The import is inside the function so that a Ctrl-C during the first
    0.1 s (typer and rich importing) exits 130 without a traceback too.
    """
    try:
        from .main import main as run_main
    except KeyboardInterrupt:
        sys.exit(130)
    run_main()
