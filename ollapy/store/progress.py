"""Pull progress on stderr: rich bars on a terminal, one plain line per stage otherwise, nothing when quiet.

Use :func:`make_progress`; every reporter has ``stage(text)`` (one status line),
``start(label, total) -> task``, ``advance(task, nbytes)`` and ``finish(task)``.
Plain output never contains ANSI escapes.
"""
from __future__ import annotations

import sys
import time
from typing import Any


def human_size(n: float) -> str:
    """Bytes → text in decimal units like Ollama (``98 MB``, ``1.2 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 10 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class QuietProgress:
    """Reports nothing."""

    def stage(self, text: str) -> None:
        """Ignore a stage line."""

    def start(self, label: str, total: int | None, done: int = 0) -> Any:
        """Return a dummy task."""
        return None

    def advance(self, task: Any, nbytes: int) -> None:
        """Ignore progress."""

    def finish(self, task: Any) -> None:
        """Ignore completion."""

    def close(self) -> None:
        """Nothing to close."""


class PlainProgress(QuietProgress):
    """One line per stage on a stream (stderr by default): start and end of each blob, no escapes."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self._tasks: dict[int, list] = {}

    def stage(self, text: str) -> None:
        """Print one line."""
        print(text, file=self.stream, flush=True)

    def start(self, label: str, total: int | None, done: int = 0) -> Any:
        """Print ``pulling LABEL (SIZE)`` and return a task id."""
        key = len(self._tasks)
        self._tasks[key] = [label, total, done, done, time.monotonic()]
        extra = f", resuming at {human_size(done)}" if done else ""
        self.stage(f"pulling {label} ({human_size(total) if total else 'unknown size'}{extra})")
        return key

    def advance(self, task: Any, nbytes: int) -> None:
        """Count bytes."""
        if task in self._tasks:
            self._tasks[task][2] += nbytes

    def finish(self, task: Any) -> None:
        """Print ``done LABEL SIZE in Ts (R MB/s)``."""
        if task not in self._tasks:
            return
        label, _total, done, start_done, t0 = self._tasks.pop(task)
        dt = max(time.monotonic() - t0, 1e-6)
        self.stage(f"done {label} {human_size(done)} in {dt:.1f}s ({human_size((done - start_done) / dt)}/s)")


# Cells kept for the size, speed and ETA columns at least ("19.9/98.4 MB", "40.2 MB/s", "0:00:02"; wider text
# gets its real width), the 4 one-cell gaps between the 5 columns, and the bar and label limits.
_TYPICAL_CELLS = (12, 9, 7)
_GAPS = 4
_BAR_MIN, _BAR_MAX, _LABEL_MIN = 8, 40, 8


class RichProgress(QuietProgress):
    """Rich progress bars (label, bar, size, speed, ETA) on a terminal stderr.

    Every bar stays on one line at any terminal width (laid out again at each
    refresh, so a resize is followed): size, speed and ETA get their room, the
    label is cut with '…' when it does not fit, and the bar takes what is left
    (8-40 cells). ``console`` is for tests.
    """

    def __init__(self, console=None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.table import Column

        owner = self

        class LabelColumn(TextColumn):
            # rich asks for the columns once per refresh, before it renders the rows: lay out here
            def get_table_column(self) -> Column:
                label_max = owner._layout()
                return Column(no_wrap=True, overflow="ellipsis", max_width=label_max)

        class FlexBarColumn(BarColumn):
            def render(self, task):
                self.bar_width = owner._bar_cells
                return super().render(task)

        def cell() -> Column:
            return Column(no_wrap=True, overflow="ellipsis")  # on a very narrow terminal: cut, never a second line

        self.console = console or Console(stderr=True)
        self._bar_cells = _BAR_MAX
        self._fixed = (DownloadColumn(table_column=cell()), TransferSpeedColumn(table_column=cell()),
                       TimeRemainingColumn(table_column=cell()))
        self.bar = Progress(LabelColumn("{task.description}", markup=False), FlexBarColumn(finished_style="green"), *self._fixed,
                            console=self.console, transient=False)
        self.bar.start()

    def _layout(self) -> int:
        """Set the bar width for this refresh and return the label's maximum width."""
        from rich.cells import cell_len

        bar = getattr(self, "bar", None)  # rich renders once inside Progress()
        tasks = [t for t in bar.tasks if t.visible] if bar is not None else []
        fixed = sum(max([typical] + [self.console.measure(col(t)).maximum for t in tasks])
                    for col, typical in zip(self._fixed, _TYPICAL_CELLS))
        room = self.console.width - 1 - fixed - _GAPS  # one column spare: some terminals wrap on the last one
        label_max = max(_LABEL_MIN, room - _BAR_MIN)
        label = max((cell_len(t.description) for t in tasks), default=0)
        self._bar_cells = max(1, min(_BAR_MAX, room - min(label, label_max)))
        return label_max

    def stage(self, text: str) -> None:
        """Print a line above the bars."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)  # the terminal wraps, not rich

    def start(self, label: str, total: int | None, done: int = 0) -> Any:
        """Add a bar."""
        return self.bar.add_task(f"pulling {label}", total=total, completed=done)

    def advance(self, task: Any, nbytes: int) -> None:
        """Move a bar."""
        self.bar.advance(task, nbytes)

    def finish(self, task: Any) -> None:
        """Fill a bar."""
        t = self.bar.tasks[[x.id for x in self.bar.tasks].index(task)]
        self.bar.update(task, completed=t.total or t.completed, refresh=True)  # drawn full before any later line

    def close(self) -> None:
        """Stop the live display."""
        self.bar.stop()


def make_progress(quiet: bool = False) -> QuietProgress:
    """Pick the reporter: quiet → nothing; stderr a TTY → rich; else plain lines."""
    if quiet:
        return QuietProgress()
    if sys.stderr.isatty():
        return RichProgress()
    return PlainProgress()
