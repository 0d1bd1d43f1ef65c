"""Terminal output: model text to stdout (optionally word-wrapped on a TTY), stats and warnings to stderr.

Nothing here writes ANSI escape codes when the stream is not a terminal.
When the reader of stdout goes away (``ollapy run ... | head -1``) every write
here raises :class:`OutputClosed`; the caller cancels generation and the
process exits quietly with :data:`EXIT_PIPE`.
"""
from __future__ import annotations

import os
import shutil
import sys

EXIT_PIPE = 141
"""Exit status when stdout's reader went away: 128 + SIGPIPE, what a shell reports for ``yes | head -1``
(and for Ollama, whose Go runtime dies of SIGPIPE there). Nothing is printed on stderr."""


class OutputClosed(Exception):
    """stdout's reader went away (EPIPE). Not an OSError on purpose: click would turn that into exit 1."""


def detach_stdout() -> None:
    """Point stdout's file descriptor at /dev/null after EPIPE, so that the interpreter's final flush of the
    text still buffered cannot fail (no "Exception ignored ... BrokenPipeError" line, no exit 120)."""
    try:
        fd = sys.__stdout__.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def write_out(stream, text: str) -> None:
    """Write ``text`` to ``stream`` and flush; raises OutputClosed when the reader has gone away."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise OutputClosed("stdout closed") from None


def is_tty(stream) -> bool:
    """True when ``stream`` is an interactive terminal."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def warn(message: str) -> None:
    """Print a one-line warning to stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    """Print a progress/info line to stderr."""
    print(message, file=sys.stderr, flush=True)


class TextSink:
    """Writes streamed model text to a stream; on a TTY with wrapping on, breaks lines at word boundaries.

    Word wrapping only ever inserts newlines (never escape codes) and only
    when ``wrap`` is true and the stream is a terminal.
    """

    def __init__(self, stream=None, wrap: bool = True) -> None:
        self.stream = stream or sys.stdout
        self.wrap = wrap and is_tty(self.stream)
        self.width = shutil.get_terminal_size((80, 24)).columns if self.wrap else 0
        self.col = 0
        self.word = ""
        self.last = ""

    def write(self, text: str) -> None:
        """Write a chunk of model text."""
        if not text:
            return
        self.last = text[-1]
        if not self.wrap or self.width < 20:
            write_out(self.stream, text)
            return
        out = []
        for ch in text:
            if ch == "\n":
                out.append(self.word + "\n")
                self.word, self.col = "", 0
            elif ch == " ":
                if self.col + len(self.word) >= self.width:
                    out.append("\n")
                    self.col = 0
                out.append(self.word + " ")
                self.col += len(self.word) + 1
                self.word = ""
            else:
                self.word += ch
                if len(self.word) >= self.width:
                    out.append(self.word)
                    self.col, self.word = 0, ""
        write_out(self.stream, "".join(out))

    def finish(self) -> None:
        """Flush the pending word and end with exactly one newline; raises OutputClosed like :meth:`write`."""
        out = ""
        if self.wrap and self.word:
            if self.col + len(self.word) > self.width:
                out += "\n"
            out += self.word
            self.last = self.word[-1]
            self.word = ""
        if self.last != "\n":
            out += "\n"
        self.col, self.last = 0, "\n"
        write_out(self.stream, out)


# Ollama's colours for the reasoning (readline.ColorGrey, ColorBold, ColorDefault); written on a terminal only
GREY, BOLD, RESET = "\x1b[38;5;245m", "\x1b[1m", "\x1b[0m"
THINKING_OPEN, THINKING_CLOSE = "Thinking...\n", "...done thinking.\n\n"


class ReplyPrinter:
    """Prints a streamed reply as ``ollama run`` does: the reasoning first, then the answer.

    The reasoning is introduced by ``Thinking...`` and closed by ``...done thinking.`` and a blank
    line, dimmed on a terminal; when ``stream`` is not a terminal the same marker lines are
    written plainly, with no escape codes. ``show_thinking=False`` (``--hidethinking``) prints
    the answer only. ``content_sink`` (made on the first answer text) replaces the plain
    :class:`TextSink` for the answer (the REPL's Markdown view). Writes raise OutputClosed
    like :class:`TextSink`.
    """

    def __init__(self, stream=None, *, wrap: bool = True, show_thinking: bool = True, content_sink=None) -> None:
        self.sink = TextSink(stream, wrap=wrap)
        self.stream = self.sink.stream
        self.tty = is_tty(self.stream)
        self.show_thinking = show_thinking
        self._make_content = content_sink
        self._content = None
        self.opened = False  # the reasoning section is being printed
        self.thinking = ""  # all reasoning text so far (printed or not)

    def _mark(self, text: str, dim_after: bool = False) -> None:
        write_out(self.stream, GREY + BOLD + text + RESET + (GREY if dim_after else "") if self.tty else text)
        self.sink.col, self.sink.last = 0, "\n"

    def write(self, thinking: str = "", content: str = "") -> None:
        """Write a piece of reasoning and/or answer text."""
        if thinking:
            self.thinking += thinking
            if self.show_thinking:
                if not self.opened:
                    self._mark(THINKING_OPEN, dim_after=True)
                    self.opened = True
                self.sink.write(thinking)
        if content:
            self._close_thinking(done=True)
            if self._content is None:
                self._content = self._make_content() if self._make_content is not None else self.sink
            self._content.write(content)

    def _close_thinking(self, done: bool) -> None:
        if not self.opened:
            return
        self.opened = False
        self.sink.finish()
        if done:
            self._mark(THINKING_CLOSE)
        elif self.tty:
            write_out(self.stream, RESET)

    def finish(self) -> None:
        """End the reply with one newline (a reasoning section cut short is ended, its colour reset)."""
        self._close_thinking(done=False)
        (self._content or self.sink).finish()

    def end_open_line(self) -> None:
        """Before an error line on stderr: end the reply's last line if anything was printed (as
        :meth:`finish`); print nothing when the reply never started."""
        out = self._content or self.sink
        if self.opened or getattr(out, "last", "x") or getattr(out, "word", ""):
            self.finish()


def _dur(ns: int) -> str:
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.6f}s"
    if ns >= 1_000_000:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e3:.3f}µs"


MIN_RATED_TOKENS = 8
"""Fewest evaluated prompt tokens for which ``--verbose`` prints a prompt eval rate."""


def format_stats(m: dict, *, with_load: bool = True) -> str:
    """Ollama's ``--verbose`` block (durations from ns), plus prompt-cache reuse.

    The prompt eval count says how many of the prompt's tokens were evaluated (new) and how many were reused from
    the prompt cache when any were. The prompt eval rate counts only the tokens evaluated (``prompt_eval_count``
    minus ``prompt_cache_tokens``); under :data:`MIN_RATED_TOKENS` of them it is ``n/a`` with the count, since a
    rate over a handful of tokens measures the per-call overhead, not prefill speed.

    ``with_load=False`` leaves out the ``load duration`` line (a batch prints
    the one load once, not as 0 for every later answer).
    """
    # the rate of the tokens actually evaluated: reused (cached) prompt tokens took no prefill time
    reused = int(m.get("prompt_cache_tokens") or 0)
    evaluated = m["prompt_eval_count"] - reused
    pe_rate = evaluated / (m["prompt_eval_duration"] / 1e9) if m.get("prompt_eval_duration") else 0.0
    if evaluated < MIN_RATED_TOKENS:
        rate_text = f"n/a ({evaluated} new token{'s' if evaluated != 1 else ''}: too few to rate)"
    else:
        rate_text = f"{pe_rate:.2f} tokens/s"
    ev_rate = m["eval_count"] / (m["eval_duration"] / 1e9) if m.get("eval_duration") else 0.0
    lines = [
        f"total duration:       {_dur(m['total_duration'])}",
        *([f"load duration:        {_dur(m['load_duration'])}"] if with_load else []),
        f"prompt eval count:    {m['prompt_eval_count']} token(s)"
        + (f" ({evaluated} new, {reused} from the cache)" if reused else ""),
        f"prompt cache:         {m.get('prompt_cache_tokens', 0)} token(s) reused"
        + (f" ({m['prefix_source']}" + (f", {m['prompt_cache_blocks']} KV blocks" if m.get("prompt_cache_blocks")
                                         else "") + ")" if m.get("prefix_source") not in (None, "", "none") else ""),
        *([f"image encode duration: {_dur(m['image_encode_duration'])}"] if m.get("image_encode_duration") else []),
        f"prompt eval duration: {_dur(m['prompt_eval_duration'])}",
        f"prompt eval rate:     {rate_text}",
        f"eval count:           {m['eval_count']} token(s)",
        f"eval duration:        {_dur(m['eval_duration'])}",
        f"eval rate:            {ev_rate:.2f} tokens/s",
    ]
    if m.get("truncated"):
        lines.append("truncated:            yes (prompt longer than num_ctx)")
    if m.get("shifts"):
        lines.append(f"context shifts:       {m['shifts']}")
    if m.get("draft"):  # speculative decoding: drafted tokens verified, and of them accepted
        n, k = int(m.get("draft_tokens") or 0), int(m.get("draft_accepted") or 0)
        lines.append(f"draft:                {n} proposed, {k} accepted ({k / n if n else 0.0:.0%})")
    return "\n".join(lines)
