"""Issue 55's tests on a real instruct model, Qwen2.5-Coder-0.5B-Instruct Q4_K_M (its own template, tools on).

* a tool call through each API's official client (``ollama``, ``openai`` chat and Responses, ``anthropic``),
  whole and streamed: the model writes its call as a fenced ``json`` block (see tests/test_hermes_calls.py for
  its recorded answers), which every API returns as a call, never as text;
* an agent's follow-up (the call sent back with its result) prefills only the tool-result turn, through each
  client, and answers as a cold request of its tokens (ollapy/chat/answer_memory.py);
* drafting (n-gram, and the model as its own draft) gives the tokens plain greedy decoding gives;
* a conversation restored from the disk cache by a new server process answers as a cold server does.

Skipped when the model file is not on disk (COMMON: /work/models, or the test-model cache).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from conftest import live_api, live_server
from test_speculation import _generate, _open

from ollapy.chat.toolcalls import parse_tool_calls

QWEN_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M: /work/models or the test-model cache; skip when neither has it."""
    for d in (Path("/work/models"), Path(os.path.expanduser("~/.cache/ollapy/test-models"))):
        if (d / QWEN_FILE).is_file():
            return d / QWEN_FILE
    pytest.skip(f"{QWEN_FILE} is not on disk")


PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city", "parameters": PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
CALL = ("", [("get_weather", {"city": "Paris"})])  # (content, calls) every API must give


@pytest.fixture(scope="module")
def api(tmp_path_factory, qwen_coder_path):
    import anthropic

    with live_api(tmp_path_factory.mktemp("qwen"), qwen_coder_path, {"qc": {}}) as api:
        api.ac = anthropic.Anthropic(base_url=api.url, api_key="none", max_retries=0)
        yield api


def _ollama(api, stream: bool):
    tools = [{"type": "function", "function": WEATHER}]
    r = api.oc.chat(model="qc", messages=ASK, tools=tools, stream=stream, options={"temperature": 0, "num_predict": 64})
    parts = list(r) if stream else [r]
    assert parts[-1].done_reason == "stop"
    calls = [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or ()]
    return "".join(p.message.content or "" for p in parts), calls


def _openai_chat(api, stream: bool):
    kw = dict(model="qc", messages=ASK, tools=[{"type": "function", "function": WEATHER}], temperature=0, max_tokens=64)
    if not stream:
        ch = api.oai.chat.completions.create(**kw).choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls[0].id.startswith("call_")
        return ch.message.content or "", [(c.function.name, json.loads(c.function.arguments))
                                          for c in ch.message.tool_calls]
    content, calls, finish = "", {}, []
    for chunk in api.oai.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            finish.append(ch.finish_reason)
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or ():
                c = calls.setdefault(d.index, ["", ""])
                c[0] += d.function.name or ""
                c[1] += d.function.arguments or ""
    assert finish[-1] == "tool_calls"
    return content, [(n, json.loads(a)) for n, a in calls.values()]


def _responses(api, stream: bool):
    kw = dict(model="qc", input=ASK, tools=[{"type": "function", **WEATHER}], temperature=0, max_output_tokens=64)
    if stream:
        events = list(api.oai.responses.create(stream=True, **kw))
        r = next(e.response for e in events if e.type == "response.completed")
    else:
        r = api.oai.responses.create(**kw)
    assert r.status == "completed"
    calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
    return r.output_text, calls


def _anthropic(api, stream: bool):
    kw = dict(model="qc", max_tokens=64, messages=ASK, extra_body={"temperature": 0},
              tools=[{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": PARAMS}])
    if stream:
        with api.ac.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = api.ac.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    text = "".join(b.text for b in m.content if b.type == "text")
    return text, [(b.name, b.input) for b in m.content if b.type == "tool_use"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("ask", [_ollama, _openai_chat, _responses, _anthropic],
                         ids=["api-chat", "v1-chat-completions", "v1-responses", "v1-messages"])
def test_the_real_template_s_tool_call_through_each_api(api, ask, stream):
    assert ask(api, stream) == CALL


# ---- an agent's follow-up prefills only the tool result -------------------------------------------
RESULT = "22 C and sunny"


def _token_counts(api) -> dict[str, float]:
    """The server's ``ollapy_tokens_total`` counters of model qc by kind (``prompt``: prefilled, ``cached``,
    ``generated``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(api.url + "/metrics", timeout=30).text
    return {s.labels["kind"]: s.value for f in text_string_to_metric_families(text) if f.name == "ollapy_tokens"
            for s in f.samples if s.name.endswith("_total") and s.labels.get("model", "").startswith("qc")}


def _ollama_step(api, messages: list, n: int):
    """One agent step through Ollama's client: (answer, the assistant turn and tool result to send back)."""
    r = api.oc.chat(model="qc", messages=messages, tools=[{"type": "function", "function": WEATHER}],
                    options={"temperature": 0, "num_predict": n})
    return r, [r.message, *({"role": "tool", "tool_name": c.function.name, "content": RESULT}
                            for c in r.message.tool_calls or ())]


def _openai_step(api, messages: list, n: int):
    r = api.oai.chat.completions.create(model="qc", messages=messages, tools=[{"type": "function", "function": WEATHER}],
                                        temperature=0, max_tokens=n)
    msg = r.choices[0].message
    return r, [msg.model_dump(exclude_none=True),
               *({"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in msg.tool_calls or ())]


def _responses_step(api, items: list, n: int):
    r = api.oai.responses.create(model="qc", input=items, tools=[{"type": "function", **WEATHER}], temperature=0,
                                 max_output_tokens=n)
    out = [o.model_dump(exclude_none=True) for o in r.output]
    return r, out + [{"type": "function_call_output", "call_id": o.call_id, "output": RESULT}
                     for o in r.output if o.type == "function_call"]


def _anthropic_step(api, messages: list, n: int):
    m = api.ac.messages.create(model="qc", max_tokens=n, messages=messages, extra_body={"temperature": 0},
                               tools=[{"name": WEATHER["name"], "description": WEATHER["description"],
                                       "input_schema": PARAMS}])
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": RESULT} for b in m.content if b.type == "tool_use"]
    return m, [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
               *([{"role": "user", "content": results}] if results else [])]


STEPS = {"api-chat": (_ollama_step, "Paris"), "v1-chat-completions": (_openai_step, "Rome"),
         "v1-responses": (_responses_step, "Oslo"), "v1-messages": (_anthropic_step, "Lima")}


@pytest.mark.parametrize("route", list(STEPS))
def test_an_agent_s_follow_up_prefills_only_the_tool_result(api, route):
    """The model writes its call as a fenced ``json`` block, the template would render it back as ``<tool_call>``
    tags: the follow-up's prompt must hold the model's own text (ollapy/chat/answer_memory.py), so the KV of the
    prompt and of the whole call is reused and only the tool-result turn is prefilled, whatever shape each
    client sends the call back in (a city of its own: no earlier request's KV holds this call)."""
    step, city = STEPS[route]
    ask = [{"role": "user", "content": f"What is the weather in {city}? Use the tool."}]
    before = _token_counts(api)
    _, back = step(api, ask, 48)
    assert len(back) == 2, back  # the answer was a call, and its result goes back
    mid = _token_counts(api)
    step(api, ask + back, 4)
    after = _token_counts(api)
    first = {k: mid[k] - before.get(k, 0) for k in mid}
    follow = {k: after[k] - mid[k] for k in after}
    written = first["prompt"] + first["cached"] + first["generated"] - 1  # the prompt and the call, not its end token
    assert follow["cached"] >= written, (first, follow)
    assert follow["prompt"] <= 24  # <|im_end|>, the user turn with its <tool_response> and result, the next header


def test_a_follow_up_answers_as_a_cold_request_of_its_tokens(api):
    """The remembered text changes the prompt, never the meaning of a prompt: the follow-up answers as a cold
    request of its own tokens (a reloaded model, no prompt cache) answers."""
    ask = [{"role": "user", "content": "What is the weather in Bern? Use the tool."}]
    _, back = _openai_step(api, ask, 48)
    warm, _ = _openai_step(api, ask + back, 8)
    assert warm.usage.prompt_tokens_details.cached_tokens >= warm.usage.prompt_tokens - 24
    text = httpx.post(api.url + "/apply-template", json={"model": "qc", "messages": ask + back,
                                                          "tools": [{"type": "function", "function": WEATHER}]},
                      timeout=60).json()["prompt"]
    assert "```json" in text and "<tool_call>" not in text.split("<|im_start|>assistant")[-2]  # the model's own text
    api.oc.generate(model="qc", keep_alive=0)  # unload: the next request starts on an empty context
    cold = httpx.post(api.url + "/api/generate", json={"model": "qc", "prompt": text, "raw": True, "stream": False,
                                                       "cache": False, "options": {"temperature": 0, "num_predict": 8}},
                      timeout=120).json()
    assert cold["prompt_eval_count"] == warm.usage.prompt_tokens and cold.get("prompt_cache_tokens", 0) == 0
    got = parse_tool_calls(cold["response"], "hermes", tool_names=["get_weather"])
    assert cold["eval_count"] == warm.usage.completion_tokens and got.content == warm.choices[0].message.content


# ---- drafting identical ---------------------------------------------------------------------------
CODE = "Write a Python function is_even(n) that returns True for even numbers."


def test_drafting_gives_the_tokens_plain_greedy_decoding_gives(qwen_coder_path):
    with _open(qwen_coder_path, qwen_coder_path, num_ctx=512, temperature=0, draft=str(qwen_coder_path)) as m:
        plain = _generate(m, CODE, raw=False, num_predict=24, draft="")
        by_model = _generate(m, CODE, raw=False, num_predict=24)
        by_ngram = _generate(m, CODE, raw=False, num_predict=24, draft="ngram")
    assert len(plain[1]) == 24 and "def is_even" in plain[0] + by_model[0]
    assert by_model[1] == plain[1] and by_model[2].draft == "model" and by_model[2].draft_accepted > 0
    assert by_ngram[1] == plain[1] and by_ngram[2].draft == "ngram" and by_ngram[2].draft_tokens > 0


# ---- a restored conversation answers as a cold one --------------------------------------------------
TURNS = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


def _chat(url: str, model: Path, messages: list[dict]) -> dict:
    body = {"model": str(model), "messages": messages, "stream": False, "options": {"temperature": 0, "num_predict": 24}}
    r = httpx.post(url + "/api/chat", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow  # three server processes
def test_a_conversation_restored_by_a_new_process_answers_as_a_cold_one(tmp_path, qwen_coder_path):
    with live_server(tmp_path, "--allow-paths") as url:
        first = _chat(url, qwen_coder_path, TURNS)
        second_turn = TURNS + [first["message"], {"role": "user", "content": "Now make it return the cube."}]
        warm = _chat(url, qwen_coder_path, second_turn)
    with live_server(tmp_path, "--allow-paths") as url:  # a new process on the same cache directory
        restored = _chat(url, qwen_coder_path, second_turn)
    with live_server(tmp_path / "cold", "--allow-paths", env={"OLLAPY_CACHE": "0"}) as url:
        cold = _chat(url, qwen_coder_path, second_turn)
    assert first.get("prompt_cache_tokens", 0) == 0 and cold.get("prompt_cache_tokens", 0) == 0
    assert warm["prompt_cache_tokens"] > first["prompt_eval_count"] // 2  # the first turn, from RAM
    assert restored["prompt_cache_tokens"] >= first["prompt_eval_count"]  # ...and from disk in the new process
    assert restored["message"]["content"] == warm["message"]["content"] == cold["message"]["content"]
