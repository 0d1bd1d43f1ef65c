"""Smaller reliability items of a live server (SmolLM2): /metrics counts cancelled requests, a num_predict cut
inside a multibyte character prints no U+FFFD, and a missing draft file is named with what to do."""
from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from conftest import live_api


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    base = tmp_path_factory.mktemp("reliability")
    with live_api(base, smollm2_path, {"smol": {"parameters": {"temperature": 0}}}) as a:
        a.base = base
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


def test_a_num_predict_cut_inside_a_multibyte_character_prints_no_replacement_character(api):
    """Japanese text takes one to three byte-level tokens a character in SmolLM2's vocabulary: most num_predict
    values end inside a character. The answer then ends before the incomplete character (was: U+FFFD), streamed
    or not, and is a prefix of the longer answer."""
    prompt = "日本語のテキスト：日本語のテキスト：日本語の"

    def ask(n: int) -> str:
        return httpx.post(api.url + "/api/generate", json={"model": "smol", "prompt": prompt, "raw": True,
                                                           "stream": False, "options": {"num_predict": n}},
                          timeout=120).json()["response"]

    full = ask(24)
    assert len(full) < len(full.encode()), full  # the test's premise: the answer holds multibyte characters
    for n in range(1, 17):
        text = ask(n)
        assert "\ufffd" not in text and full.startswith(text), (n, text)
        with httpx.stream("POST", api.url + "/api/generate", json={"model": "smol", "prompt": prompt, "raw": True,
                                                                   "options": {"num_predict": n}}, timeout=120) as s:
            streamed = "".join(json.loads(line).get("response", "") for line in s.iter_lines() if line)
        assert streamed == text, (n, streamed, text)


def test_the_detokenizer_drops_an_unfinished_character_at_the_end():
    from ollapy.engine.text import Detokenizer

    d = Detokenizer()
    assert d.feed("日".encode()[:2]) == "" and d.flush() == ""
    assert d.feed(b"\xff") == "\ufffd"  # an invalid byte is still shown as one, where it is
    assert d.feed("本".encode()) == "本" and d.flush() == ""


def test_a_missing_draft_file_on_a_server_is_named_with_what_to_do(api, tmp_path, monkeypatch, smollm2_path):
    """A model created (by the CLI, on the server's machine) with DRAFT /path/draft.gguf whose file is gone:
    the server names the file (its name, not the server's path) and says what to do (was '<path>: no such file')."""
    from ollapy.store import create_model

    draft = tmp_path / "my-draft.gguf"
    draft.symlink_to(smollm2_path)
    monkeypatch.setenv("OLLAPY_MODELS", str(api.base / "models"))
    create_model("drafty", f"FROM {smollm2_path}\nDRAFT {draft}\n", tmp_path)
    draft.unlink()
    r = httpx.post(api.url + "/api/generate", json={"model": "drafty", "prompt": "hi", "stream": False}, timeout=120)
    msg = r.json()["error"]
    assert r.status_code == 404 and "my-draft.gguf" in msg and str(tmp_path) not in msg, msg
    assert "DRAFT" in msg and "ollapy create" in msg, msg
    r = httpx.post(api.url + "/v1/chat/completions", json={"model": "drafty", "messages": [{"role": "user",
                                                                                             "content": "hi"}]},
                   timeout=120)
    assert r.status_code == 404 and "my-draft.gguf" in r.json()["error"]["message"]
    r = httpx.post(api.url + "/api/generate", json={"model": "drafty", "prompt": "hi", "stream": False,
                                                    "options": {"draft": "", "num_predict": 2}}, timeout=120)
    assert r.status_code == 200, r.text  # what the message offers works
