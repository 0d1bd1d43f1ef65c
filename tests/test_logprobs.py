"""Log-probabilities through the live server: OpenAI chat (``logprobs``/``top_logprobs``), legacy completions
(``logprobs: n``) and Ollama's generate/chat (``logprobs``/``top_logprobs``), with the official clients.

Greedy decoding without a repeat penalty picks the most likely token, so every chosen token must be its
own first alternative; log-probabilities are <= 0 and the alternatives' probabilities sum to at most 1."""
from __future__ import annotations

import math

import httpx
import pytest
from conftest import live_server

Q = "What is the capital of France? Answer in one word."


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with live_server(tmp_path_factory.mktemp("serve"), "--allow-paths") as u:
        yield u


def _check(entries, text: str, top: int, with_bytes: bool = True) -> None:
    """``with_bytes``: the client's model keeps the ``bytes`` field (the ollama package's drops it)."""
    assert entries and "".join(e["token"] for e in entries) == text
    for e in entries:
        assert e["logprob"] <= 0
        if with_bytes:
            assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        alts = e["top_logprobs"]
        assert len(alts) == top
        assert [a["logprob"] for a in alts] == sorted((a["logprob"] for a in alts), reverse=True)
        assert sum(math.exp(a["logprob"]) for a in alts) <= 1.0 + 1e-6
        assert alts[0]["token"] == e["token"] and abs(alts[0]["logprob"] - e["logprob"]) < 1e-6  # greedy


def test_openai_chat_logprobs(url, smollm2_path):
    import openai

    c = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    kw = dict(model=str(smollm2_path), messages=[{"role": "user", "content": Q}], temperature=0, max_tokens=12,
              extra_body={"options": {"repeat_penalty": 1.0}})
    r = c.chat.completions.create(logprobs=True, top_logprobs=3, **kw)
    text = r.choices[0].message.content
    _check([x.model_dump() for x in r.choices[0].logprobs.content], text, 3)
    assert c.chat.completions.create(**kw).choices[0].logprobs is None  # not asked: none computed
    chunks = list(c.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **kw))
    streamed = [x.model_dump() for ch in chunks if ch.choices and ch.choices[0].logprobs
                for x in ch.choices[0].logprobs.content]
    _check(streamed, text, 2)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(logprobs=True, top_logprobs=21, **kw)
    legacy = c.completions.create(model=str(smollm2_path), prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=2, extra_body={"options": {"repeat_penalty": 1.0}})
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(max(d, key=d.get) == t for d, t in zip(lp.top_logprobs, lp.tokens))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


def test_ollama_generate_and_chat_logprobs(url, smollm2_path):
    import ollama

    c = ollama.Client(host=url)
    opts = {"temperature": 0, "num_predict": 12, "repeat_penalty": 1.0}
    r = c.chat(model=str(smollm2_path), messages=[{"role": "user", "content": Q}], options=opts, logprobs=True,
               top_logprobs=2)
    _check([x.model_dump() for x in r.logprobs], r.message.content, 2, with_bytes=False)
    raw = httpx.post(url + "/api/chat", json={"model": str(smollm2_path), "messages": [{"role": "user", "content": Q}],
                                              "options": opts, "logprobs": True, "top_logprobs": 2, "stream": False},
                     timeout=120).json()
    _check(raw["logprobs"], raw["message"]["content"], 2)
    parts = list(c.generate(model=str(smollm2_path), prompt=Q, options=opts, logprobs=True, top_logprobs=1,
                            stream=True))
    _check([x.model_dump() for p in parts for x in (p.logprobs or [])], "".join(p.response for p in parts), 1,
           with_bytes=False)
    plain = c.generate(model=str(smollm2_path), prompt=Q, options=opts)
    assert not plain.logprobs
