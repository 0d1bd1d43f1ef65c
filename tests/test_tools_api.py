"""Tool calling through a live ``ollapy serve`` and the official ``ollama`` and ``openai`` clients (SmolLM2).

Models: ``smol`` (SmolLM2's own template, no tool support: llama.cpp's generic tool-call format),
``smol-tools`` (a Hermes-style Jinja TEMPLATE with a tools section) and ``smol-json`` (the same template,
``PARAMETER tool_parser generic``).
Forced calls (``tool_choice`` required or a named function) are grammar-constrained, so the tiny model
makes valid calls; ``/api/chat`` takes ``tool_choice`` as an ollapy extension (sent with the ollama
client's request helper, which parses the answers with its own types).
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from conftest import live_api

HERMES = """{%- if tools %}<|im_start|>system
You are a function calling AI model. You may call one or more functions. Function signatures are in <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each function call return a JSON object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 64}


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    models = {"smol": {}, "smol-tools": {"template": HERMES},
              "smol-json": {"template": HERMES, "parameters": {"tool_parser": "generic"}},
              "smol-mistral": {"template": HERMES, "parameters": {"tool_parser": "mistral"}}}
    with live_api(tmp_path_factory.mktemp("tools"), smollm2_path, models) as api:
        yield api


def _oai_chat(api, **kw):
    kw = {"max_tokens": 64, **kw}
    return api.oai.chat.completions.create(temperature=0, extra_body={"options": {"repeat_penalty": 1.0}}, **kw)


def _ollama_chat(api, stream: bool = False, **body):
    import ollama

    body = {"stream": stream, "options": GREEDY, **body}
    return api.oc._request(ollama.ChatResponse, "POST", "/api/chat", json=body, stream=stream)


def _check_oai_call(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS and (name is None or call.function.name == name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


# ---- forced calls work on any model ---------------------------------------------------------------
@pytest.mark.parametrize("choice, name", [({"type": "function", "function": {"name": "get_time"}}, "get_time"),
                                          ("required", None)])
def test_forced_call_through_openai_client(api, choice, name):
    r = _oai_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    assert len(ch.message.tool_calls) == 1
    _check_oai_call(ch.message.tool_calls[0], name)


@pytest.mark.parametrize("choice, name", [({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
                                          ("required", None)])
def test_forced_call_through_ollama_client(api, choice, name):
    r = _ollama_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice)
    assert r.done and r.done_reason == "stop" and r.message.content == ""
    (call,) = r.message.tool_calls
    assert call.function.name in SCHEMAS and (name is None or call.function.name == name)
    jsonschema.validate(dict(call.function.arguments), SCHEMAS[call.function.name])


def test_forced_call_streams_openai_deltas(api):
    stream = _oai_chat(api, model="smol-tools", messages=ASK, tools=TOOLS, tool_choice="required", stream=True)
    calls: dict[int, dict] = {}
    finish = []
    for chunk in stream:
        for ch in chunk.choices:
            finish.append(ch.finish_reason)
            for d in ch.delta.tool_calls or ():
                c = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = d.id or c["id"]
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
                assert d.type in (None, "function")
    assert finish[-1] == "tool_calls" and all(f is None for f in finish[:-1])
    assert list(calls) == [0]
    c = calls[0]
    assert c["id"].startswith("call_") and c["name"] in SCHEMAS
    jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_forced_call_streams_ollama_chunks(api):
    parts = list(_ollama_chat(api, stream=True, model="smol-tools", messages=ASK, tools=TOOLS,
                              tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert parts[-1].done and parts[-1].done_reason == "stop" and not any(p.done for p in parts[:-1])
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    assert [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(dict(calls[0].function.arguments), WEATHER)
    assert "".join(p.message.content for p in parts) == ""  # the call's JSON is not content


# ---- a full round trip ----------------------------------------------------------------------------
def test_tool_round_trip(api):
    r = _oai_chat(api, model="smol-tools", messages=ASK, tools=TOOLS, tool_choice="required")
    call = r.choices[0].message.tool_calls[0]
    args = _check_oai_call(call)

    def answer(result: str):
        history = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": result}]
        return _oai_chat(api, model="smol-tools", messages=history, tools=TOOLS)

    short, long = answer("22 degrees"), answer("22 degrees and sunny, a light wind from the west, no rain today")
    for a in (short, long):  # an answer in text (it may run to max_tokens), not another call
        assert a.choices[0].finish_reason != "tool_calls" and not a.choices[0].message.tool_calls
        assert a.choices[0].message.content
    assert long.usage.prompt_tokens > short.usage.prompt_tokens  # the tool's result is in the prompt
    # the same history in Ollama's shapes (arguments as an object, tool_name) renders the same prompt
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": call.function.name,
                                                                                       "arguments": args}}]},
                     {"role": "tool", "tool_name": call.function.name, "content": "22 degrees"}]
    o = api.oc.chat(model="smol-tools", messages=history, tools=TOOLS, options=GREEDY)
    assert o.done_reason == "stop" and o.message.content and not o.message.tool_calls
    # (the ollama client re-serialises the tools' schemas in its own key order: compare with TOOLS as sent)
    raw = httpx.post(api.url + "/api/chat", json={"model": "smol-tools", "messages": history, "tools": TOOLS,
                                                  "stream": False, "options": GREEDY}, timeout=120).json()
    assert raw["prompt_eval_count"] == short.usage.prompt_tokens


# ---- capabilities and malformed output ------------------------------------------------------------
def test_auto_tools_on_a_template_without_tools_use_the_generic_format(api):
    """``smol``'s template has no tools: where Ollama answers 400 "does not support tools", the tools go in the
    system prompt in llama.cpp's generic format and the answer is a call or a response (200) on every route,
    whole and streamed alike."""
    plain = httpx.post(api.url + "/api/chat", json={"model": "smol", "messages": ASK, "stream": False,
                                                    "options": GREEDY}, timeout=120).json()
    # the ollama client re-serialises the tools' schemas in its own key order (another prompt): it answers too
    client = api.oc.chat(model="smol", messages=ASK, tools=TOOLS, options=GREEDY)
    assert (client.done_reason, client.message.tool_calls) == ("length", None) and client.message.content
    r = _ollama_chat(api, model="smol", messages=ASK, tools=TOOLS)  # the tools as sent, as every route below
    assert r.prompt_eval_count > plain["prompt_eval_count"] + 100  # the tools are described in the prompt
    # SmolLM2 answers this one with {"response": "..."}, streamed as content and cut by num_predict
    assert (r.done_reason, r.message.tool_calls) == ("length", None)
    assert r.message.content.startswith("Paris, France")  # the answer, as text (its wording varies by CPU kernels)
    streamed = list(_ollama_chat(api, stream=True, model="smol", messages=ASK, tools=TOOLS))
    assert "".join(p.message.content for p in streamed) == r.message.content
    assert sum(1 for p in streamed if p.message.content) > 10 and not any(p.message.tool_calls for p in streamed)

    o = _oai_chat(api, model="smol", messages=ASK, tools=TOOLS)
    assert (o.choices[0].finish_reason, o.choices[0].message.content) == ("length", r.message.content)
    assert o.usage.prompt_tokens == r.prompt_eval_count
    resp = api.oai.responses.create(model="smol", input=ASK, temperature=0, max_output_tokens=64,
                                    extra_body={"options": {"repeat_penalty": 1.0}},
                                    tools=[{"type": "function", "strict": True, **t["function"]} for t in TOOLS])
    assert (resp.status, resp.output_text, resp.usage.input_tokens) == ("incomplete", r.message.content,
                                                                        r.prompt_eval_count)

    none = _oai_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice="none")  # rendered without tools
    assert none.choices[0].message.content and not none.choices[0].message.tool_calls
    assert none.usage.prompt_tokens == plain["prompt_eval_count"]


@pytest.mark.parametrize("route", ["api", "v1"])
def test_generic_forced_call_round_trip(api, route):
    """A forced call on ``smol`` (generic format), then its result: the history is written as text for the
    template (no tool role) and the answer completes."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    if route == "v1":
        r = _oai_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice)
        (call,) = r.choices[0].message.tool_calls
        args = _check_oai_call(call, "get_weather")
        history = ASK + [r.choices[0].message.model_dump(exclude_none=True)]
        tool = {"role": "tool", "tool_call_id": call.id}
    else:
        r = _ollama_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice)
        (call,) = r.message.tool_calls
        args = dict(call.function.arguments)
        jsonschema.validate(args, WEATHER)
        history = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                           "arguments": args}}]}]
        tool = {"role": "tool", "tool_name": "get_weather"}
    sizes = []
    for result in ("22 degrees", "22 degrees and sunny, a light wind from the west, no rain today"):
        body = {"model": "smol", "messages": history + [{**tool, "content": result}], "tools": TOOLS, "stream": False}
        if route == "v1":
            a = httpx.post(api.url + "/v1/chat/completions", json={**body, "temperature": 0, "max_tokens": 64},
                           timeout=120)
            assert a.status_code == 200 and a.json()["choices"][0]["finish_reason"] in ("stop", "tool_calls", "length")
            sizes.append(a.json()["usage"]["prompt_tokens"])
        else:
            a = httpx.post(api.url + "/api/chat", json={**body, "options": GREEDY}, timeout=120)
            assert a.status_code == 200 and a.json()["done"]
            sizes.append(a.json()["prompt_eval_count"])
    assert sizes[1] > sizes[0]  # the tool's result is in the prompt


def test_generic_answer_that_does_not_parse_stays_content(api):
    """Cut short by the token limit, a forced generic call is not a call: its text comes back as content."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    o = _oai_chat(api, model="smol", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=4)
    msg = o.choices[0].message
    assert (o.choices[0].finish_reason, msg.tool_calls, msg.content) == ("length", None, '{ "tool_')
    r = httpx.post(api.url + "/api/chat", json={"model": "smol", "messages": ASK, "tools": TOOLS, "tool_choice": choice,
                                                "stream": False, "options": {**GREEDY, "num_predict": 4}}, timeout=120)
    assert r.json()["message"]["content"] == msg.content and "tool_calls" not in r.json()["message"]
    resp = api.oai.responses.create(model="smol", input=ASK, max_output_tokens=4, temperature=0,
                                    tools=[{"type": "function", "strict": True, **TOOLS[0]["function"]}],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    extra_body={"options": {"repeat_penalty": 1.0}})
    assert resp.status == "incomplete" and resp.output_text == msg.content


def test_malformed_call_comes_back_as_content(api):
    """``tool_parser generic`` reads a leading ``{`` as a call; cut short, it is not one: content, 200."""
    body = {"model": "smol-json", "messages": ASK, "tools": TOOLS, "format": "json", "stream": False,
            "options": {**GREEDY, "num_predict": 6}}
    r = httpx.post(api.url + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200
    msg = r.json()["message"]
    assert msg["content"].lstrip().startswith("{") and "tool_calls" not in msg
    with pytest.raises(ValueError):
        json.loads(msg["content"])
    streamed = [json.loads(line) for line in httpx.post(api.url + "/api/chat", json={**body, "stream": True},
                                                        timeout=120).text.splitlines()]
    assert "".join(p["message"]["content"] for p in streamed) == msg["content"]
    assert streamed[-1]["done"] and not any("tool_calls" in p["message"] for p in streamed)


def test_unknown_named_function_is_400(api):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        _oai_chat(api, model="smol", messages=ASK, tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "'nope', which is not in tools" in e.value.body["message"]


# ---- rendering (no model) -------------------------------------------------------------------------
STRINGY = ("{% for m in messages %}{% for tc in m.tool_calls or [] %}"
           "[{{ tc.function.name }} {{ tc.function.arguments is string }} "
           "{{ '' + tc.function.arguments }} {{ tc.function.arguments | tojson }} "
           "{% for k, v in tc.function.arguments.items() %}{{ k }}={{ v }}{% endfor %}]{% endfor %}"
           "{% if m.role == 'tool' %}<{{ m.name }}:{{ m.content }}>{% endif %}{% endfor %}")


def test_history_arguments_render_as_dict_and_as_string():
    from ollapy.engine.backend.templating import render_chat_template
    from ollapy.server.bodies import read_history

    openai_shape = read_history([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    ollama_shape = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                    {"role": "tool", "tool_name": "f", "content": "ok"}]
    want = '[f False {"a": 1} {"a": 1} a=1]<f:ok>'
    assert render_chat_template(STRINGY, openai_shape, "", "", False) == want
    assert render_chat_template(STRINGY, ollama_shape, "", "", False) == want


def test_modelfile_tool_parser_decides_the_family(api):
    """Output that is a bare JSON call (made so by ``format``) is a call for ``tool_parser generic`` (smol-json)
    and for the template's own hermes format (smol-tools: a bare call object, as llama.cpp's Hermes 2 Pro parser
    reads it), and content for ``tool_parser mistral`` (smol-mistral), which needs ``[TOOL_CALLS]``."""
    from ollapy.chat.reply import forced_call_schema

    body = {"messages": ASK, "tools": TOOLS, "format": forced_call_schema(TOOLS, "get_weather"), "stream": False,
            "options": GREEDY}
    for model in ("smol-json", "smol-tools"):
        msg = httpx.post(api.url + "/api/chat", json={"model": model, **body}, timeout=120).json()["message"]
        (call,) = msg["tool_calls"]
        assert call["function"]["name"] == "get_weather" and msg["content"] == "", model
        jsonschema.validate(call["function"]["arguments"], WEATHER)
    mistral = httpx.post(api.url + "/api/chat", json={"model": "smol-mistral", **body}, timeout=120).json()["message"]
    assert "tool_calls" not in mistral and json.loads(mistral["content"])["name"] == "get_weather"


def test_modelfile_tool_parser_parameter_is_checked():
    from ollapy.errors import UsageError
    from ollapy.store.modelfile import parse_modelfile

    assert parse_modelfile("FROM x.gguf\nPARAMETER tool_parser Mistral\n").parameters == {"tool_parser": "mistral"}
    with pytest.raises(UsageError, match="tool_parser must be one of auto, hermes, llama3, mistral, generic"):
        parse_modelfile("FROM x.gguf\nPARAMETER tool_parser xml\n")


def test_auto_calls_stream_through_both_clients(api):
    """``tool_choice`` auto (nothing forced): the model's own output, made a bare JSON call here by ``format`` /
    ``response_format``, is parsed while it streams (smol-json's generic family) into Ollama chunks and OpenAI
    deltas."""
    from ollapy.chat.reply import forced_call_schema

    schema = forced_call_schema(TOOLS, "get_weather")
    chunks = list(_ollama_chat(api, stream=True, model="smol-json", messages=ASK, tools=TOOLS, format=schema))
    calls = [c for ch in chunks for c in (ch.message.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    jsonschema.validate(dict(calls[0].function.arguments), WEATHER)
    assert chunks[-1].done and chunks[-1].done_reason == "stop" and "".join(c.message.content for c in chunks) == ""
    stream = api.oai.chat.completions.create(
        model="smol-json", messages=ASK, tools=TOOLS, stream=True, temperature=0, max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": schema}},
        extra_body={"options": {"repeat_penalty": 1.0}})
    parts = list(stream)
    deltas = [tc for p in parts if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    jsonschema.validate(args, WEATHER)
    assert [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason] == ["tool_calls"]
