"""Smaller reliability items of a live server (SmolLM2): /metrics counts cancelled requests, a num_predict cut
inside a multibyte character prints no U+FFFD, and a missing draft file is named with what to do."""
from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import live_api


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    base = tmp_path_factory.mktemp("reliability")
    with live_api(base, smollm2_path, {"smol": {"parameters": {"temperature": 0}}}) as a:
        yield a


def _metric(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _cancel_stream(url: str, path: str, body: dict) -> None:
    with httpx.Client(timeout=120) as c, c.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            break  # one line of the answer, then the client goes away


@pytest.mark.parametrize("path, body", [
    ("/api/generate", {"model": "smol", "prompt": "Count from 1 to 200.", "options": {"num_predict": 400}}),
    ("/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "Count to 200."}],
                              "max_tokens": 400, "stream": True}),
])
def test_metrics_count_cancelled_requests(api, path, body):
    route = {"/api/generate": "generate"}.get(path, path.strip("/"))  # the counter's route label
    before = _metric(api.url, "ollapy_requests_total", route=route, status="cancelled")
    gen_before = _metric(api.url, "ollapy_tokens_total", model="smol:latest", kind="generated")
    ttft_before = _metric(api.url, "ollapy_time_to_first_token_seconds_count", model="smol:latest")
    _cancel_stream(api.url, path, body)
    deadline = time.monotonic() + 60
    while _metric(api.url, "ollapy_requests_total", route=route, status="cancelled") < before + 1:
        assert time.monotonic() < deadline, "the cancelled request was never counted"
        time.sleep(0.2)
    # what it did before it was cancelled counts too: its first token's time and the tokens it generated
    assert _metric(api.url, "ollapy_time_to_first_token_seconds_count", model="smol:latest") == ttft_before + 1
    assert _metric(api.url, "ollapy_tokens_total", model="smol:latest", kind="generated") >= gen_before + 1
