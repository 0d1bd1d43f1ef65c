"""Feeding a streaming parser (thinking split, tool calls) in pieces, shared by their tests.

A streaming parser here has ``feed(piece) -> tuple`` and ``finish() -> tuple``;
each tuple holds deltas of the same kinds in the same order (text pieces, or
lists of completed items), so the deltas of all calls join into the result
the whole-text parser gives.
"""
from __future__ import annotations

from typing import Any, Callable


def _join(deltas: list[Any]) -> Any:
    """Join one column of deltas: strings into one string, sequences into one list."""
    if all(isinstance(d, str) for d in deltas):
        return "".join(deltas)
    return [item for d in deltas for item in d]


def feed_in_pieces(parser: Any, text: str, cuts: list[int]) -> tuple:
    """Feed ``text`` cut at ``cuts`` (positions 0..len(text), any order, repeats allowed), then finish.

    Returns the joined deltas, one per position of the parser's tuples, e.g.
    ``(thinking, content)`` or ``(content, calls)``.
    """
    results, start = [], 0
    for cut in sorted(cuts) + [len(text)]:
        results.append(parser.feed(text[start:cut]))
        start = cut
    results.append(parser.finish())
    return tuple(_join(list(column)) for column in zip(*results))


def assert_every_split_matches(make_parser: Callable[[], Any], text: str, expected: tuple) -> None:
    """Assert that ``text`` cut once at every point, and fed one character at a time, gives ``expected``.

    ``make_parser`` returns a fresh parser for each feeding.
    """
    for i in range(len(text) + 1):
        assert feed_in_pieces(make_parser(), text, [i]) == expected, f"cut at {i}"
    assert feed_in_pieces(make_parser(), text, list(range(len(text)))) == expected, "char by char"
