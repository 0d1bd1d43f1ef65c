"""Run the typer app and turn every exception into one stderr line and an exit code."""
from __future__ import annotations

import sys
import traceback

import click

from .. import config
from ..errors import OllapyError, describe


def run_app(app) -> int:
    """Invoke ``app`` with sys.argv; return the exit code (0 ok, 1 error, 2 usage, 130 interrupted)."""
    try:
        app(standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        _flush()
        return 130
    except click.UsageError as exc:
        exc.show()
        return 2
    except KeyboardInterrupt:
        _flush()
        return 130
    except BrokenPipeError:
        return 0
    except OllapyError as exc:
        _report(exc)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the one place that catches everything
        _report(exc)
        return 1


def _flush() -> None:
    try:
        sys.stdout.flush()
    except Exception:
        pass


def _report(exc: BaseException) -> None:
    _flush()
    if config.debug():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"Error: {describe(exc)}", file=sys.stderr)
