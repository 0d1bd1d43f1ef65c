"""``ollapy run``: one-shot answers, piped stdin, batch (``--each-line``) and the interactive chat REPL.

Piped stdin is read whole and put before the prompt arguments (Ollama's
rule). Model text goes to stdout, everything else to stderr. Ctrl-C stops
generation at once, keeps what was printed, and exits 130. When stdout's
reader goes away (``| head -1``) generation is cancelled, the model closed,
and the process exits 141 without a word on stderr.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from ollapy.cli.output import OutputClosed, ReplyPrinter, format_stats, info, is_tty, warn
from ollapy.errors import Cancelled, OllapyError, OptionError, UsageError
from ollapy.surrogates import replace_surrogates


def read_stdin() -> str | None:
    """Read all of piped stdin as text (invalid UTF-8 replaced, with a warning); None when stdin is a TTY."""
    if is_tty(sys.stdin):
        return None
    try:
        data = sys.stdin.buffer.read()
    except (OSError, ValueError):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warn("stdin is not valid UTF-8; invalid bytes were replaced")
        return data.decode("utf-8", errors="replace")


def build_prompt(stdin_text: str | None, args: list[str]) -> str | None:
    """Combine piped text and prompt words: stdin first, then the arguments (None when both are empty)."""
    words = " ".join(args).strip()
    clean = replace_surrogates(words)  # bytes the locale could not decode arrive as lone surrogates (PEP 383)
    if clean is not words:
        warn("the prompt arguments are not valid UTF-8; invalid bytes were replaced")
        words = clean
    parts = [p for p in ((stdin_text or "").strip("\n"), words) if p]
    if not parts:
        return None
    return "\n\n".join(parts)


def run(
    model: str = typer.Argument(..., metavar="MODEL", help="Model name (see `ollapy list`) or path to a .gguf file."),
    prompt: Optional[List[str]] = typer.Argument(None, metavar="PROMPT...",
                                                 help="Prompt; piped stdin is put before it."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt for this run."),
    format: Optional[str] = typer.Option(None, "--format", help="Response format: json, or a path to a JSON schema file."),
    verbose: bool = typer.Option(False, "--verbose", help="Print timings and token counts to stderr."),
    nowordwrap: bool = typer.Option(False, "--nowordwrap", help="Do not wrap words on a terminal."),
    keepalive: Optional[str] = typer.Option(None, "--keepalive", help="How long a server keeps the model loaded (e.g. 5m)."),
    option: Optional[List[str]] = typer.Option(None, "--option", "-o",
                                               help="Model option key=value (repeatable), e.g. -o temperature=0."),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="Parallel slots (num_parallel)."),
    each_line: bool = typer.Option(False, "--each-line",
                                   help="Treat every stdin line as its own prompt; one output line per input line, "
                                        "in order (newlines in an answer written as \\n, backslashes as \\\\)."),
    as_json: bool = typer.Option(False, "--json", help="With --each-line: one JSON object per input line, with stats."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use the prompt cache for this run."),
    session: Optional[str] = typer.Option(None, "--session",
                                          help="Named conversation to continue and save (messages, system prompt, "
                                               "options; -o wins over saved options)."),
    no_pull: bool = typer.Option(False, "--no-pull", help="Fail instead of pulling a missing model."),
    markdown: bool = typer.Option(False, "--markdown", help="Render replies as Markdown in the interactive chat."),
    think: Optional[str] = typer.Option(None, "--think", metavar="[=VALUE]",
                                        help="Reasoning of a thinking model: --think (on, the default for such "
                                             "models), --think=false, --think=high|medium|low; refused by other "
                                             "models."),
    hidethinking: bool = typer.Option(False, "--hidethinking", help="Let a thinking model reason, but print "
                                                                    "only its answer."),
    local: bool = typer.Option(False, "--local", help="Load the model in this process even when a server "
                                                      "answers at OLLAPY_HOST."),
    image: Optional[List[Path]] = typer.Option(None, "--image", help="An image for a vision model (repeatable); "
                                                                      "image paths in the prompt are found too."),
) -> None:
    """Run a model: answer PROMPT, piped input, each line of input, or chat interactively."""
    from ollapy.chat.thinking import parse_think
    from ollapy.cli.session import RunSettings, load_model_for_run
    from ollapy.options import parse_options

    if as_json and not each_line:
        raise UsageError("--json needs --each-line", hint="add --each-line: ollapy run MODEL --each-line --json < prompts.txt")
    from ollapy.cli.embedded import absolute_draft_option

    opts = absolute_draft_option(parse_options(option or []))
    if parallel is not None:
        if parallel < 1:
            raise UsageError("--parallel must be at least 1")
        opts["num_parallel"] = parallel
    schema = _load_format(format)
    stdin_text = read_stdin()
    settings = RunSettings(system=system, fmt=schema, verbose=verbose, wrap=not nowordwrap, cache=not no_cache,
                           session=session, markdown=markdown, keepalive=keepalive, think=parse_think(think),
                           hidethinking=hidethinking, local=local, parallel=parallel)
    if each_line:
        if stdin_text is None:
            raise UsageError("--each-line reads prompts from stdin",
                             hint="pipe a file: ollapy run MODEL --each-line < prompts.txt")
        from ollapy.cli.batch import run_each_line, split_lines

        lines = split_lines(stdin_text)
        suffix = " ".join(prompt or []).strip()
        n_prompts = sum(1 for ln in lines if ln.strip())
        if not n_prompts:  # blank lines only: one empty answer each, no model needed
            run_each_line(None, lines, suffix, settings, as_json)
            return
        if "num_parallel" not in opts:
            opts["num_parallel"] = max(1, min(4, n_prompts))
        with load_model_for_run(model, opts, settings, pull=not no_pull) as loaded:
            run_each_line(loaded, lines, suffix, settings, as_json)
        return
    text = build_prompt(stdin_text, prompt or [])
    images = _prompt_images(text, image or [])
    if images is not None:
        text, files = images
        images = [read_image(p) for p in files]
    interactive = text is None and not images and is_tty(sys.stdin) and is_tty(sys.stdout)
    if text is None and not interactive and session is None:
        raise UsageError("no prompt given", hint='pass a prompt, pipe text in, or run in a terminal to chat')
    with load_model_for_run(model, opts, settings, pull=not no_pull) as loaded:
        if interactive:
            from ollapy.cli.repl import run_repl

            run_repl(loaded, settings)
        else:
            from ollapy.cli.embed_cmd import print_embedding

            if images:
                answer_once(loaded, text or "", settings, images)
            elif text is None or not print_embedding(loaded, text):  # an embedding-only model prints its vector
                answer_once(loaded, text, settings)


def _prompt_images(text: str | None, given: list[Path]) -> tuple[str | None, list[Path]] | None:
    """``(text without image paths, image files)``: the ``--image`` files, then the paths found in the prompt
    (:func:`ollapy.cli.images.extract_image_paths`, each said on stderr); None when there are none."""
    from ollapy.cli.images import extract_image_paths

    found: list[Path] = []
    if text:
        text, found = extract_image_paths(text)
        for p in found:
            info(f"Added image '{p}'")
    files = list(given) + found
    return (text, files) if files else None


def read_image(path: Path) -> str:
    """A file as a base64 image (ImageError when unreadable)."""
    from ollapy.cli.images import read_image as read

    return read(path)


def _load_format(fmt: str | None):
    if fmt is None:
        return None
    if fmt == "json":
        return "json"
    p = Path(fmt)
    if not p.is_file():
        raise OptionError(f"--format {fmt!r} is neither 'json' nor a JSON schema file")
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise OptionError(f"{fmt}: not a valid JSON schema file ({exc})") from None


def answer_once(loaded, text: str | None, settings, images: list[str] | None = None) -> None:
    """Stream one answer to stdout (a thinking model's reasoning first, see :class:`ReplyPrinter`); Ctrl-C
    cancels, keeps the printed text and exits 130. ``images``: base64 images sent with ``text``."""
    sink = ReplyPrinter(sys.stdout, wrap=settings.wrap, show_thinking=not settings.hidethinking)
    stream = loaded.ask(text, settings, images) if images else loaded.ask(text, settings)
    final = None
    try:
        for chunk in stream:
            sink.write(getattr(chunk, "thinking", ""), chunk.text)
            if chunk.done:
                final = chunk
    except KeyboardInterrupt:
        stream.cancel()
        sink.finish()
        raise
    except OutputClosed:  # `| head -1` is done reading: stop generating now (the caller's `with` closes the model)
        stream.cancel()
        raise
    except Cancelled:
        sink.finish()
        raise KeyboardInterrupt from None
    except OllapyError:  # e.g. a lost RPC server mid-answer: the partial answer keeps its line, then one error line
        sink.end_open_line()
        raise
    sink.finish()
    loaded.after_answer(final, settings)
    if final is not None and final.metrics is not None:
        m = final.metrics.as_dict() if hasattr(final.metrics, "as_dict") else dict(final.metrics)
        if m.get("truncated"):
            warn(f"the prompt did not fit num_ctx={loaded.num_ctx} tokens and was truncated to "
                 f"{m.get('prompt_eval_count')} tokens (raise it with -o num_ctx=N to keep more)")
        if settings.verbose:
            template = _template_source(loaded)
            info(format_stats(m) + (f"\nchat template:        {template}" if template else ""))


def _template_source(loaded) -> str | None:
    try:
        return loaded.runner.info().get("template")
    except Exception:  # noqa: BLE001 - a remote server may not say
        return None


def register(app: typer.Typer) -> None:
    """Add ``run`` to the app (its usage line ``MODEL [PROMPT...]``, as Ollama's: :mod:`ollapy.cli.usage`, which
    :mod:`ollapy.cli.main` applies to every command)."""
    app.command("run")(run)
