"""The Hermes / Qwen2.5 family's tool calls as the models really write them (ollapy.chat.hermes), the
cut-short test of streamed JSON (ollapy.chat.calljson.json_value), and those answers coming back into a history
as written (ollapy.chat.answer_memory). Fast: no model is loaded.

``RECORDED`` holds answers of Qwen2.5-Coder-0.5B-Instruct Q4_K_M (one of the 1.5B; the real template, greedy,
tools on), recorded once through ``/api/chat`` of a model made with ``PARAMETER tool_parser mistral`` (whose
parser leaves this text as it is). The models write their calls as fenced ``json`` blocks, not in Qwen's
``<tool_call>`` tags; after a history of calls the 0.5B wrote one bare object closed by a fence it never opened.
Asked for code without a call, it "called" a function that is not among the tools: a look-alike, which stays text.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming_helpers import assert_every_split_matches, feed_in_pieces

from ollapy.chat.calljson import json_value
from ollapy.chat.toolcalls import ToolCall, ToolCallParser, parse_tool_calls

NAMES = ["get_weather", "get_time", "Write", "Bash"]
PARIS = ToolCall("get_weather", {"city": "Paris"})

# (question, tools offered) -> the model's text
RECORDED = {
    # "What is the weather in Paris? Use the tool." (get_weather); the same answer to "What is the weather in
    # Paris and in Rome? Call the tool once for each city." with 4 spaces of indent
    "weather": '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```',
    # "create hello.py that prints the sum of 2 and 3, run it, and tell me the output" (Write, Bash)
    "write": ('```json\n{\n  "name": "Write",\n  "arguments": {\n    "file_path": "/path/to/output.txt",\n'
              '    "content": "Hello, World!"\n  }\n}\n```'),
    # a history (Paris asked, called, answered "18 degrees, sunny"), then "And in Rome? Use the tool."
    "bare": '{"name": "get_weather", "arguments": {"city": "Rome"}}\n```',
    # the same history, then "Now get the weather in Rome and in Berlin. Use the tool for both."
    "list_arg": '```json\n{"name": "get_weather", "arguments": {"city": ["Rome", "Berlin"]}}\n```',
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the same history, then "Now get the weather in Rome and in Berlin. Use
    # the tool for both.": parallel calls, one fence each
    "parallel": ('```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Rome"}\n}\n```\n\n'
                 '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Berlin"}\n}\n```'),
    # "Write a Python function that adds two numbers." (get_weather): no tool of that name
    "lookalike": ('```json\n{\n    "name": "add_numbers",\n    "arguments": {\n        "a": 5,\n        "b": 3\n'
                  '    }\n}\n```'),
    # "Hi! Who are you?" (get_weather)
    "text": "I'm an Alibaba Cloud assistant created by Alibaba Cloud. How can I assist you today?",
}
EXPECTED = {
    "weather": ("", [PARIS]),
    "write": ("", [ToolCall("Write", {"file_path": "/path/to/output.txt", "content": "Hello, World!"})]),
    "bare": ("", [ToolCall("get_weather", {"city": "Rome"})]),
    "list_arg": ("", [ToolCall("get_weather", {"city": ["Rome", "Berlin"]})]),
    "parallel": ("", [ToolCall("get_weather", {"city": "Rome"}), ToolCall("get_weather", {"city": "Berlin"})]),
    "lookalike": (RECORDED["lookalike"], []),
    "text": (RECORDED["text"], []),
}


def _parse(text: str, names=NAMES):
    r = parse_tool_calls(text, "hermes", tool_names=names)
    return r.content, r.calls


@pytest.mark.parametrize("key", list(RECORDED))
def test_recorded_answers_of_the_real_model(key):
    assert _parse(RECORDED[key]) == EXPECTED[key]
    assert_every_split_matches(lambda: ToolCallParser("hermes", tool_names=NAMES), RECORDED[key], EXPECTED[key])


W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
R = '{"name": "get_time", "arguments": {"city": "Rome"}}'
ROME = ToolCall("get_time", {"city": "Rome"})


@pytest.mark.parametrize(("text", "want"), [
    # the template's own tags, parallel; arguments as a JSON string
    (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{R}\n</tool_call>", ("", [PARIS, ROME])),
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', ("", [PARIS])),
    # fences: one block with two objects, two blocks, a list, an xml fence around a tag, no language
    (f"```json\n{W}\n{R}\n```", ("", [PARIS, ROME])),
    (f"Checking both.\n```json\n{W}\n```\n```json\n{R}\n```\nDone.", ("Checking both.\nDone.", [PARIS, ROME])),
    (f"```json\n[{W}, {R}]\n```", ("", [PARIS, ROME])),
    (f"```xml\n<tool_call>\n{W}\n</tool_call>\n```", ("", [PARIS])),
    (f"```\n{W}\n```", ("", [PARIS])),
    # bare: one, a list, two in a row, after text; a fence cut by the end of the output
    (W, ("", [PARIS])),
    (f"[{W},\n {R}]", ("", [PARIS, ROME])),
    (f"{W}\n{R}", ("", [PARIS, ROME])),
    (f"I will call it: {W}", ("I will call it: ", [PARIS])),
    (f"```json\n{W}", ("", [PARIS])),
    (f"```json\n{W} and text\n```", ("```json\nand text\n```", [PARIS])),  # not a fenced call: a bare one
    # the other tags llama.cpp reads; OpenAI's {"function": {...}} shape; arguments before the name
    (f"<function_call>{W}</function_call>", ("", [PARIS])),
    ('{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}', ("", [PARIS])),
    ('{"arguments": {"city": "Paris"}, "name": "get_weather"}', ("", [PARIS])),
])
def test_call_forms(text, want):
    assert _parse(text) == want
    assert_every_split_matches(lambda: ToolCallParser("hermes", tool_names=NAMES), text, want)


@pytest.mark.parametrize("text", [
    '```json\n{"name": "rm_rf", "arguments": {}}\n```',  # not a tool of the request
    '{"name": "get_weather", "arguments": "not json"}',  # arguments not an object
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather"}',  # no arguments outside <tool_call>
    '{"name": "get_weather", "arguments": {"city": }}',  # invalid JSON
    '{"name": "my-package", "version": "1.0.0", "dependencies": {}}',  # package.json
    '```python\ndef f():\n    return {"name": "get_weather", "x": [1]}\n```',
    "Use `get_weather` with {city} and [brackets] <b>bold</b> ``` ok",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}',  # cut short
])
def test_text_that_only_looks_like_a_call_stays_text(text):
    assert _parse(text) == (text, [])
    assert_every_split_matches(lambda: ToolCallParser("hermes", tool_names=NAMES), text, (text, []))


def test_stream_releases_text_as_soon_as_it_cannot_be_a_call_and_holds_what_may_be():
    p = ToolCallParser("hermes", tool_names=NAMES)
    assert p.feed("Here is code:\n```") == ("Here is code:\n", [])  # may open a ```json fence: held
    assert p.feed("python\nx = {") == ("```python\nx = ", [])  # no call fence; the { may open a call
    assert p.feed('"a": 1}\n```\nDone. ') == ('{"a": 1}\n```\nDone. ', [])  # "a" is no call key
    assert p.feed('{"name": "no') == ("", [])  # held until the name is read...
    assert p.feed('pe", ') == ('{"name": "nope", ', [])  # ...then released: no tool has it
    assert p.feed('```json\n{"name": "get_weather", "arguments": {"city": "Par') == ("", [])
    assert p.feed('is"}}\n') == ("", [])  # the closing fence may still come
    assert p.feed("```\nOK") == ("OK", [PARIS])
    assert p.finish() == ("", [])


def test_calls_follow_each_other_without_the_blanks_between_them():
    p = ToolCallParser("hermes", tool_names=NAMES)
    assert p.feed(f"{W}\n") == ("", [])  # a closing fence may follow a bare call
    assert p.feed("\n") == ("", [])
    assert p.feed(f"{R} and") == ("and", [PARIS, ROME])  # text, not a fence: both decided
    assert p.finish() == ("", [])


FRAGMENTS = ["Hi ", "\n", " ", "`", "```", "```json\n", "```xml\n", "<tool_call>", "</tool_call>", "<tools>",
             "</tools>", "{", "}", "[", "]", ",", W, R, '{"name": "nope", "arguments": {}}', '{"name": "get_weather"',
             ', "arguments": {"city": "Paris"}}', '"arguments"', '{"x": 1}', "not json", "<b>"]


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=8), data=st.data())
def test_any_split_of_any_text_gives_what_the_whole_text_gives(parts, data):
    text = "".join(parts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    whole = parse_tool_calls(text, "hermes", tool_names=NAMES, ids=True, seed=1)
    parser = ToolCallParser("hermes", tool_names=NAMES, ids=True, seed=1)
    assert feed_in_pieces(parser, text, cuts) == (whole.content, whole.calls)
    if not whole.calls:
        assert whole.content == text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(value=JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_every_beginning_of_a_json_value_is_cut_short_never_bad(value, ascii_only, indent):
    text = " " + json.dumps([value, {"k": value}], ensure_ascii=ascii_only, indent=indent)
    assert json_value(text, 1)[0] == "done"
    for i in range(2, len(text)):
        assert json_value(text[:i], 1)[0] == "more", text[:i]


@pytest.mark.parametrize("text", ['{"a": trx', '{"a" 1', '{"a": 01', '{"a": 1, }', '[1,]', '{"a": "\n"}',
                                  '{"a": 1.x', '{"a": "\\q"}', '{"a": "\\u12g4"}', "{'a': 1}"])
def test_json_that_no_continuation_can_mend_is_bad(text):
    assert json_value(text, 0)[0] == "bad"


DEEP = '{"name": "get_weather", "arguments": {"a": ' + "[" * 5000


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "generic"])
@pytest.mark.parametrize("text", [DEEP, DEEP + "]" * 5000 + "}}", "<tool_call>" + DEEP, "[TOOL_CALLS]" + DEEP,
                                  '{"name": "get_weather", "arguments": {"a": ' + "[" * 65 + "]" * 65 + "}}"])
def test_json_nested_too_deep_is_text_in_every_family_never_an_error(family, text):
    """A model that loops on ``[`` once made the decoder raise RecursionError (a 500); calls nest at most
    MAX_DEPTH (64) levels."""
    for names in (NAMES, None):
        assert parse_tool_calls(text, family, tool_names=names).calls == []
    from ollapy.chat.generic_tools import GenericCallParser

    p = GenericCallParser(tool_names=NAMES)
    assert p.feed('{"tool_calls": [' + text[text.index("{"):]) == ("", []) and p.finish()[1] == []


# ---- the answer as written, for the history that sends it back (ollapy.chat.answer_memory) ----------------
def _sent_back(calls, content=None, **extra) -> dict:
    """An assistant message as a client sends a call back: OpenAI's shape (arguments as JSON text, an id)."""
    return {"role": "assistant", "content": content, **extra,
            "tool_calls": [{"id": "call_x", "type": "function",
                            "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls]}


def test_an_answer_comes_back_as_written_only_where_the_client_sent_it_unchanged():
    from ollapy.chat.answer_memory import AnswerMemory, written_history

    mem = AnswerMemory(entries=4, chars=400)
    raw = RECORDED["parallel"]
    calls = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Berlin"})]
    assert mem.remember("qc", raw, "", calls)
    assert mem.recall("qc", _sent_back(calls)) == raw
    assert mem.recall("qc", _sent_back(calls, content="\n")) == raw  # blanks a client trims do not count
    assert mem.recall("qc:other", _sent_back(calls)) is None  # another model's history
    assert mem.recall("qc", _sent_back(calls[:1])) is None  # the client changed the answer: one call, ...
    assert mem.recall("qc", _sent_back([("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})])) is None
    assert mem.recall("qc", _sent_back(calls, content="Here:")) is None  # ... text added
    assert mem.recall("qc", _sent_back(calls, thinking="hm")) is None  # reasoning the template renders its own way
    assert not mem.remember("qc", "Paris.", "Paris.", [])  # the template writes a plain answer as written anyway
    history = [{"role": "user", "content": "Weather?"}, _sent_back(calls), {"role": "tool", "content": "9 C"}]
    out = written_history(history, "qc", mem)
    assert out[1] == {"role": "assistant", "content": raw} and out[0] is history[0] and out[2] is history[2]
    # bounded: the least recently used go first, by count and by characters; an answer over the bound is not kept
    for i in range(4):
        assert mem.remember("qc", f"{{ \"response\": \"{i}\" }}", str(i), [])
    assert len(mem) == 4 and mem.recall("qc", _sent_back(calls)) is None
    assert mem.remember("qc", "x" * 350, "long", []) and len(mem) == 2  # 358 characters with its key, 24 each other
    assert not mem.remember("qc", "y" * 400, "too long", [])


@pytest.mark.parametrize("kw, kept", [({}, True), ({"think": True}, False), ({"forced": True}, False),
                                      ({"max_calls": 1}, False)])
def test_a_reply_is_remembered_unless_reasoning_forced_or_dropped_calls_change_it(kw, kept):
    from ollapy.chat.answer_memory import MEMORY
    from ollapy.chat.reply import ReplyParser

    model = f"test-reply-{sorted(kw)}"
    text = RECORDED["parallel"] if not kw.get("forced") else '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    p = ReplyParser(family="hermes", tool_names=NAMES, ids=True, model=model, **kw)
    d = p.feed(text[:20]) + p.feed(text[20:]) + p.finish()
    assert d.calls and p.finish().calls == []  # finished once
    sent = _sent_back([(c.name, c.arguments) for c in d.calls], content=d.content or None)
    assert (MEMORY.recall(model, sent) == text) is kept
