"""``ollapy embed``: embedding vectors on stdout, one JSON array per line (JSON Lines).

Each TEXT argument is one input; without TEXT, every line of stdin is one
input, read as it arrives: the lines available at each read are embedded
together (one batch) and their vectors written and flushed before the next
read, so ``ollapy embed`` works inside a pipe and as a co-process. Vectors are
L2-normalised as Ollama's ``/api/embed`` returns them; ``--dimensions N`` keeps
the first N values and normalises again.

Like ``run``, it uses a running ``ollapy serve`` at ``OLLAPY_HOST`` when one
answers (``/api/embed``) and otherwise loads the model in this process
(a model given as a file path always loads here). A bad input (a blank line,
an input over the context with ``--no-truncate``) is one line on stderr and
exit status 1. :func:`print_embedding` is ``ollapy run``'s path for
embedding-only models.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable, Iterator, List, Optional

import typer

from ollapy.cli.output import is_tty, write_out
from ollapy.errors import OllapyError, UsageError

MAX_LINES_PER_BATCH = 256


class InputError(OllapyError):
    """An input the model cannot embed (blank, too long with --no-truncate). Exit 1."""

    status = 400


def stdin_batches(fd: int = 0, max_lines: int = MAX_LINES_PER_BATCH) -> Iterator[list[str]]:
    """Lines of the file descriptor ``fd``, in batches of the complete lines each read returned (at most
    ``max_lines``); a last line without a newline is one too. Blocks only when no complete line is waiting.
    Raises InputError for a blank line (it has nothing to embed)."""
    pending = b""
    number = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if chunk:
            pending += chunk
            *lines, pending = pending.split(b"\n")
        else:
            lines, pending = ([pending] if pending else []), b""
        texts = []
        for raw in lines:
            number += 1
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            if not text.strip():
                raise InputError(f"line {number} of stdin is blank: there is nothing to embed",
                                 hint="remove blank lines, e.g. with grep -v '^$'")
            texts.append(text)
        for i in range(0, len(texts), max_lines):
            yield texts[i:i + max_lines]
        if not chunk:
            return


def _input_errors(fn: Callable[[list[str]], list]) -> Callable[[list[str]], list]:
    """``fn`` with an input the model refuses (an OptionError from the engine or a 400 from a server) turned
    into an InputError: bad data is an error (exit 1), not a usage mistake."""
    def wrapped(batch: list[str]) -> list:
        try:
            return fn(batch)
        except UsageError as exc:  # the engine's OptionError, or a server's 400
            raise InputError(exc.message, exc.hint) from None

    return wrapped


class _Local:
    """The model loaded in this process (no prompt cache: embeddings do not use it)."""

    def __init__(self, name: str, cli_options: dict, pull: bool) -> None:
        from ollapy.cli.embedded import absolute_model_arg
        from ollapy.runner import loader

        ref = loader.resolve(absolute_model_arg(name), pull=pull, allow_paths=True)
        self.model = loader.open_model(ref, loader.base_options(ref, cli_options), cache=False)

    def embed(self, batch: list[str], truncate: bool, dimensions: int | None) -> list:
        return self.model.embed(batch, truncate=truncate, dimensions=dimensions).vectors.tolist()

    def close(self) -> None:
        self.model.close()


class _Remote:
    """A running ``ollapy serve`` (or Ollama) at OLLAPY_HOST."""

    def __init__(self, client, name: str, cli_options: dict, keep_alive) -> None:
        self.client, self.name, self.options, self.keep_alive = client, name, cli_options, keep_alive

    def embed(self, batch: list[str], truncate: bool, dimensions: int | None) -> list:
        return self.client.embed(self.name, batch, truncate=truncate, dimensions=dimensions, options=self.options,
                                 keep_alive=self.keep_alive)["embeddings"]

    def close(self) -> None:
        self.client.close()


def connect(name: str, cli_options: dict, keep_alive=None, pull: bool = True):
    """The embedding side ``embed`` talks to: a server when one answers at OLLAPY_HOST (``run``'s rule), else
    the model loaded here. A model path always loads here. With ``pull``, a model the server lacks is pulled
    through it first, as ``run`` does. Raises ModelNotFound, ModelLoadError..."""
    from ollapy.cli.embedded import absolute_model_arg
    from ollapy.cli.remote import port_open
    from ollapy.runner import loader

    if not loader.is_path_name(absolute_model_arg(name)) and port_open():
        from ollapy.cli.client import Client

        client = Client()
        if client.heartbeat():
            if pull:  # as `run` does: a model the server lacks is pulled through it (`--no-pull`: its 404)
                from ollapy.cli.remote import missing_on, pull_on_server

                try:
                    if missing_on(client, name):
                        pull_on_server(client, name)
                except BaseException:
                    client.close()
                    raise
            return _Remote(client, name, cli_options, keep_alive)
        client.close()
    return _Local(name, cli_options, pull)


def write_vectors(vectors: list) -> None:
    """One JSON array per vector on stdout, flushed (OutputClosed when the reader went away)."""
    write_out(sys.stdout, "".join(json.dumps(v) + "\n" for v in vectors))


def embed(
    model: str = typer.Argument(..., help="Model name (see `ollapy list`) or path to a .gguf file."),
    text: Optional[List[str]] = typer.Argument(None, help="Texts to embed, one input each; without them, "
                                                         "each line of stdin is one input."),
    dimensions: Optional[int] = typer.Option(None, "--dimensions", help="Keep the first N values of each vector "
                                                                        "(normalised again)."),
    truncate: bool = typer.Option(True, "--truncate/--no-truncate", help="Cut inputs longer than the context "
                                                                         "(--no-truncate: fail instead)."),
    option: Optional[List[str]] = typer.Option(None, "--option", "-o",
                                               help="Model option key=value (repeatable), e.g. -o num_ctx=512."),
    keepalive: Optional[str] = typer.Option(None, "--keepalive", help="How long a server keeps the model loaded."),
    no_pull: bool = typer.Option(False, "--no-pull", help="Fail instead of pulling a missing model."),
) -> None:
    """Print embedding vectors as JSON Lines: one array per TEXT, or per line of stdin."""
    from ollapy.options import parse_options

    opts = parse_options(option or [])
    if dimensions is not None and dimensions < 1:
        raise UsageError("--dimensions must be at least 1")
    if not text and is_tty(sys.stdin):
        raise UsageError("no text to embed", hint="pass TEXT arguments or pipe lines: printf 'a\\nb\\n' | ollapy embed MODEL")
    batches: Iterator[list[str]] = iter([list(text)]) if text else stdin_batches()
    if text and any(not t.strip() for t in text):
        raise InputError("an empty TEXT argument has nothing to embed")
    side = connect(model, opts, keepalive, pull=not no_pull)
    try:
        run_batch = _input_errors(lambda b: side.embed(b, truncate, dimensions))
        for batch in batches:
            write_vectors(run_batch(batch))
    finally:
        side.close()


def print_embedding(conversation, text: str) -> bool:
    """``ollapy run`` with an embedding-only model: print the vector of ``text`` (as Ollama's ``run`` does) and
    return True; False for a model that generates text. In-process: the model's own check; through a server:
    its ``/api/show`` capabilities."""
    runner = getattr(conversation, "runner", None)
    model = getattr(runner, "model", None)
    if model is not None:
        if not getattr(model, "embedding_only", False):
            return False
        write_vectors(_input_errors(lambda b: model.embed(b).vectors.tolist())([text]))
        return True
    client, name = getattr(runner, "client", None), getattr(runner, "name", None)
    if client is None or name is None:
        return False
    try:
        caps = client.show(name).get("capabilities") or []
    except OllapyError:
        return False
    if "embedding" not in caps or "completion" in caps:
        return False
    write_vectors(_input_errors(lambda b: client.embed(name, b)["embeddings"])([text]))
    return True


def register(app: typer.Typer) -> None:
    """Add ``embed`` to the app."""
    app.command("embed")(embed)
