"""``/v1/responses`` through a live ``ollapy serve`` and the official ``openai`` SDK (SmolLM2), and cached tokens
on every OpenAI route.

Models: ``smol`` (SmolLM2's own template: no tool support, so tools use llama.cpp's generic format),
``smol-tools`` (a Hermes-style template with a tools section, tests/test_tools_api.py) and ``smol-think``
(tests/think_models.py: its greedy answer reasons, then answers, known exactly). The server's response
store is bounded to 5,000 bytes so that one stored response (padded by ``metadata``) evicts the one before.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from conftest import live_api
from test_tools_api import HERMES, WEATHER
from think_models import ANSWER, EXAMPLE, THINK_TEMPLATE, THINKING, Q

GREEDY = {"temperature": 0, "extra_body": {"options": {"repeat_penalty": 1.0}}}
FRANCE = "What is the capital of France? Answer in one word."
PARIS = "The capital of France is Paris."
TOOL = {"type": "function", "name": "get_weather", "description": "Get the weather for a city",
        "parameters": WEATHER, "strict": True}
PAD = {f"pad{i}": "x" * 500 for i in range(4)}  # 2,000 bytes of metadata: a stored response is ~3-4 kB
LONG_SYSTEM = " ".join(f"Rule {i}: answer politely, briefly and in plain English." for i in range(85))


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    models = {"smol": {}, "smol-tools": {"template": HERMES},
              "smol-think": {"template": THINK_TEMPLATE, "messages": EXAMPLE}}
    env = {"OLLAPY_RESPONSES_STORE": "5000", "OLLAPY_CONTEXT_LENGTH": "2048"}
    with live_api(tmp_path_factory.mktemp("responses"), smollm2_path, models, env=env) as api:
        yield api


def _create(api, **kw):
    return api.oai.responses.create(**{"model": "smol", "max_output_tokens": 32, **GREEDY, **kw})


def _stream(api, **kw):
    """(event types with consecutive deltas collapsed, the events, the final Response) of ``responses.stream``."""
    with api.oai.responses.stream(**{"model": "smol", "max_output_tokens": 32, **GREEDY, **kw}) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    collapsed = [k for i, k in enumerate(kinds) if not (k.endswith(".delta") and i and kinds[i - 1] == k)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return collapsed, events, final


MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
                  "response.output_text.done", "response.content_part.done", "response.output_item.done"]


# ---- text -----------------------------------------------------------------------------------------
def test_text_whole_and_streamed(api):
    r = _create(api, input=FRANCE)
    assert (r.status, r.output_text, r.incomplete_details) == ("completed", PARIS, None)
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_") and r.id.startswith("resp_")
    chat = api.oai.chat.completions.create(model="smol", messages=[{"role": "user", "content": FRANCE}], max_tokens=32,
                                           **GREEDY)
    assert chat.choices[0].message.content == PARIS
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens

    kinds, events, final = _stream(api, input=FRANCE)
    assert kinds == ["response.created", "response.in_progress", *MESSAGE_EVENTS, "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == PARIS
    assert final.output_text == PARIS and final.status == "completed" and final.id == events[0].response.id
    assert final.usage.input_tokens == r.usage.input_tokens


def test_instructions_and_max_output_tokens(api):
    r = _create(api, input=FRANCE, instructions="You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    assert r.output_text == PARIS and r.instructions.startswith("You are")  # SmolLM2's own default system prompt
    cut = _create(api, input=FRANCE, max_output_tokens=3)
    assert (cut.status, cut.incomplete_details.reason, cut.usage.output_tokens) == ("incomplete", "max_output_tokens", 3)
    assert PARIS.startswith(cut.output_text) and cut.output[0].status == "incomplete"
    with api.oai.responses.stream(model="smol", input=FRANCE, max_output_tokens=3, **GREEDY) as s:
        kinds = [e.type for e in s]
    assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds


def test_reasoning_items_whole_and_streamed(api):
    for effort in ({"reasoning": {"effort": "low"}}, {"extra_body": {"reasoning_effort": "high",
                                                                     "options": {"repeat_penalty": 1.0}}}):
        r = _create(api, model="smol-think", input=Q, max_output_tokens=40, **effort)
        reasoning, msg = r.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == THINKING
        assert r.output_text == ANSWER
    off = _create(api, model="smol-think", input=Q, max_output_tokens=40, reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == ANSWER
    kinds, events, final = _stream(api, model="smol-think", input=Q, max_output_tokens=40)
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                     "response.content_part.done", "response.output_item.done", *MESSAGE_EVENTS, "response.completed"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THINKING
    assert final.output[0].content[0].text == THINKING and final.output_text == ANSWER


# ---- tools ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["smol", "smol-tools"])  # generic format / the template's own
def test_forced_function_call_and_its_output_round_trip(api, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = _create(api, model=model, input=ask, tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                max_output_tokens=64)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)

    def answer(result: str):
        return _create(api, model=model, tools=[TOOL], max_output_tokens=48, input=[
            *ask, call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id,
                                                       "output": result}])

    short, long = answer("22 degrees"), answer("22 degrees and sunny, a light wind from the west, no rain today")
    assert short.status in ("completed", "incomplete") and short.output
    assert long.usage.input_tokens > short.usage.input_tokens > r.usage.input_tokens  # the result is in the prompt

    kinds, events, final = _stream(api, model=model, input=ask, tools=[TOOL], tool_choice="required",
                                   max_output_tokens=64)
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    (streamed,) = final.output
    assert streamed.name == "get_weather" and streamed.arguments == call.arguments
    assert next(e for e in events if e.type == "response.function_call_arguments.done").arguments == call.arguments


def test_custom_tool_call_and_its_output(api):
    """A custom (freeform) tool, as Codex's apply_patch: called with its text as the one string ``input``
    (as Ollama maps it), answered as a ``custom_tool_call`` item, and its output read back."""
    shell = {"type": "custom", "name": "shell", "description": "Run a shell command"}
    ask = [{"role": "user", "content": "List the files in this directory."}]
    r = _create(api, input=ask, tools=[shell], tool_choice={"type": "custom", "name": "shell"}, max_output_tokens=48)
    (call,) = r.output
    assert call.type == "custom_tool_call" and call.name == "shell" and call.input and call.call_id.startswith("call_")
    kinds, events, final = _stream(api, input=ask, tools=[shell], tool_choice="required", max_output_tokens=48)
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
                     "response.output_item.done", "response.completed"]
    assert final.output[0].input == call.input
    after = _create(api, tools=[shell], max_output_tokens=16, input=[
        *ask, call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "README.md setup.py"}])
    assert after.usage.input_tokens > r.usage.input_tokens and after.output


def test_json_schema_output(api):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}
    r = _create(api, input="Name a city and its country as JSON.", text=fmt, max_output_tokens=48)
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "place"
    kinds, events, final = _stream(api, input="Name a city and its country as JSON.", text=fmt, max_output_tokens=48)
    assert final.output_text == r.output_text


# ---- errors ---------------------------------------------------------------------------------------
def test_errors_in_openais_shape(api):
    with pytest.raises(openai.NotFoundError) as e:
        _create(api, model="no-such-model", input="hi")
    assert e.value.body["code"] == "model_not_found" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        _stream(api, model="no-such-model", input="hi")
    for kw, words in (({}, "input is required"),
                      ({"input": "hi", "tools": ["web_search"]}, "tools.0: a tool must be an object"),
                      ({"input": [{"type": "message", "role": "robot", "content": "hi"}]}, "input.0.role: invalid role"),
                      ({"input": "hi", "text": {"format": {"type": "xml"}}}, "unsupported text.format type 'xml'"),
                      ({"input": "hi", "reasoning": {"effort": "high"}}, '"smol" does not support thinking')):
        with pytest.raises(openai.BadRequestError) as e:
            _create(api, **kw)
        assert words in e.value.body["message"] and e.value.body["type"] == "invalid_request_error", kw
    raw = httpx.post(api.url + "/v1/responses", content=b"{not json", timeout=60)
    assert raw.status_code == 400 and raw.json()["error"]["message"] == "request body is not valid JSON"


# ---- state ----------------------------------------------------------------------------------------
def test_store_previous_response_id_and_eviction(api):
    plain = _create(api, input=FRANCE)
    with pytest.raises(openai.NotFoundError):  # stateless by default, as Ollama's
        api.oai.responses.retrieve(plain.id)
    first = _create(api, input=FRANCE, store=True, metadata=PAD)
    assert first.output_text == PARIS and first.store
    got = api.oai.responses.retrieve(first.id)
    assert (got.id, got.output_text, got.usage) == (first.id, PARIS, first.usage)
    second = _create(api, input="And the capital of Italy?", previous_response_id=first.id, store=True, metadata=PAD)
    assert second.previous_response_id == first.id and second.output_text
    # the earlier turn is in the prompt, and the slot's own KV cache served its prompt: all of it but the last
    # token (evaluated alone, as a decode row) and at most 3 more (the reuse resumes on the 4-token chunk grid)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 4
    for call in (lambda: _create(api, input="And of Spain?", previous_response_id=first.id),  # evicted by second
                 lambda: api.oai.responses.retrieve(first.id),
                 lambda: _create(api, input="hi", previous_response_id="resp_never")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.status_code == 404 and e.value.body["code"] == "previous_response_not_found"
        assert "not found" in e.value.body["message"] and "OLLAPY_RESPONSES_STORE" in e.value.body["message"]
    third = _create(api, input="And of Spain?", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens
    api.oai.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        api.oai.responses.retrieve(second.id)
    kinds, events, streamed = _stream(api, input=FRANCE, store=True)  # a streamed response is stored too
    assert api.oai.responses.retrieve(streamed.id).output_text == PARIS == streamed.output_text


# ---- cached tokens on every OpenAI route ----------------------------------------------------------
def test_cached_tokens_on_a_repeated_system_prompt(api):
    """A ~1,200-token system prompt sent twice: the second request reports what the prompt cache served."""
    ask = "What is the capital of France?"
    runs = [_create(api, instructions=LONG_SYSTEM, input=ask, max_output_tokens=4) for _ in range(2)]
    assert runs[0].usage.input_tokens > 1150
    assert runs[1].usage.input_tokens_details.cached_tokens >= 1150
    with api.oai.responses.stream(model="smol", instructions=LONG_SYSTEM, input=ask, max_output_tokens=4, **GREEDY) as s:
        last = list(s)[-1]  # response.incomplete: cut at 4 tokens
    assert last.type == "response.incomplete" and last.response.usage.input_tokens_details.cached_tokens >= 1150

    prompt = LONG_SYSTEM + "\nQuestion: " + ask + "\nAnswer:"
    comp = [api.oai.completions.create(model="smol", prompt=prompt, max_tokens=4, **GREEDY) for _ in range(2)]
    assert comp[0].usage.prompt_tokens > 1150 and comp[1].usage.prompt_tokens_details.cached_tokens >= 1150
    chunks = list(api.oai.completions.create(model="smol", prompt=prompt, max_tokens=4, stream=True,
                                             stream_options={"include_usage": True}, **GREEDY))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens >= 1150

    msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": ask}]
    last = [list(api.oai.chat.completions.create(model="smol", messages=msgs, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))[-1] for _ in range(2)]
    assert last[0].usage.prompt_tokens > 1150 and last[1].usage.prompt_tokens_details.cached_tokens >= 1150
