"""Entry point of the ``ollapy`` command: builds the typer app from the command modules.

Each command module exposes ``register(app)``. Errors become one line on
stderr plus an exit code (0 ok, 1 error, 2 usage, 130 interrupted); set
``OLLAPY_DEBUG=1`` for the traceback.
"""
from __future__ import annotations

import sys

import typer

from ollapy import __version__

app = typer.Typer(
    name="ollapy",
    help="Run local LLMs (GGUF, llama.cpp) from the command line, Ollama-style.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ollapy version {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-v", help="Show the version and exit.", callback=_version_callback,
                                 is_eager=True),
) -> None:
    """Run local LLMs (GGUF, llama.cpp) from the command line, Ollama-style."""
    from ollapy import config

    config.check_settings()  # a bad OLLAPY_* value: one line and exit 2 before any command runs


def _register_all() -> None:
    import importlib

    for name in ("run_cmd", "embed_cmd", "info_cmd", "models_cmd", "cache_cmd", "serve_cmd", "rpc_cmd", "launch_cmd"):
        try:
            mod = importlib.import_module(f"ollapy.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ollapy.cli.{name}":
                continue
            raise
        mod.register(app)
    from ollapy.cli.usage import apply_plain_usage

    apply_plain_usage(app)  # `pull [OPTIONS] NAME`, not typer's `{name}`


_register_all()


def main() -> None:
    """Console-script entry point: run the app and map errors to one line + exit code."""
    from ollapy import config
    from ollapy.cli.errors_out import run_app
    from ollapy.fsutil import raise_open_file_limit

    raise_open_file_limit()  # a server's connections, cache files and runners: not a 1,024-descriptor budget

    if config.debug():
        import logging

        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    sys.argv[1:] = think_flag_args(sys.argv[1:])
    code = run_app(app)
    sys.exit(flush_stdout(finish_process(code)))


def think_flag_args(args: list[str]) -> list[str]:
    """``run``'s ``--think`` takes an optional value, as Ollama's does: a bare ``--think`` becomes
    ``--think=true`` (so the next word stays a prompt word); ``--think=VALUE`` is left as it is. Words after
    ``--`` are never touched."""
    if not args or args[0] != "run":
        return args
    out = list(args)
    for i, a in enumerate(out):
        if a == "--":
            break
        if a == "--think":
            out[i] = "--think=true"
    return out


def flush_stdout(code: int) -> int:
    """Flush stdout before the interpreter does; when its reader has gone away, exit quietly with 141.

    Python's own final flush would print "Exception ignored ... BrokenPipeError" and exit 120.
    """
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        from ollapy.cli.output import EXIT_PIPE, detach_stdout

        detach_stdout()
        return EXIT_PIPE if code == 0 else code
    except ValueError:  # stdout already closed
        pass
    return code


def finish_process(code: int) -> int:
    """The process-wide shutdown step: drain prompt-cache writers nobody closed (normally none); returns the exit code.

    Commands close what they open; this catches the rest, explicitly, before
    the interpreter exits (no ``atexit`` order, no garbage collection).
    Ctrl-C here drops the unsaved states (one line says how many) and exits 130.
    """
    if "ollapy.cache.writer" not in sys.modules:  # nothing was ever written: keep `--help` and `list` fast
        return code
    from ollapy.runner.loader import close_all

    n = 0
    try:
        n = close_all()
    except KeyboardInterrupt:
        from ollapy.cache.writer import drain_all

        n = drain_all(0).unsaved
        code = 130
    if n:
        print(f"warning: prompt cache: {n} state{'s' if n != 1 else ''} not saved", file=sys.stderr)
    return code


if __name__ == "__main__":
    main()
