"""Thinking split (ollapy.chat.thinking): whole text, streaming at every split point, think values."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming_helpers import assert_every_split_matches, feed_in_pieces

from ollapy.chat.thinking import (
    ThinkingParser,
    parse_think,
    prompt_opens_thinking,
    split_thinking,
    supports_thinking,
    think_enabled,
)
from ollapy.errors import OptionError


def _stream(text: str, cuts: list[int], opened: bool = False) -> tuple[str, str]:
    return feed_in_pieces(ThinkingParser(opened=opened), text, cuts)


def _whole(text: str, opened: bool = False) -> tuple[str, str]:
    r = split_thinking(text, opened=opened)
    return r.thinking, r.content


def test_qwen3_style_section_is_split_and_blanks_around_tags_dropped():
    assert _whole("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!") == (
        "The user greets me.\nI greet back.",
        "Hello!",
    )


def test_empty_section_when_thinking_is_off():
    assert _whole("<think>\n\n</think>\n\nHi there") == ("", "Hi there")


def test_deepseek_r1_style_output_starts_inside_thinking():
    assert _whole("Okay, 2+2 is 4.\n</think>\n\nThe answer is 4.", opened=True) == ("Okay, 2+2 is 4.", "The answer is 4.")
    # a model that repeats the opening tag anyway
    assert _whole("<think>\nhmm</think>4", opened=True) == ("hmm", "4")


def test_no_think_output_is_all_content_unchanged():
    text = "  Plain answer with a </think> in it and <think> too"
    assert _whole(text) == ("", text)
    assert _whole("") == ("", "")


def test_opening_tag_counts_only_at_the_start():
    assert _whole("Answer <think>not reasoning</think>") == ("", "Answer <think>not reasoning</think>")


def test_unclosed_section_is_all_thinking():
    assert _whole("<think>still going ") == ("still going", "")
    assert _whole("half a tag </thi", opened=True) == ("half a tag </thi", "")


def test_a_partial_opening_tag_at_the_end_is_content():
    assert _whole("<thi") == ("", "<thi")


def test_streaming_holds_back_partial_tags_and_trailing_blanks():
    p = ThinkingParser()
    assert p.feed("<th") == ("", "")
    assert p.feed("ink>\nstep one ") == ("step one", "")
    assert p.feed("and two\n</") == (" and two", "")
    assert p.feed("think>\n") == ("", "")
    assert p.feed("\nDone.") == ("", "Done.")
    assert p.finish() == ("", "")


SAMPLES = [
    ("<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!", False),
    ("<think>\n\n</think>\n\nHi", False),
    ("  <think>a < b </ think> </thin</think>  c </think> d", False),
    ("Okay.\n</think>\n\nAnswer", True),
    ("<think>x</think>", True),
    ("plain text </think> here", False),
    ("<thi", False),
    ("\n\n", True),
]


@pytest.mark.parametrize(("text", "opened"), SAMPLES)
def test_every_split_point_and_char_by_char_match_the_whole_text(text, opened):
    assert_every_split_matches(lambda: ThinkingParser(opened=opened), text, _whole(text, opened))


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", " ", "\n", "abc", "é"]), max_size=10),
    opened=st.booleans(),
    data=st.data(),
)
def test_any_split_of_any_text_matches_the_whole_text(parts, opened, data):
    text = "".join(parts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    thinking, content = _whole(text, opened)
    assert _stream(text, cuts, opened) == (thinking, content)
    # nothing but tags and blanks is dropped
    squeeze = lambda s: "".join(s.split())  # noqa: E731
    kept = squeeze(thinking + content)
    assert len(kept) >= len(squeeze(text)) - 2 * len("</think>")


def test_supports_thinking_from_template_text():
    assert supports_thinking("{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>")
    assert supports_thinking("{{ '<|Assistant|><think>\\n' }}")
    assert supports_thinking("{% if message.reasoning_content %}")
    assert not supports_thinking("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}")
    assert not supports_thinking(None)


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|User|>hi<|Assistant|><think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True), (False, False), (None, None), ("high", "high"),
        ("Medium", "medium"), (" low ", "low"), ("true", True), ("FALSE", False),
    ],
)
def test_parse_think_accepts_ollama_values(value, expected):
    assert parse_think(value) == expected


@pytest.mark.parametrize("value", ["max", "", 1, 0, 0.5, ["high"], {"level": "low"}])
def test_parse_think_rejects_other_values_with_one_line(value):
    with pytest.raises(OptionError) as err:
        parse_think(value)
    message = str(err.value)
    assert "\n" not in message and "high" in message and "think" in message


def test_think_enabled():
    assert think_enabled(True) and think_enabled("low")
    assert not think_enabled(False) and not think_enabled(None)
