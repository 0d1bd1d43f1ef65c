"""``parallel_tool_calls: false`` (OpenAI): ReplyParser keeps only the first parsed call, whole and streamed."""
from __future__ import annotations

from ollapy.chat.reply import ReplyParser

TWO = ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
       '<tool_call>\n{"name": "g", "arguments": {"b": 2}}\n</tool_call>')


def _parser(max_calls=None):
    return ReplyParser(family="hermes", tool_names=["f", "g"], ids=True, seed=1, max_calls=max_calls)


def test_all_calls_by_default_and_only_the_first_when_limited():
    assert [c.name for c in _parser().parse(TWO).calls] == ["f", "g"]
    one = _parser(1).parse(TWO)
    assert [(c.name, c.arguments) for c in one.calls] == [("f", {"a": 1})]
    assert "g" not in one.content and "tool_call" not in one.content  # the dropped call is not turned into text


def test_limit_holds_for_every_cut_of_a_stream():
    for cut in range(len(TWO) + 1):
        p = _parser(1)
        d = p.feed(TWO[:cut]) + p.feed(TWO[cut:]) + p.finish()
        assert [c.name for c in d.calls] == ["f"] and p.calls == 1, cut
