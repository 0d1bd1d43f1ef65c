"""Run the typer app and turn every exception into one stderr line and an exit code."""
from __future__ import annotations

import sys
import traceback

import typer

from ollapy import config
from ollapy.errors import OllapyError, describe

try:  # typer >= 0.20 vendors its own click
    from typer._click.exceptions import ClickException as _ClickException
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer on real click
    from click.exceptions import ClickException as _ClickException
    from click.exceptions import UsageError as _UsageError

# real click's Exit/Abort too, when something already imported click (typer's own vendored copy is used otherwise)
_click = sys.modules.get("click")
_EXIT = tuple({typer.Exit, *(c for c in (getattr(getattr(_click, "exceptions", None), "Exit", None),) if c)})
_ABORT = tuple({typer.Abort, *(c for c in (getattr(getattr(_click, "exceptions", None), "Abort", None),) if c)})


def run_app(app) -> int:
    """Invoke ``app`` with sys.argv; return the exit code (0 ok, 1 error, 2 usage, 130 interrupted, 141 stdout closed).

    stdout's reader going away (``ollapy ... | head -1``) is not an error: nothing is printed and the
    exit status is :data:`~ollapy.cli.output.EXIT_PIPE`, as a shell reports for ``yes | head -1``.
    """
    from ollapy.cli.output import EXIT_PIPE, OutputClosed, detach_stdout

    try:
        rv = app(standalone_mode=False)
        # typer returns the exit code of typer.Exit (and 130 for Ctrl-C) in non-standalone mode
        if isinstance(rv, int) and not isinstance(rv, bool):
            if rv == 130:
                _flush()
            return rv
        return 0
    except _EXIT as exc:
        return getattr(exc, "exit_code", 0)
    except _ABORT:
        _flush()
        return 130
    except _UsageError as exc:
        exc.show()
        return 2
    except _ClickException as exc:
        exc.show()
        return 1
    except KeyboardInterrupt:
        _flush()
        return 130
    except (OutputClosed, BrokenPipeError):
        detach_stdout()
        return EXIT_PIPE
    except SystemExit:
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":  # click's own EPIPE handling ends in sys.exit(1)
            detach_stdout()
            return EXIT_PIPE
        raise
    except OllapyError as exc:
        _report(exc)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the one place that catches everything
        _report(exc)
        return 1


def _flush() -> None:
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - best effort: stdout may be closed or broken while reporting an error
        pass


def _report(exc: BaseException) -> None:
    _flush()
    if config.debug():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"Error: {describe(exc)}", file=sys.stderr)
