"""Streaming text helpers: incremental UTF-8 detokenizer and stop-string matcher.

Both are pure Python and know nothing of llama.cpp: they take bytes/strings.
"""
from __future__ import annotations

import codecs


class Detokenizer:
    """Turns a stream of token byte pieces into text without ever splitting a UTF-8 character.

    Bytes of an incomplete character are held until the rest arrives
    (``codecs``' incremental decoder); invalid bytes become U+FFFD. An answer that ends inside a character
    (``num_predict`` reached between its tokens) ends before it: :meth:`flush` drops the held bytes.
    """

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that is now complete (may be '')."""
        return self._dec.decode(piece)

    def flush(self) -> str:
        """End the text: ``""``. The held bytes can only be the start of a character the answer never finished
        (invalid bytes were replaced as they came), so they are dropped rather than shown as U+FFFD."""
        self._dec.reset()
        return ""


class StopMatcher:
    """Finds stop strings in streamed text, holding back text that may still become a stop string.

    ``feed(text)`` returns ``(emit, stopped)``: ``emit`` is safe to show; once
    ``stopped`` is True the text before the stop string has been emitted and the
    stop string itself is dropped. ``flush()`` releases held text at the end.
    """

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None  # the stop string found, once ``feed`` reported one

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        first = -1
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first, self.matched = i, s
        if first != -1:
            self._held = ""
            return buf[:first], True
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Release text held as a possible stop-string prefix."""
        out, self._held = self._held, ""
        return out
