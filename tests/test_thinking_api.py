"""Thinking (``think``, ``reasoning_effort``) through a live ``ollapy serve`` and the official clients (SmolLM2).

``smol`` has SmolLM2's own template (no reasoning section): ``think`` true is refused, false ignored.
``smol-think`` (tests/think_models.py) has a DeepSeek-R1-style TEMPLATE whose generation prompt opens
``<think>``, and one MESSAGE example (a question answered with ``<think>…</think>answer``), so the greedy
answer reasons, closes the section and answers: the split is known exactly.
"""
from __future__ import annotations

import httpx
import pytest
from conftest import live_api
from think_models import ANSWER, EXAMPLE, GREEDY, THINK_TEMPLATE, THINKING, Q

ASK = [{"role": "user", "content": Q}]


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    models = {"smol": {}, "smol-think": {"template": THINK_TEMPLATE, "messages": EXAMPLE}}
    with live_api(tmp_path_factory.mktemp("think"), smollm2_path, models) as api:
        yield api


def _oai(api, **kw):
    return api.oai.chat.completions.create(model="smol-think", messages=ASK, temperature=0, max_tokens=40,
                                           extra_body={"options": {"repeat_penalty": 1.0}, **kw.pop("extra", {})}, **kw)


def test_think_refused_on_a_model_without_reasoning(api):
    import ollama
    import openai

    for call in (lambda: api.oc.chat(model="smol", messages=ASK, think=True),
                 lambda: api.oc.generate(model="smol", prompt=Q, think="high")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 400 and e.value.error == '"smol" does not support thinking'
    with pytest.raises(openai.BadRequestError) as e2:
        api.oai.chat.completions.create(model="smol", messages=ASK, reasoning_effort="high")
    assert e2.value.status_code == 400 and "does not support thinking" in e2.value.body["message"]
    r = api.oc.chat(model="smol", messages=ASK, think=False, options=GREEDY)  # false: accepted and ignored
    assert r.done_reason in ("stop", "length") and r.message.content and not r.message.thinking


def test_ollama_chat_splits_thinking_whole_and_streamed(api):
    for think in (None, True, "low"):  # unset means on for a thinking model, as in Ollama
        r = api.oc.chat(model="smol-think", messages=ASK, think=think, options=GREEDY)
        assert (r.message.thinking, r.message.content, r.done_reason) == (THINKING, ANSWER, "stop")
    parts = list(api.oc.chat(model="smol-think", messages=ASK, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == THINKING
    assert "".join(p.message.content for p in parts) == ANSWER
    assert not any(p.message.thinking and p.message.content for p in parts)
    assert sum(1 for p in parts if p.message.thinking) > 1  # reasoning streams as it comes
    # think false: the template still opens <think>; the reasoning is dropped, the answer stays
    r = api.oc.chat(model="smol-think", messages=ASK, think=False, options=GREEDY)
    assert (r.message.thinking, r.message.content) == (None, ANSWER)


def test_ollama_generate_splits_thinking(api):
    r = api.oc.generate(model="smol-think", prompt=Q, think=True, options=GREEDY)
    assert (r.thinking, r.response) == (THINKING, ANSWER)
    parts = list(api.oc.generate(model="smol-think", prompt=Q, options=GREEDY, stream=True))
    assert "".join(p.thinking or "" for p in parts) == THINKING and "".join(p.response for p in parts) == ANSWER


def test_openai_reasoning_content_whole_and_streamed(api):
    r = _oai(api)
    msg = r.choices[0].message
    assert (msg.model_extra["reasoning_content"], msg.content, r.choices[0].finish_reason) == (THINKING, ANSWER, "stop")
    assert msg.model_extra["reasoning"] == THINKING  # Ollama's /v1 name, beside llama.cpp's and vLLM's
    assert _oai(api, reasoning_effort="medium").choices[0].message.model_extra["reasoning_content"] == THINKING
    off = _oai(api, reasoning_effort="none").choices[0].message  # Ollama's /v1: "none" turns thinking off
    assert off.content == ANSWER and not {"reasoning", "reasoning_content"} & set(off.model_extra or {})
    reasoning, ollama_named, content = [], [], []
    for chunk in _oai(api, stream=True):
        for ch in chunk.choices:
            reasoning.append((ch.delta.model_extra or {}).get("reasoning_content") or "")
            ollama_named.append((ch.delta.model_extra or {}).get("reasoning") or "")
            content.append(ch.delta.content or "")
    assert ("".join(reasoning), "".join(ollama_named), "".join(content)) == (THINKING, THINKING, ANSWER)


def test_split_matches_the_raw_output(api):
    """The split is of the model's own text: the same prompt generated raw gives reasoning, </think>, answer."""
    prompt = ("<|im_start|>user\nWhat is the capital of Italy?<|im_end|>\n<|im_start|>assistant\n"
              "<think>\nThe user asks for the capital of Italy. It is Rome.\n</think>\nRome<|im_end|>\n"
              f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    raw = httpx.post(api.url + "/api/generate", json={"model": "smol-think", "prompt": prompt, "raw": True,
                                                      "think": False, "stream": False, "options": GREEDY},
                     timeout=120).json()
    assert raw["response"] == f"{THINKING}\n</think>\n{ANSWER}"


def test_template_thinking_switches():
    """Qwen3-style templates read ``enable_thinking``: false closes an empty section in the prompt."""
    from ollapy.engine.backend.templating import render_chat_template
    from ollapy.engine.model import LoadedModel

    qwen = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% endif %}")
    def render(think):
        return render_chat_template(qwen, ASK, "", "", variables=LoadedModel.template_variables(think))

    assert render(False).endswith("<think>\n\n</think>\n\n")
    assert render(True).endswith("assistant\n") and render(None) == render(True) == render("high")
    assert LoadedModel.template_variables("high") == {"enable_thinking": True, "think": True, "reasoning_effort": "high"}


def test_reply_parser_same_split_for_any_cut():
    """ReplyParser (thinking, then hermes calls) gives the whole-text result however the text is cut."""
    from ollapy.chat.reply import ReplyParser

    text = ('<think>\nweigh it </thi up</think>\nSure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
            " <tool_call>{bad</tool_call> done")

    def parser():
        return ReplyParser(think=True, family="hermes", tool_names=["f"], ids=True, seed=7)

    whole = parser().parse(text)
    assert whole.thinking == "weigh it </thi up"
    assert whole.content == "Sure. <tool_call>{bad</tool_call> done"  # the blank after a call is dropped
    assert [(c.name, c.arguments) for c in whole.calls] == [("f", {"a": 1})] and whole.calls[0].id.startswith("call_")
    for cut in range(len(text) + 1):
        p = parser()
        assert p.feed(text[:cut]) + p.feed(text[cut:]) + p.finish() == whole, cut
    hidden = ReplyParser(think=False, opened=True).parse("reasoning\n</think>\nanswer")
    assert (hidden.thinking, hidden.content) == ("", "answer")
