"""Tool-call parsing (ollapy.chat.toolcalls): each family's format, malformed text, streaming splits."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming_helpers import assert_every_split_matches, feed_in_pieces

from ollapy.chat.toolcalls import (
    ToolCall,
    ToolCallParser,
    call_id_factory,
    detect_family,
    parse_tool_calls,
)
from ollapy.errors import OptionError

W = {"city": "Paris", "unit": "celsius"}
T = {"tz": "Europe/Paris"}


def _calls(result):
    return [(c.name, c.arguments) for c in result.calls]


def _stream(text: str, family: str, cuts: list[int], **kw):
    """Feed ``text`` cut at ``cuts``; return (content, calls) as the whole-text parser does."""
    return feed_in_pieces(ToolCallParser(family, **kw), text, cuts)


# ------------------------------------------------------------------ hermes

HERMES_TWO = (
    'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Paris\\"}"}\n</tool_call>'
)


def test_hermes_two_calls_with_object_and_string_arguments():
    r = parse_tool_calls(HERMES_TWO, "hermes")
    assert _calls(r) == [("get_weather", W), ("get_time", T)]
    assert r.content == "Let me check both.\n"  # the blanks after a call are dropped (llama.cpp's parser)
    assert all(c.id is None for c in r.calls)


def test_hermes_content_after_the_call_and_no_arguments():
    r = parse_tool_calls('<tool_call>{"name": "ping"}</tool_call> done', "hermes")
    assert _calls(r) == [("ping", {})]
    assert r.content == "done"


def test_hermes_malformed_json_is_content():
    text = 'Hi <tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call> bye'
    r = parse_tool_calls(text, "hermes")
    assert r.calls == [] and r.content == text


def test_hermes_malformed_then_good_call_keeps_the_good_one():
    text = '<tool_call>not json</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>'
    r = parse_tool_calls(text, "hermes")
    assert _calls(r) == [("a", {})]
    assert r.content == "<tool_call>not json</tool_call>"


def test_hermes_unclosed_tag_with_complete_json_is_a_call_but_partial_json_is_content():
    r = parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n', "hermes")
    assert _calls(r) == [("a", {"x": 1})] and r.content == ""
    cut = '<tool_call>\n{"name": "a", "argu'
    r = parse_tool_calls(cut, "hermes")
    assert r.calls == [] and r.content == cut


def test_hermes_arguments_that_are_not_an_object_are_content():
    for args in ('[1, 2]', '"not json"', "3"):
        text = f'<tool_call>{{"name": "a", "arguments": {args}}}</tool_call>'
        assert parse_tool_calls(text, "hermes").calls == []


def test_hermes_streaming_holds_back_a_partial_marker_and_emits_calls_when_closed():
    p = ToolCallParser("hermes")
    assert p.feed("Sure <tool") == ("Sure ", [])
    assert p.feed("_ca") == ("", [])
    assert p.feed('ll>{"name": "a", "arguments": {}}') == ("", [])
    assert p.feed("</tool_call>\n") == ("", [ToolCall("a", {})])
    assert p.feed(" ok") == ("ok", [])
    assert p.feed(" <tool!") == (" <tool!", [])
    assert p.finish() == ("", [])


# ------------------------------------------------------------------ llama 3.1


def test_llama3_parameters_object_with_python_tag():
    r = parse_tool_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "llama3")
    assert _calls(r) == [("get_weather", W)] and r.content == ""


def test_llama3_several_calls_separated_by_semicolon_or_newline():
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n{"name": "x", "parameters": "{}"}'
    )
    r = parse_tool_calls(text, "llama3")
    assert _calls(r) == [("get_weather", W), ("get_time", T), ("x", {})]


def test_llama3_plain_answer_and_plain_json_answer_are_content():
    assert parse_tool_calls("The weather is fine.", "llama3").content == "The weather is fine."
    answer = '{"city": "Paris", "temperature": 21}'
    r = parse_tool_calls(answer, "llama3")
    assert r.calls == [] and r.content == answer
    # a name without arguments is not enough for the JSON-only families
    assert parse_tool_calls('{"name": "Bob"}', "llama3").calls == []


def test_llama3_text_after_the_calls_is_content():
    r = parse_tool_calls('{"name": "a", "parameters": {}}\nCalling a now.', "llama3")
    assert _calls(r) == [("a", {})] and r.content == "Calling a now."


def test_llama3_streams_text_at_once_but_buffers_json():
    p = ToolCallParser("llama3")
    assert p.feed("  ") == ("", [])
    assert p.feed("Hello") == ("  Hello", [])
    p = ToolCallParser("llama3")
    assert p.feed('\n{"name": "a", "parameters": {}}') == ("", [])
    assert p.finish() == ("", [ToolCall("a", {})])


def test_llama3_truncated_json_is_content():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": '
    r = parse_tool_calls(text, "llama3")
    assert r.calls == [] and r.content == text


# ------------------------------------------------------------------ mistral


GENERATED_ID = r"call_[0-9a-f]{8}"


@pytest.mark.parametrize(
    ("text", "seed", "want_ids", "want_content"),
    [
        pytest.param(
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "abcDEF123"}, '
            '{"name": "get_time", "arguments": "{\\"tz\\": \\"Europe/Paris\\"}"}]',
            1, ["abcDEF123", GENERATED_ID], "", id="json-list-with-model-ids",
        ),
        pytest.param(
            'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
            '[TOOL_CALLS]get_time[CALL_ID]x1y2z3w4v[ARGS]{"tz": "Europe/Paris"}',
            0, [GENERATED_ID, "x1y2z3w4v"], "Checking.", id="args-form-repeated-with-text-before",
        ),
    ],
)
def test_mistral_two_calls_keep_model_ids_and_make_the_rest(text, seed, want_ids, want_content):
    r = parse_tool_calls(text, "mistral", ids=True, seed=seed)
    assert _calls(r) == [("get_weather", W), ("get_time", T)]
    for call, want in zip(r.calls, want_ids, strict=True):
        assert re.fullmatch(want, call.id), (call.id, want)
    assert r.content == want_content


def test_mistral_malformed_forms_are_content():
    for text in ("[TOOL_CALLS] hello there", "[TOOL_CALLS][{\"name\": ", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]f[ARGS]{\"a\": "):
        r = parse_tool_calls(text, "mistral")
        assert r.calls == [] and r.content == text, text


def test_mistral_streaming_emits_each_args_call_when_its_json_closes():
    p = ToolCallParser("mistral")
    assert p.feed("[TOOL_") == ("", [])
    assert p.feed("CALLS]a[AR") == ("", [])
    assert p.feed('GS]{"x": {"y": 1}') == ("", [])
    assert p.feed("}[TOOL_CALLS]b") == ("", [ToolCall("a", {"x": {"y": 1}})])
    assert p.feed("[ARGS]{}") == ("", [ToolCall("b", {})])
    assert p.finish() == ("", [])


# ------------------------------------------------------------------ generic (Ollama's JSON forms)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}',
        '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        '{"tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}',
        '{"function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}}',
        '  \n{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}',
    ],
)
def test_generic_json_forms(text):
    r = parse_tool_calls(text, "generic")
    assert _calls(r) == [("get_weather", W)] and r.content == ""


def test_generic_non_calls_are_content():
    for text in ("[]", '[{"name": "a", "arguments": {}}, 3]', '{"tool_calls": []}', "plain words", '{"name": "a", "arguments": '):
        r = parse_tool_calls(text, "generic")
        assert r.calls == [] and r.content == text, text


def test_generic_python_tag_is_not_special():
    text = '<|python_tag|>{"name": "a", "arguments": {}}'
    assert parse_tool_calls(text, "generic").content == text


def test_tool_names_filter_keeps_unknown_functions_as_content():
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, "hermes", tool_names=["get_weather"]).content == text
    assert _calls(parse_tool_calls(text, "hermes", tool_names={"rm_rf"})) == [("rm_rf", {})]


# ------------------------------------------------------------------ ids, families


def test_ids_only_when_requested_and_reproducible_with_a_seed():
    text = '{"name": "a", "arguments": {}}; {"name": "b", "arguments": {}}'
    assert [c.id for c in parse_tool_calls(text, "llama3").calls] == [None, None]
    one = [c.id for c in parse_tool_calls(text, "llama3", ids=True, seed=7).calls]
    two = [c.id for c in parse_tool_calls(text, "llama3", ids=True, seed=7).calls]
    assert one == two and one[0] != one[1]
    assert all(re.fullmatch(r"call_[0-9a-f]{8}", i) for i in one)
    free = call_id_factory()
    assert re.fullmatch(r"call_[0-9a-f]{8}", free())


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ('{% for t in tools %}{% endfor %}<tool_call>\n{"name": <function-name>, "arguments": <args>}\n</tool_call>', "hermes"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3"),
        ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}', "llama3"),
        ("{%- if message.role == 'ipython' %}", "llama3"),
        ("{{ '[AVAILABLE_TOOLS]' }}{{ tools|tojson }}[/AVAILABLE_TOOLS]{% for c in tool_calls %}[TOOL_CALLS]", "mistral"),
        ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}", "generic"),
        ("", "generic"),
        (None, "generic"),
    ],
)
def test_detect_family_from_template(template, family):
    assert detect_family(template) == family


def test_detect_family_override_and_bad_name():
    assert detect_family("<tool_call>", override="Mistral") == "mistral"
    assert detect_family(None, override="qwen") == "hermes"
    with pytest.raises(OptionError) as err:
        detect_family(None, override="gpt")
    assert "\n" not in str(err.value) and "hermes" in str(err.value)
    with pytest.raises(OptionError):
        ToolCallParser("nope")


# ------------------------------------------------------------------ streaming == whole text

SAMPLES = [
    ("hermes", HERMES_TWO),
    ("hermes", 'a <tool_call>{"name": "a", "arguments": {}}</tool_call> b <tool_cal'),
    ("hermes", 'x<tool_call>{"name": "a", "arguments": {"k": "</tool"}}'),
    ("hermes", "<tool_call>oops</tool_call><tool_call>{\"name\": \"b\", \"arguments\": \"{}\"}</tool_call>"),
    ("llama3", '<|python_tag|>{"name": "a", "parameters": {"x": [1, 2]}};{"name": "b", "parameters": {}}'),
    ("llama3", "  <|python"),
    ("llama3", "Just text with { braces }"),
    ("mistral", 'hi [TOOL_CALLS] [{"name": "a", "arguments": {"q": "[ARGS]"}}] after'),
    ("mistral", '[TOOL_CALLS]a[CALL_ID]abc123def[ARGS] {"x": 1}[TOOL_CALLS]b[ARGS]{}tail [TOOL'),
    ("mistral", "[TOOL_CALLS]bad name[ARGS]{}"),
    ("generic", '{"tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"name": "b", "parameters": {"y": null}}]}'),
    ("generic", '\n\n[{"name": "a", "arguments": "{\\"z\\": 2}"}] and more'),
]


@pytest.mark.parametrize(("family", "text"), SAMPLES)
def test_every_single_split_and_char_by_char_match_the_whole_text(family, text):
    whole = parse_tool_calls(text, family)
    assert_every_split_matches(lambda: ToolCallParser(family), text, (whole.content, whole.calls))


FRAGMENTS = [
    "Hello ", "\n", " ", "{", "}", "[", "]", ";", "<", "[TOOL", "[ARGS]", "[CALL_ID]",
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "get_weather", "id12",
    '{"name": "a", "arguments": {"x": 1}}', '{"name": "b", "parameters": "{\\"y\\": [2]}"}',
    '[{"name": "c", "arguments": {}}]', '{"tool_calls": [{"function": {"name": "d", "arguments": {}}}]}',
    '{"x": 1}', '{"name": "e", "arguments": {', 'not json',
]


@settings(max_examples=300, deadline=None)
@given(
    family=st.sampled_from(["hermes", "llama3", "mistral", "generic"]),
    parts=st.lists(st.sampled_from(FRAGMENTS), max_size=8),
    data=st.data(),
)
def test_any_split_of_any_text_matches_the_whole_text(family, parts, data):
    text = "".join(parts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    whole = parse_tool_calls(text, family, ids=True, seed=3)
    assert _stream(text, family, cuts, ids=True, seed=3) == (whole.content, whole.calls)
    # nothing is lost: calls + content never exceed the input, and no call means content is the input
    if not whole.calls:
        assert whole.content == text

