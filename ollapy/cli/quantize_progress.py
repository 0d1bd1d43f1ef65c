"""The progress bar of ``ollapy create --quantize``: tensors quantized so far, on stderr.

llama.cpp quantizes tensor by tensor and reports ``(done, total)`` (:mod:`ollapy.engine.backend.quantize`). On a
terminal a rich bar shows it; otherwise one line when it starts and one when it ends (no escapes); nothing with
``--quiet``.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def tensor_progress(label: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """Yield ``progress(done, total)`` for a quantization labelled ``label`` (e.g. ``quantizing to q8_0``)."""
    if quiet:
        yield lambda done, total: None
        return
    if not sys.stderr.isatty():
        seen = [0, 0]

        def plain(done: int, total: int) -> None:
            if seen[1] == 0:
                print(f"{label} ({total} tensors)", file=sys.stderr, flush=True)
            seen[:] = [done, total]

        yield plain
        if seen[1]:
            print(f"{label}: {seen[0]}/{seen[1]} tensors done", file=sys.stderr, flush=True)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tensors"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=None)

        def rich_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield rich_progress
