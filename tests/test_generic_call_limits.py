"""A generic-format answer (llama.cpp's, on a template without tools) against the output cap, through a live
``ollapy serve`` and the official ``openai`` SDK (and ``/api/chat``), on Gemma 3 270M base (no chat template).

Given a few tools and ``parallel_tool_calls`` on (what Codex 0.171 sends), this model writes a ``{"tool_calls":
[...]}`` array of calls until the cap cuts it (issue 39). The calls it completed come back as calls, the cut one
dropped, as llama.cpp's server does (its final parse after a length cut is a partial one); the answer still says
it was cut (``incomplete`` on ``/v1/responses``, ``length`` on ``/api/chat``). With ``parallel_tool_calls`` false
the grammar holds one call, and generation ends right after it.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from conftest import live_api

GREEDY = {"temperature": 0, "extra_body": {"options": {"repeat_penalty": 1.0}}}
GOAL = {"type": "object", "properties": {"status": {"type": "string", "enum": ["active", "paused", "blocked", "complete"],
                                                     "description": "The new status of the goal."}},
        "required": ["status"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
SCHEMAS = {"update_goal": GOAL, "get_weather": WEATHER}
TOOLS = [{"type": "function", "name": "update_goal", "description": "Update the status of the current goal.",
          "parameters": GOAL, "strict": True},
         {"type": "function", "name": "get_weather", "description": "Get the weather for a city.",
          "parameters": WEATHER, "strict": True}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k not in ("type", "strict")}}
              for t in TOOLS]
ASK = "Reply with one word: ready"
CAP = 96


@pytest.fixture(scope="module")
def api(tmp_path_factory, gemma_path):
    with live_api(tmp_path_factory.mktemp("generic-limits"), gemma_path, {"g": {"parameters": {"num_ctx": 2048}}}) as api:
        yield api


def _calls(items) -> list[tuple[str, dict]]:
    out = []
    for item in items:
        assert item.type == "function_call", item
        args = json.loads(item.arguments)
        jsonschema.validate(args, SCHEMAS[item.name])
        assert item.call_id.startswith("call_")
        out.append((item.name, args))
    return out


def test_a_cut_tool_calls_array_gives_the_calls_it_completed(api):
    """The cap cuts the array: every call the model completed is a ``function_call`` item (no text), the response
    is ``incomplete`` (``max_output_tokens``), streamed alike; the chat routes give the same calls (``/api/chat``
    with ``done_reason`` ``length``; ``/v1/chat/completions`` says ``tool_calls``, as Ollama's does whenever the
    answer made calls), and the next turn carries their outputs back (200)."""
    r = api.oai.responses.create(model="g", input=ASK, tools=TOOLS, max_output_tokens=CAP, **GREEDY)
    assert (r.status, r.incomplete_details.reason, r.usage.output_tokens) == ("incomplete", "max_output_tokens", CAP)
    calls = _calls(r.output)
    assert len(calls) >= 2 and r.output_text == ""  # several calls: an array, cut after its last complete call

    # (the SDK's responses.stream() helper waits for response.completed: the events as they come)
    events = list(api.oai.responses.create(model="g", input=ASK, tools=TOOLS, max_output_tokens=CAP, stream=True,
                                           **GREEDY))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.status == "incomplete"
    assert _calls(final.output) == calls
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert _calls(done) == calls and not any(e.type == "response.output_text.delta" for e in events)

    o = api.oai.chat.completions.create(model="g", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS,
                                        max_tokens=CAP, **GREEDY)
    msg = o.choices[0].message
    assert (o.choices[0].finish_reason, msg.content) == ("tool_calls", None)  # calls made: Ollama's /v1 reason
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == calls
    native = httpx.post(api.url + "/api/chat", timeout=120, json={
        "model": "g", "messages": [{"role": "user", "content": ASK}], "tools": CHAT_TOOLS, "stream": False,
        "options": {"temperature": 0, "repeat_penalty": 1.0, "num_predict": CAP}}).json()
    assert native["done_reason"] == "length"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in native["message"]["tool_calls"]] == calls

    # the agent runs the calls and sends their outputs back: the next request is a 200 like any other
    history = [{"role": "user", "content": ASK}] + [i.model_dump(exclude_none=True) for i in r.output]
    history += [{"type": "function_call_output", "call_id": i.call_id, "output": "ok"} for i in r.output]
    nxt = api.oai.responses.create(model="g", input=history, tools=TOOLS, max_output_tokens=CAP, **GREEDY)
    assert nxt.status in ("completed", "incomplete") and nxt.usage.input_tokens > r.usage.input_tokens


def test_parallel_tool_calls_false_ends_right_after_one_call(api):
    """``parallel_tool_calls: false``: the grammar holds one ``tool_call``, and the answer ends with it, well
    inside the cap (``completed``)."""
    r = api.oai.responses.create(model="g", input=ASK, tools=TOOLS, max_output_tokens=CAP, parallel_tool_calls=False,
                                 **GREEDY)
    assert r.status == "completed" and r.incomplete_details is None and r.output_text == ""
    assert len(_calls(r.output)) == 1 and r.usage.output_tokens < CAP // 2
    o = api.oai.chat.completions.create(model="g", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS,
                                        max_tokens=CAP, parallel_tool_calls=False, **GREEDY)
    assert o.choices[0].finish_reason == "tool_calls" and len(o.choices[0].message.tool_calls) == 1
    assert o.usage.completion_tokens == r.usage.output_tokens
