"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through a live ``ollapy serve`` and
the official ``anthropic`` SDK (SmolLM2).

Models: ``smol`` (SmolLM2's own template), ``smol-tools`` (the Hermes-style template of test_tools_api, which
renders tools and tool results), ``smol-think`` (think_models: a template that opens ``<think>``), ``smol-4k``
(``num_ctx`` 4096, for a ~1,200-token system prompt) and ``smol-512`` (``num_ctx`` 512, for overflow).
"""
from __future__ import annotations

import json
import re

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import live_api
from test_tools_api import HERMES, WEATHER
from think_models import ANSWER, EXAMPLE, THINK_TEMPLATE, THINKING, Q

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
# (the SDK's create() no longer takes temperature/top_p/top_k; the wire still carries them, as Claude Code sends them)
GREEDY = {"extra_body": {"temperature": 0.0, "options": {"repeat_penalty": 1.0}}}
TOOLS = [{"name": "get_weather", "description": "Get the weather for a city", "input_schema": WEATHER},
         {"name": "get_time", "description": "Current time in a timezone",
          "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# ~1,200 tokens of system prompt, the same on every request (an agent's instructions)
LONG_SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer briefly, cite the file name and line number {i} when you quote code." for i in range(70))
LONG_WORDS = " ".join(f"word{i % 97} and" for i in range(750))  # 1,500 words


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    models = {"smol": {}, "smol-tools": {"template": HERMES},
              "smol-think": {"template": THINK_TEMPLATE, "messages": EXAMPLE},
              "smol-4k": {"parameters": {"num_ctx": 4096}}, "smol-512": {"parameters": {"num_ctx": 512}},
              "smol-stop": {"parameters": {"stop": ["Paris"]}}}
    with live_api(tmp_path_factory.mktemp("anthropic"), smollm2_path, models) as api:
        api.ac = anthropic.Anthropic(base_url=api.url, api_key="none", max_retries=0)
        yield api


def _create(api, **kw):
    args = {"model": "smol", "max_tokens": 32, "messages": FRANCE, **GREEDY, **kw}
    return api.ac.messages.create(**args)


# ---- text -------------------------------------------------------------------------------------------------
def test_text_whole_and_streamed(api):
    m = _create(api)
    assert m.type == "message" and m.role == "assistant" and m.model == "smol" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "The capital of France is Paris."
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    u = m.usage
    assert u.output_tokens > 0 and u.input_tokens + u.cache_read_input_tokens > 0 and u.cache_creation_input_tokens == 0
    with api.ac.messages.stream(model="smol", max_tokens=32, messages=FRANCE, **GREEDY) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == m.content[0].text and len(texts) > 1
    assert final.content[0].text == m.content[0].text and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == u.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == u.input_tokens + u.cache_read_input_tokens


def test_stream_event_order(api):
    """The raw SSE events, as Anthropic sends them; the beta path (``?beta=true``) and headers Claude Code sends."""
    body = {"model": "smol", "max_tokens": 32, "messages": FRANCE, "stream": True, **GREEDY["extra_body"]}
    with httpx.stream("POST", api.url + "/v1/messages?beta=true", json=body, timeout=120,
                      headers={"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219",
                               "x-api-key": "none"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [(e.split("\n")[0].removeprefix("event: "), json.loads(e.split("\n")[1].removeprefix("data: ")))
              for e in raw.strip().split("\n\n")]
    kinds = [k for k, _ in events]
    assert all(k == d["type"] for k, d in events)
    assert kinds[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0
    assert "".join(d["delta"]["text"] for k, d in events if k == "content_block_delta") == \
        "The capital of France is Paris."


def test_stop_sequence_and_max_tokens(api):
    m = _create(api, stop_sequences=["Paris", "Rome"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "Paris")
    assert m.content[0].text == "The capital of France is "
    short = _create(api, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_a_models_own_stop_string_ends_the_turn(api):
    """A Modelfile ``PARAMETER stop`` ends the answer as the model's end of turn: ``end_turn``, no
    ``stop_sequence`` (Anthropic names there only one of the request's ``stop_sequences``; Claude Code sends none)."""
    m = _create(api, model="smol-stop")
    assert m.content[0].text == "The capital of France is "
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    with api.ac.messages.stream(model="smol-stop", max_tokens=32, messages=FRANCE, **GREEDY) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("end_turn", None)
    asked = _create(api, model="smol-stop", stop_sequences=["Paris"])
    assert (asked.stop_reason, asked.stop_sequence) == ("stop_sequence", "Paris")


def test_system_as_string_and_as_blocks(api):
    a = _create(api, system="You answer in one word.")
    b = _create(api, system=[{"type": "text", "text": "You answer"}, {"type": "text", "text": "in one word."}])
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens > 0
    assert a.content[0].text and b.content[0].text
    n_a = api.ac.messages.count_tokens(model="smol", messages=FRANCE, system="You answer in one word.").input_tokens
    assert n_a == a.usage.input_tokens + a.usage.cache_read_input_tokens
    # a system turn between the others (the SDK's SystemMessageParam; Claude Code sends them) stays in its place
    turns = FRANCE + [{"role": "assistant", "content": "Paris."}, {"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "And of Italy?"}]
    n = api.ac.messages.count_tokens(model="smol", messages=turns).input_tokens
    without = api.ac.messages.count_tokens(model="smol", messages=turns[:2] + turns[3:]).input_tokens
    assert n > without and _create(api, messages=turns).content[0].text


# ---- tools ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("choice, name", [({"type": "tool", "name": "get_time"}, "get_time"),
                                          ({"type": "any"}, None)])
def test_forced_tool_use(api, choice, name):
    m = _create(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=64)
    assert m.stop_reason == "tool_use"
    (block,) = m.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.name in ("get_weather", "get_time") and (name is None or block.name == name)
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == block.name)
    jsonschema.validate(block.input, schema)


def test_forced_tool_use_with_an_annotation_only_subschema(api):
    """A property that constrains nothing (only a description: any JSON value, as Claude Code's tools have them)
    is read as any value, not refused as llama-cpp-python's converter would ("Unrecognized schema"); a huge
    ``maxLength`` (Claude Code's Workflow tool: 524288) is dropped, not spelled out as nested groups."""
    from ollapy.engine.backend.templating import json_schema_grammar, loosen_schema

    schema = {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "enum": ["print(1)"]}, "input": {"description": "Optional input value"},
        "list": {"type": "array", "items": {"title": "anything"}},
        "script": {"type": "string", "maxLength": 524288}, "name": {"type": "string", "maxLength": 8}}}
    loose = loosen_schema(schema)
    anything = {"type": ["object", "array", "string", "number", "boolean", "null"]}
    assert loose["properties"]["input"] == anything and loose["properties"]["list"]["items"] == anything
    assert loose["properties"]["code"] == schema["properties"]["code"]
    assert loose["properties"]["script"] == {"type": "string"} and loose["properties"]["name"]["maxLength"] == 8
    assert "input-kv" in json_schema_grammar(json.dumps(schema)) and len(json_schema_grammar(json.dumps(schema))) < 5000
    m = _create(api, messages=[{"role": "user", "content": "Run print(1)"}], max_tokens=64,
                tools=[{"name": "run_script", "description": "Run a script", "input_schema": schema}],
                tool_choice={"type": "tool", "name": "run_script"})
    (block,) = m.content
    assert m.stop_reason == "tool_use" and block.name == "run_script" and block.input["code"] == "print(1)"
    jsonschema.validate(block.input, schema)


def test_forced_tool_use_streams_input_json(api):
    with api.ac.messages.stream(model="smol-tools", max_tokens=64, messages=ASK, tools=TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert json.loads("".join(partial)) == block.input
    jsonschema.validate(block.input, WEATHER)


def test_tool_result_round_trip(api):
    m = _create(api, model="smol-tools", messages=ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                max_tokens=64)
    call = m.content[0]

    def answer(result: str):
        history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                       "content": result}]}]
        return _create(api, model="smol-tools", messages=history, tools=TOOLS, max_tokens=48)

    short, long = answer("22 degrees"), answer("22 degrees and sunny, a light wind from the west, no rain today")
    for a in (short, long):
        assert a.stop_reason in ("end_turn", "max_tokens") and [b.type for b in a.content] == ["text"]
        assert a.content[0].text
    total = lambda r: r.usage.input_tokens + r.usage.cache_read_input_tokens  # noqa: E731
    assert total(long) > total(short)  # the tool's result is in the prompt
    # the same history in OpenAI's shapes renders the same prompt
    oai = api.oai.chat.completions.create(
        model="smol-tools", max_tokens=1, messages=ASK + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {
                "name": call.name, "arguments": json.dumps(call.input)}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "22 degrees"}],
        tools=[{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}} for t in TOOLS])
    assert oai.usage.prompt_tokens == total(short)


# ---- thinking ---------------------------------------------------------------------------------------------
def test_thinking_blocks(api):
    m = _create(api, model="smol-think", messages=[{"role": "user", "content": Q}], max_tokens=40,
                thinking={"type": "enabled", "budget_tokens": 1024})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == \
        [("thinking", THINKING), ("text", ANSWER)]
    with api.ac.messages.stream(model="smol-think", messages=[{"role": "user", "content": Q}], max_tokens=40,
                                thinking={"type": "enabled", "budget_tokens": 1024}, **GREEDY) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THINKING and final.content[1].text == ANSWER
    assert "thinking_delta" in kinds and "text_delta" in kinds
    # a model whose template cannot think answers anyway (agents send thinking to any model)
    plain = _create(api, thinking={"type": "enabled", "budget_tokens": 2048})
    assert [b.type for b in plain.content] == ["text"]


# ---- count_tokens and the prompt cache --------------------------------------------------------------------
def test_count_tokens_matches_usage(api):
    kw = {"model": "smol-tools", "messages": ASK, "tools": TOOLS, "system": "Be brief."}
    n = api.ac.messages.count_tokens(**kw).input_tokens
    m = _create(api, max_tokens=1, **kw)
    assert n == m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert n > api.ac.messages.count_tokens(model="smol-tools", messages=ASK).input_tokens  # tools are in the prompt


def test_cache_read_on_a_repeated_system_prompt(api):
    first = _create(api, model="smol-4k", system=LONG_SYSTEM, max_tokens=4)
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert 1100 < total < 2000
    second = _create(api, model="smol-4k", system=LONG_SYSTEM, max_tokens=4,
                     messages=[{"role": "user", "content": "Name a colour."}])
    assert second.usage.cache_read_input_tokens > 1100  # the system prompt came from the prompt cache
    assert second.usage.cache_read_input_tokens + second.usage.input_tokens == api.ac.messages.count_tokens(
        model="smol-4k", system=LONG_SYSTEM, messages=[{"role": "user", "content": "Name a colour."}]).input_tokens


def test_message_start_reports_the_cache_hit(api):
    """A streamed answer's ``message_start`` has the prompt-cache hit, as Anthropic's does: a client reading only that
    event (not the final ``message_delta``) sees the system prompt served from the cache."""
    _create(api, model="smol-4k", system=LONG_SYSTEM, max_tokens=2)
    body = {"model": "smol-4k", "system": LONG_SYSTEM, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "Name a tree."}], **GREEDY["extra_body"]}
    with httpx.stream("POST", api.url + "/v1/messages", json=body, timeout=120) as r:
        assert r.status_code == 200
        raw = r.read().decode()
    events = {e.split("\n")[0].removeprefix("event: "): json.loads(e.split("\n")[1].removeprefix("data: "))
              for e in raw.strip().split("\n\n")}
    start, final = events["message_start"]["message"]["usage"], events["message_delta"]["usage"]
    assert start["cache_read_input_tokens"] > 1100, start  # the system prompt, known before the first token
    assert start["cache_read_input_tokens"] == final["cache_read_input_tokens"]
    assert start["input_tokens"] == final["input_tokens"]


# ---- errors -----------------------------------------------------------------------------------------------
def test_unknown_model_is_not_found_error(api):
    with pytest.raises(anthropic.NotFoundError) as e:
        _create(api, model="no-such-model")
    assert e.value.status_code == 404
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        api.ac.messages.count_tokens(model="no-such-model", messages=FRANCE)


@pytest.mark.parametrize("body, words", [
    ({"model": "smol", "messages": FRANCE}, "max_tokens is required"),
    ({"model": "smol", "max_tokens": 8, "messages": []}, "messages"),
    ({"model": "smol", "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ({"model": "smol", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
     'does not support vision'),
    ({"model": "smol", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": ""}}]}]},
     "document content blocks are not supported"),
    ({"model": "smol", "max_tokens": 8, "messages": FRANCE, "tool_choice": {"type": "tool", "name": "nope"},
      "tools": TOOLS}, "'nope', which is not in tools"),
    ({"model": "smol", "max_tokens": -1, "messages": FRANCE}, "max_tokens"),
    ({"model": "smol", "max_tokens": 8, "messages": FRANCE + [{"role": "system", "content": [
        {"type": "tool_use", "id": "t", "name": "get_time", "input": {}}]}]}, "system messages hold text blocks only"),
])
def test_bad_bodies_are_invalid_request_errors(api, body, words):
    r = httpx.post(api.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert words in err["error"]["message"] and "\n" not in err["error"]["message"]


def test_malformed_json_and_unknown_route_in_anthropic_shape(api):
    r = httpx.post(api.url + "/v1/messages", content=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(api.url + "/v1/messages/nope", json={}, timeout=60)
    assert r.status_code == 404 and r.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": "no such endpoint: POST /v1/messages/nope (check the URL)"}}


# ---- context overflow -------------------------------------------------------------------------------------
def test_overflow_is_an_error_an_agent_can_act_on(api):
    long_msg = [{"role": "user", "content": LONG_WORDS}]
    with pytest.raises(openai.BadRequestError) as e:
        api.oai.chat.completions.create(model="smol-512", messages=long_msg, max_tokens=16)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e2:
        _create(api, model="smol-512", messages=long_msg, max_tokens=16)
    err = e2.value.body["error"]
    assert err["type"] == "invalid_request_error"
    n, limit = map(int, re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", err["message"]).groups())
    assert n == api.ac.messages.count_tokens(model="smol-512", messages=long_msg).input_tokens
    assert n > 1500 and limit == 512 - 16  # room for max_tokens is kept
    # Ollama's /api keeps truncating (and says so); its per-request truncate: false is a 400
    r = httpx.post(api.url + "/api/chat", json={"model": "smol-512", "messages": long_msg, "stream": False,
                                                "options": {"num_predict": 4}}, timeout=120)
    assert r.status_code == 200 and r.json()["truncated"] is True and r.json()["prompt_eval_count"] < 512
    r = httpx.post(api.url + "/api/chat", json={"model": "smol-512", "messages": long_msg, "stream": False,
                                                "truncate": False, "options": {"num_predict": 4}}, timeout=120)
    assert r.status_code == 400 and r.json()["error"].startswith(f"prompt is too long: {n} tokens > 508 maximum")
    # and an /v1 request may ask for Ollama's truncation (an ollapy extension)
    ok = api.oai.chat.completions.create(model="smol-512", messages=long_msg, max_tokens=4,
                                         extra_body={"options": {"truncate": True}})
    assert ok.usage.prompt_tokens < 512


def test_ollama_shift_false_ends_at_the_context(api):
    """Ollama's per-request ``shift: false``: generation stops at the end of num_ctx (512) instead of shifting."""
    body = {"model": "smol-512", "stream": False, "prompt": "1, 2, 3, 4, 5, 6,", "raw": True,
            "options": {"num_predict": 600, "temperature": 0, "repeat_penalty": 1.0}}
    stopped = httpx.post(api.url + "/api/generate", json={**body, "shift": False}, timeout=300).json()
    assert stopped["done_reason"] == "length" and stopped["eval_count"] < 512 - stopped["prompt_eval_count"] + 2
    shifted = httpx.post(api.url + "/api/generate", json=body, timeout=300).json()
    assert shifted["done_reason"] == "length" and shifted["eval_count"] == 600


# ---- /api/version -----------------------------------------------------------------------------------------
def test_api_version_satisfies_an_ollama_client_gate(api):
    v = httpx.get(api.url + "/api/version", timeout=30).json()
    level = tuple(int(x) for x in v["version"].split("."))
    assert level >= (0, 13, 4)  # Codex --oss: "requires Ollama 0.13.4 or newer"
    import ollapy

    assert v["ollapy_version"] == ollapy.__version__
    # what Ollama-style agent launchers read: the context length, the capabilities, the model list
    show = httpx.post(api.url + "/api/show", json={"model": "smol-tools"}, timeout=30).json()
    assert show["model_info"]["llama.context_length"] == 8192
    assert show["capabilities"] == ["completion", "tools"]
    ids = [m["id"] for m in httpx.get(api.url + "/v1/models", timeout=30).json()["data"]]
    assert "smol-tools:latest" in ids and "smol-512:latest" in ids
