"""A streamed SSE answer sends comment lines through a silence (a long prefill), so Bun-based agents (Cline, Kilo,
Claude Code: Bun's fetch drops a response silent for 300 s) keep the connection; the official clients skip them
and read the same answer. SmolLM2 in process, the silence bound (KEEPALIVE_S) lowered to 1 ms."""
from __future__ import annotations

import pytest

Q = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture
def client(smollm2_path, tmp_path, monkeypatch):
    """The real app in process with `smol` (SmolLM2, greedy, 12 tokens per answer) in the test's store."""
    from fastapi.testclient import TestClient

    from ollapy.server import http
    from ollapy.server.app import create_app
    from ollapy.store import create_model

    monkeypatch.setenv("OLLAPY_CONTEXT_LENGTH", "512")
    monkeypatch.setattr(http, "KEEPALIVE_S", 0.001)  # every wait for the engine over 1 ms sends one
    create_model("smol", f"FROM {smollm2_path}\nPARAMETER num_predict 12\nPARAMETER temperature 0\n", tmp_path)
    with TestClient(create_app(), base_url="http://127.0.0.1") as c:
        yield c


def test_a_silent_stream_sends_comments_that_the_official_clients_skip(client):
    import anthropic
    import openai

    from ollapy.server.http import KEEPALIVE

    raw = client.post("/v1/chat/completions", json={"model": "smol", "messages": Q, "stream": True}).content
    assert raw.count(KEEPALIVE) >= 1 and raw.endswith(b"data: [DONE]\n\n"), raw[:300]
    assert all(p.startswith((b"data: ", b": keepalive")) for p in raw.split(b"\n\n") if p), raw[:300]

    oai = openai.OpenAI(base_url="http://127.0.0.1/v1", api_key="x", http_client=client)
    whole = oai.chat.completions.create(model="smol", messages=Q).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       oai.chat.completions.create(model="smol", messages=Q, stream=True) if c.choices)
    assert whole and streamed == whole

    ant = anthropic.Anthropic(base_url="http://127.0.0.1", api_key="x", http_client=client)
    raw = client.post("/v1/messages", json={"model": "smol", "max_tokens": 12, "messages": Q, "stream": True}).content
    assert KEEPALIVE in raw, raw[:300]
    with ant.messages.stream(model="smol", max_tokens=12, messages=Q) as s:
        assert s.get_final_message().content[0].text == whole
