"""llama.cpp's generic tool-call format (ollapy/chat/generic_tools.py) without a model: the prompt polyfill, the
answer schema, and the streaming parser on every split of its input; the Responses store and input items."""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ollapy.chat.generic_tools import INSTRUCTION, GenericCallParser, answer_schema, generic_messages, history_messages
from ollapy.chat.reply import ReplyDelta, ReplyParser
from ollapy.errors import OptionError

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def _parse(pieces: list[str], **kw) -> tuple[str, list]:
    p = GenericCallParser(**kw)
    content, calls = "", []
    for piece in pieces:
        c, k = p.feed(piece)
        content, calls = content + c, calls + k
    c, k = p.finish()
    return content + c, calls + k


def _splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


ANSWERS = [
    ('{"response": "Paris is \\"nice\\"\\n\\u00e9\\ud83d\\ude00 end"}', 'Paris is "nice"\né😀 end', []),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [("get_weather", {"city": "Paris"})]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]}',
     "", [("get_time", {}), ("get_weather", {"city": "Rome"})]),
    ('{"response": {"answer": 4}}', '{"answer": 4}', []),  # a structured response (the request's schema)
    ('{"tool_call": {"name": "get_wea', '{"tool_call": {"name": "get_wea', []),  # cut short: content as written
    ('{"tool_call": {"name": "rm_rf", "arguments": {}}}', '{"tool_call": {"name": "rm_rf", "arguments": {}}}', []),
    ("plain words", "plain words", []),
    ('{"response": "cut sho', "cut sho", []),  # cut inside the response: what was written
    # a tool_calls array cut short: the calls it completed, the cut one dropped (llama.cpp's partial parse)
    ('{ "tool_calls": [ { "name": "get_time", "arguments": {}}, { "name": "get_weather", "arguments": { "city": "Ro',
     "", [("get_time", {})]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {}} , {"name": "get_time", "arguments": {}}, {"na',
     "", [("get_time", {}), ("get_time", {})]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {}}]', "", [("get_time", {})]),  # cut before the last }
    ('{"tool_calls": [{"name": "get_time", "argu', '{"tool_calls": [{"name": "get_time", "argu', []),  # none ends
    ('{"tool_calls": [{"name": "rm_rf", "arguments": {}}, {"na', '{"tool_calls": [{"name": "rm_rf", "arguments": {}}, {"na',
     []),  # a complete call to no tool of the request: content, as a whole answer of it would be
]


@pytest.mark.parametrize("text, content, calls", ANSWERS)
@given(cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8))
def test_parser_gives_the_same_answer_for_any_split(text, content, calls, cuts):
    got_content, got_calls = _parse(_splits(text, cuts), tool_names=["get_weather", "get_time"])
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls


def test_response_streams_before_the_end_and_calls_get_ids():
    p = GenericCallParser()
    assert p.feed('{"resp') == ("", [])
    assert p.feed('onse": "Hel') == ("Hel", [])
    assert p.feed("lo\\") == ("lo", [])  # a partial escape is held back
    assert p.feed('n"}') == ("\n", [])
    assert p.finish() == ("", [])
    content, calls = _parse(['{"tool_call": {"name": "get_time", "arguments": {}}}'], ids=True, seed=1)
    again = _parse(['{"tool_call": {"name": "get_time", "arguments": {}}}'], ids=True, seed=1)[1]
    assert content == "" and calls[0].id.startswith("call_") and calls[0].id == again[0].id


def test_answer_schema_accepts_exactly_the_generic_forms():
    auto = answer_schema(TOOLS, parallel=False)
    jsonschema.validate({"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, auto)
    jsonschema.validate({"response": "hi"}, auto)
    for bad in ({"tool_call": {"name": "get_weather", "arguments": {}}}, {"tool_call": {"name": "nope", "arguments": {}}},
                {"tool_calls": [{"name": "get_time", "arguments": {}}]}, {"response": 3}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, auto)
    parallel = answer_schema(TOOLS, parallel=True)
    jsonschema.validate({"tool_calls": [{"name": "get_time", "arguments": {}}]}, parallel)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": []}, parallel)
    forced = answer_schema(TOOLS, forced=True, name="get_time")
    jsonschema.validate({"tool_call": {"name": "get_time", "arguments": {}}}, forced)
    for bad in ({"response": "hi"}, {"tool_call": {"name": "get_weather", "arguments": {"city": "x"}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, forced)
    structured = answer_schema(TOOLS, response={"type": "object", "properties": {"n": {"type": "integer"}},
                                                "required": ["n"]})
    jsonschema.validate({"response": {"n": 1}}, structured)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"response": "one"}, structured)
    with pytest.raises(OptionError, match="'nope', which is not in tools"):
        answer_schema(TOOLS, forced=True, name="nope")


def test_prompt_describes_the_tools_and_writes_the_history_as_text():
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "tool_name": "get_weather", "content": "-3 C"}]
    msgs = generic_messages(history, TOOLS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    head = msgs[0]["content"]
    assert head.startswith("Be brief.\n\nYou can call any of the following tools") and head.endswith(INSTRUCTION)
    assert json.loads(head[head.index("["):head.rindex("]") + 1]) == TOOLS
    assert json.loads(msgs[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    assert json.loads(msgs[3]["content"]) == {"tool_response": {"tool": "get_weather", "content": "-3 C"}}
    assert history_messages(history)[1:] == msgs[1:] and history_messages(history)[0] == history[0]
    assert generic_messages(history[1:2], TOOLS)[0]["role"] == "system"  # a system message of its own


def _answer(pieces: list[str]) -> tuple[str, list]:
    """A generic-format answer parsed as the server parses it (remembered as written for model "m")."""
    p = ReplyParser(calls=GenericCallParser(ids=True), model="m")
    d = sum((p.feed(x) for x in pieces), ReplyDelta()) + p.finish()
    return d.content, d.calls


def test_an_answer_comes_back_into_the_history_as_the_model_wrote_it():
    # the grammar lets the model put a space or none at each point; new JSON would differ from its tokens
    raw = ('{ "tool_calls": [ { "name": "get_weather", "arguments": { "city": "Oslo" } }, '
           '{ "name": "get_time", "arguments": {} } ] }')
    content, calls = _answer([raw[:9], raw[9:]])
    assert content == "" and [c.name for c in calls] == ["get_weather", "get_time"]
    sent = [{"id": "toolu_" + c.id.removeprefix("call_"), "type": "function",  # as Anthropic's API sends them back
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": sent}]
    assert history_messages(history, "m")[1]["content"] == raw
    assert history_messages(history, "other model")[1]["content"] != raw  # another model's history: written anew
    other = [{**sent[0], "id": "call_elsewhere"}]  # a call this process did not generate: written anew
    assert json.loads(history_messages([{"role": "assistant", "content": "", "tool_calls": other}], "m")[0]["content"]) == \
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    # a response's text, sent back as the assistant's text, is written as the JSON the model wrote
    raw = '{ "response": "It is \\"cold\\" there" }'
    assert _answer([raw]) == ('It is "cold" there', [])
    msgs = generic_messages([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": 'It is "cold" there'}],
                            TOOLS, "m")
    assert msgs[-1] == {"role": "assistant", "content": raw}
    assert history_messages([{"role": "assistant", "content": 'It is "cold" there'}], "m")[0]["content"] == raw
    assert history_messages([{"role": "assistant", "content": 'It is "hot" there'}], "m")[0]["content"] == \
        'It is "hot" there'  # an answer the client edited: as the client sent it


def test_response_store_evicts_least_recently_used_by_bytes():
    from ollapy.server.openai.responses.store import ResponseNotFound, ResponseStore, StoredResponse

    def item(n: int) -> StoredResponse:
        return StoredResponse({"pad": "x" * n}, [])

    size = item(100).size
    store = ResponseStore(3 * size)
    for rid in ("a", "b", "c"):
        assert store.put(rid, item(100))
    store.get("a")  # now the most recently used: b goes first
    assert store.put("d", item(100))
    assert store.get("a") and store.get("c") and store.get("d") and store.bytes == 3 * size and len(store) == 3
    with pytest.raises(ResponseNotFound) as e:
        store.get("b")
    assert e.value.status == 404 and e.value.code == "previous_response_not_found"
    assert not store.put("big", item(4 * size)) and len(store) == 3  # larger than the bound: not kept
    assert store.put("e", item(2 * size + 40))  # room for it: every other item goes
    assert len(store) == 1 and store.bytes == item(2 * size + 40).size


def test_responses_input_items_become_chat_messages():
    from ollapy.server.openai.responses.bodies import ResponsesBody

    body = ResponsesBody.from_dict({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                         {"type": "input_text", "text": "Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is -3 C."}]}]})
    assert body.messages == [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "thinking": "Call it.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "-3 C", "tool_call_id": "call_1", "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is -3 C."}]
    assert body.instructions == "Be brief." and body.choice == ("auto", None)
    custom = ResponsesBody.from_dict({"model": "m", "tools": [{"type": "custom", "name": "shell"}],
                                      "tool_choice": {"type": "custom", "name": "shell"}, "input": [
        {"type": "custom_tool_call", "call_id": "c2", "name": "shell", "input": "ls"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "a.txt"}]})
    assert custom.messages == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "shell", "arguments": {"input": "ls"}}}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "c2", "tool_name": "shell"}]
    assert custom.tools[0]["function"]["parameters"]["properties"] == {"input": {"type": "string"}}
    assert custom.choice == ("required", "shell")
    # hosted tools (OpenAI runs them) are left out; a namespace tool's functions count (Codex sends both)
    agentish = ResponsesBody.from_dict({"model": "m", "input": "hi", "tools": [
        {"type": "web_search"}, {"type": "namespace", "name": "mcp", "tools": [
            {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}]}]})
    assert [t["function"]["name"] for t in agentish.tools] == ["read_file"]
    for bad, words in (({"input": [{"type": "web_search_call"}]}, "input.0: unsupported input item type"),
                       ({"input": "hi", "tools": [7]}, "tools.0: a tool must be an object"),
                       ({"input": "hi", "tool_choice": "required"}, "tool_choice requires tools"),
                       ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema must be"),
                       ({"input": "hi", "reasoning": {"effort": "huge"}}, "invalid reasoning value"),
                       ({}, "input is required")):
        with pytest.raises(OptionError, match=words):
            ResponsesBody.from_dict({"model": "m", **bad})
