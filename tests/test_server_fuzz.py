"""Property tests: random and malformed requests to every route of the real app (in process, SmolLM2 loaded).

Bodies are random JSON (wrong types, huge and negative numbers, NaN, deep nesting), invalid UTF-8, empty, or
shaped like each API's requests with random values. Every answer must be a 2xx/4xx in the caller's error
format (or a documented 502/503), never a 500, never a traceback, and the server must keep answering.
"""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ollapy.options import LOAD_OPTIONS, Options

DOCUMENTED_5XX = {502, 503}
FIELDS = ["model", "prompt", "messages", "stream", "options", "format", "input", "keep_alive", "think", "tools",
          "raw", "system", "template", "context", "images", "suffix", "max_tokens", "max_completion_tokens",
          "temperature", "n", "stop", "logprobs", "top_logprobs", "response_format", "tool_choice", "name", "source",
          "destination", "from", "files", "parameters", "modelfile", "insecure", "encoding_format", "dimensions",
          "truncate", "seed", "top_p", "presence_penalty", "frequency_penalty", "stream_options", "reasoning_effort",
          "cache", "max_output_tokens", "instructions", "tool_choice", "parallel_tool_calls", "user"]
MODELS = st.sampled_from(["smol", "smol:latest", "nope", "", "../../etc/passwd", "hf.co/x/y", "smol@sha256:00"])
# small numbers (a model may really load with them) or far out of any range; no mid-range ones, which would
# only make the test slow (a 10**6-token context is a valid request, just not a quick one)
INTS = st.integers(-4, 24) | st.integers(2**31, 2**80) | st.integers(-(2**80), -(2**31))
SCALARS = st.none() | st.booleans() | INTS | st.floats(allow_infinity=True, allow_nan=True) | st.text(max_size=12)
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                     max_size=3), max_leaves=8)
REQUEST_OPTIONS = sorted(set(Options.names()) - set(LOAD_OPTIONS))
BAD_LOAD = (st.integers(2**23 + 1, 2**80) | st.integers(-(2**80), -(2**31) - 1) | st.text(max_size=6)
            | st.floats(allow_nan=True).filter(lambda f: not f.is_integer()) | st.lists(st.integers(), max_size=2))
OPTIONS = st.dictionaries(st.sampled_from(REQUEST_OPTIONS + ["tfs_z", "numa", "bogus"]), JSON, max_size=4) | \
    st.dictionaries(st.sampled_from(LOAD_OPTIONS), BAD_LOAD, max_size=2)
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"]) | JSON,
    "content": st.text(max_size=20) | JSON, "tool_calls": JSON, "images": JSON})
SHAPED = st.fixed_dictionaries({"model": MODELS | JSON}, optional={
    **{f: JSON for f in FIELDS if f not in ("model", "options", "messages")},
    "options": OPTIONS | JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON, "input": st.text(max_size=20) | JSON,
    "prompt": st.text(max_size=20), "stream": st.booleans()})


CHAT = [{"role": "user", "content": "Hi"}]
VALID = {  # a request each route answers with 200, which the "mutated" bodies change in one or two places
    "/api/chat": {"model": "smol", "messages": CHAT, "stream": False},
    "/api/generate": {"model": "smol", "prompt": "Hi", "stream": False},
    "/api/embed": {"model": "smol", "input": "Hi"}, "/api/embeddings": {"model": "smol", "prompt": "Hi"},
    "/v1/chat/completions": {"model": "smol", "messages": CHAT, "max_tokens": 4},
    "/v1/completions": {"model": "smol", "prompt": "Hi", "max_tokens": 4},
    "/v1/embeddings": {"model": "smol", "input": "Hi"}, "/api/show": {"model": "smol"},
    "/api/copy": {"source": "smol", "destination": "smol2"}, "/api/create": {"model": "smol3", "from": "smol"},
    "/api/delete": {"model": "smol2"}, "/api/pull": {"model": "nope", "stream": False},
    "/v1/messages": {"model": "smol", "max_tokens": 4, "messages": CHAT},
    "/v1/responses": {"model": "smol", "input": "Hi", "max_output_tokens": 4},
    "/infill": {"model": "smol", "input_prefix": "def f():\n", "input_suffix": "", "n_predict": 4},  # a 400 (no FIM)
}


def _mutated(path: str, data) -> bytes:
    """The route's valid request with one or two fields (or options) replaced by random values."""
    body = json.loads(json.dumps(VALID.get(path, {"model": "smol"})))
    for _ in range(data.draw(st.integers(1, 2), label="mutations")):
        if data.draw(st.booleans(), label="in options"):
            # a request-time option with any value, or a load-time one with a value that must be refused (a valid
            # one would reload the model: correct, but slow for a property test)
            opts = body.setdefault("options", {})
            if not isinstance(opts, dict):  # an earlier mutation set options to another JSON value
                opts = body["options"] = {}
            if data.draw(st.booleans(), label="load option"):
                opts[data.draw(st.sampled_from(LOAD_OPTIONS), label="option")] = data.draw(BAD_LOAD, label="value")
            else:
                opts[data.draw(st.sampled_from(REQUEST_OPTIONS), label="option")] = data.draw(JSON, label="value")
        else:
            body[data.draw(st.sampled_from(sorted(set(body) | set(FIELDS))), label="field")] = data.draw(
                JSON | st.just(True), label="value")
    return json.dumps(body).encode()


def _deep(n: int) -> bytes:
    return b'{"model": "smol", "messages": ' + b"[" * n + b"]" * n + b"}"


BODIES = (st.builds(lambda d: json.dumps(d).encode(), SHAPED)
          | st.builds(lambda d: json.dumps(d).encode(), JSON)
          | st.binary(max_size=64)
          | st.just(b"") | st.just(b'{"model": "smol", "prompt": "\xff\xfe"}')
          | st.integers(200, 200_000).map(_deep))


def _bounded(body: bytes) -> bytes:
    """Keep generation short: a request for more than 16 tokens (or more than 2 choices) asks for 16 (2)."""
    try:
        d = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(d, dict):
        return body
    for k, most in (("max_tokens", 16), ("max_completion_tokens", 16), ("max_output_tokens", 16), ("n", 2)):
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and most < d[k] < 2**31:
            d[k] = most
    opts = d.get("options")
    if isinstance(opts, dict) and isinstance(opts.get("num_predict"), int) and 16 < opts["num_predict"] < 2**31:
        opts["num_predict"] = 16
    return json.dumps(d).encode()


@pytest.fixture(scope="module")
def app_client(smollm2_path, tmp_path_factory):
    """The real app in process (TestClient runs its lifespan) with `smol` (SmolLM2, 8 tokens per answer by
    default) in its store; nothing reachable to pull from."""
    import os

    from fastapi.testclient import TestClient

    from ollapy.server.app import create_app
    from ollapy.store import create_model

    base = tmp_path_factory.mktemp("fuzz")
    env = {"OLLAPY_MODELS": str(base / "models"), "OLLAPY_CACHE_DIR": str(base / "cache"),
           "OLLAPY_CONTEXT_LENGTH": "256", "OLLAPY_PULL_RETRIES": "0", "OLLAPY_REGISTRY": "http://127.0.0.1:9",
           "HF_ENDPOINT": "http://127.0.0.1:9", "OLLAPY_CATALOGUE": str(base / "no-catalogue")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    modelfile = f"FROM {smollm2_path}\nPARAMETER num_predict 8\nPARAMETER temperature 0\n"
    create_model("smol", modelfile, base)
    try:
        with TestClient(create_app(), base_url="http://127.0.0.1", raise_server_exceptions=True) as client:
            client.modelfile = modelfile
            client.base = base
            yield client
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, path parameters filled with a sample value."""
    out = []
    routes = []
    for r in app.routes:  # a FastAPI that wraps included routers keeps their routes on the original router
        inner = getattr(r, "original_router", None)
        routes.extend(inner.routes if inner is not None else [r])
    for r in routes:
        for m in sorted(getattr(r, "methods", None) or ()):
            if m != "HEAD":
                out.append((m, re.sub(r"\{[^}]+\}", "x", r.path)))
    return sorted(set(out))


LLAMACPP_ROUTES = ("/tokenize", "/detokenize", "/apply-template", "/infill")


def _check_answer(method: str, path: str, r) -> None:
    assert r.status_code < 500 or r.status_code in DOCUMENTED_5XX, (method, path, r.status_code, r.text[:300])
    assert "Traceback" not in r.text and 'File "' not in r.text, r.text[:300]
    if r.status_code >= 400:
        body = r.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
        elif path.startswith("/v1") or path in LLAMACPP_ROUTES:  # llama.cpp's server answers OpenAI's error object
            assert isinstance(body["error"]["message"], str) and "type" in body["error"], body
        else:
            assert isinstance(body["error"], str) and "\n" not in body["error"], body


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_every_route_answers_random_bodies_in_its_format(app_client, data):
    from ollapy.store import create_model, list_models

    method, path = data.draw(st.sampled_from(_routes(app_client.app)), label="route")
    if "{" not in path and path.endswith("/x"):
        path = path[:-1] + data.draw(st.sampled_from(["x", "smol", "sha256:" + "0" * 64, "%FF", "..%2F..%2Fetc"]))
    raw = _mutated(path, data) if data.draw(st.booleans(), label="mutated") else data.draw(BODIES, label="body")
    body = _bounded(raw)
    r = app_client.request(method, path, content=body if method != "GET" else None,
                           headers={"content-type": "application/json"})
    _check_answer(method, path, r)
    assert app_client.get("/").status_code == 200  # still up
    if "smol:latest" not in {m.name for m in list_models()}:  # a fuzzed delete or copy took it: put it back
        create_model("smol", app_client.modelfile, app_client.base)


def test_every_route_is_fuzzed(app_client):
    routes = _routes(app_client.app)
    assert ("POST", "/api/chat") in routes and ("POST", "/v1/chat/completions") in routes
    assert ("POST", "/api/blobs/x") in routes and len(routes) >= 20, routes


def test_deep_nesting_and_out_of_range_options_are_400s(app_client):
    """What the properties found: a body nested past Python's recursion limit was a 500 (RecursionError), and
    integer options past what llama.cpp takes (threads, sequences, a C int) went to the loader."""
    r = app_client.post("/api/chat", content=_deep(5000))
    assert r.status_code == 400 and r.json() == {"error": "request body nests deeper than 64 levels"}
    r = app_client.post("/v1/chat/completions", content=_deep(70))
    assert r.status_code == 400 and r.json()["error"]["message"] == "request body nests deeper than 64 levels"
    for name, value, words in (("num_thread", 10**6, "at most 512"), ("num_parallel", 257, "at most 256"),
                               ("num_ctx", 2**40, "at most 8388608"), ("top_k", 2**40, "between")):
        r = app_client.post("/api/generate", json={"model": "smol", "prompt": "Hi", "options": {name: value}})
        assert r.status_code == 400 and f"option {name} must be {words}" in r.json()["error"], r.text
