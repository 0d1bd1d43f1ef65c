"""Property tests: random and malformed requests to every route of the real app (in process, SmolLM2 loaded).

Bodies are random JSON (wrong types, huge and negative numbers, NaN, deep nesting), invalid UTF-8, empty, or
shaped like each API's requests with random values. Every answer must be a 2xx/4xx in the caller's error
format (or a documented 502/503), never a 500, never a traceback, and the server must keep answering.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

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
# text with lone surrogates too (hypothesis leaves category Cs out by default): JSON carries them as "\ud800" escapes,
# which every route once answered with a 500 (UnicodeEncodeError at the tokenizer)
TEXT = st.text(max_size=12) | st.text(st.characters(categories=["Cs", "Ll"]), min_size=1, max_size=6)
SCALARS = st.none() | st.booleans() | INTS | st.floats(allow_infinity=True, allow_nan=True) | TEXT
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                     max_size=3), max_leaves=8)
REQUEST_OPTIONS = sorted(set(Options.names()) - set(LOAD_OPTIONS))
BAD_LOAD = (st.integers(2**23 + 1, 2**80) | st.integers(-(2**80), -(2**31) - 1) | st.text(max_size=6)
            | st.floats(allow_nan=True).filter(lambda f: not f.is_integer()) | st.lists(st.integers(), max_size=2))
OPTIONS = st.dictionaries(st.sampled_from(REQUEST_OPTIONS + ["tfs_z", "numa", "bogus"]), JSON, max_size=4) | \
    st.dictionaries(st.sampled_from(LOAD_OPTIONS), BAD_LOAD, max_size=2)
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"]) | JSON,
    "content": TEXT | JSON, "tool_calls": JSON, "images": JSON})
SHAPED = st.fixed_dictionaries({"model": MODELS | JSON}, optional={
    **{f: JSON for f in FIELDS if f not in ("model", "options", "messages")},
    "options": OPTIONS | JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON, "input": TEXT | JSON,
    "prompt": TEXT, "stream": st.booleans()})


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


SURROGATE_BODIES = {  # a lone surrogate escape in each kind of text field of each API
    "/api/generate": {"model": "smol", "prompt": "a\ud800b", "system": "\udc00", "stream": False},
    "/api/chat": {"model": "smol", "messages": [{"role": "user", "content": "a\ud800b"}], "stream": False},
    "/v1/chat/completions": {"model": "smol", "messages": [{"role": "user", "content": "\udfff"}], "max_tokens": 2},
    "/v1/completions": {"model": "smol", "prompt": "a\ud800b", "max_tokens": 2},
    "/v1/messages": {"model": "smol", "max_tokens": 2, "system": "\ud800",
                     "messages": [{"role": "user", "content": "a\ud800b"}]},
    "/api/embed": {"model": "smol", "input": ["a\ud800b"]},
    "/tokenize": {"model": "smol", "content": "a\ud800b"},
}


def test_a_lone_surrogate_in_any_text_is_read_as_the_replacement_character(smol):
    """JSON may carry an unpaired surrogate ("\ud800"), which UTF-8 cannot encode: every route answered it with
    a 500. Now it reads as U+FFFD, as Ollama's Go JSON decoder does: the same tokens as the text written so."""
    for path, body in SURROGATE_BODIES.items():
        r = smol.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    got = smol.post("/tokenize", content=b'{"model": "smol", "content": "a\\ud800b\\ud83d\\ude00"}').json()
    want = smol.post("/tokenize", json={"model": "smol", "content": "a\ufffdb\U0001F600"}).json()
    assert got["tokens"] == want["tokens"] and got["tokens"]  # a valid pair stays the character it encodes


@pytest.fixture
def smol(app_client):
    """``app_client`` with `smol` in the test's store (each test gets a fresh store: conftest's _isolated_dirs)."""
    from ollapy.store import create_model, list_models

    if "smol:latest" not in {m.name for m in list_models()}:
        create_model("smol", app_client.modelfile, app_client.base)
    return app_client


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


# ---- /api/create: every field is data, never a Modelfile line (issue 53, finding 1) -----------------------
_OPENED: list[str] = []
_WATCHED: list[str] = []  # the directory whose opens are recorded while a create runs (empty: none)


def _audit(event: str, args) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, bytes)):
        path = args[0].decode(errors="replace") if isinstance(args[0], bytes) else args[0]
        if path.startswith(_WATCHED[0]):
            _OPENED.append(path)


@pytest.fixture(scope="module")
def secret_dir(tmp_path_factory, smollm2_path) -> str:
    """A server directory holding a GGUF and a text file that no create request may read (no --allow-paths)."""
    import shutil
    import sys

    d = tmp_path_factory.mktemp("secret")
    (d / "secret.gguf").write_bytes(smollm2_path.read_bytes()[: 1 << 20])
    if Path("/etc/passwd").exists():
        shutil.copy("/etc/passwd", d / "secret.txt")
    else:
        (d / "secret.txt").write_text("root:x:0:0")
    sys.addaudithook(_audit)  # process-wide and permanent: it records only while _WATCHED names a directory
    return str(d)


def _secret_pieces(secret: str) -> list[str]:
    return ["\n", "\r\n", '"', '"""', "FROM ", "DRAFT ", "ADAPTER ", "PARAMETER ", "MESSAGE user ", "SYSTEM ",
            "TEMPLATE ", "LICENSE ", "#", "\x00", " ", "\t", f"{secret}/secret.gguf", f"{secret}/secret.txt",
            "./secret.gguf", "../", "~/", "smol", "@sha256:" + "0" * 64, "temperature 0", "num_ctx 99", "stop",
            "{{ .Prompt }}", "{% if x %}", "draft", "user", "ngram", "\u00e9", "\\"]


def _create_body(data, secret: str) -> dict:
    pieces = _secret_pieces(secret)
    keyword = st.sampled_from(["FROM", "DRAFT", "ADAPTER", "PARAMETER draft", "PARAMETER num_ctx", "MESSAGE user",
                               "SYSTEM", "TEMPLATE", "LICENSE", "from", "# FROM"])
    target = st.sampled_from([f"{secret}/secret.gguf", f"{secret}/secret.txt", "./secret.gguf", "smol",
                              '"""x"""', '"x', "1"])
    line = st.builds(lambda kw, arg, end: f"{kw} {arg}{end}", keyword, target,
                     st.sampled_from(["", "\n", "\r\n", "\nSYSTEM", "\nLICENSE", "\n#"]))
    injected = st.builds(lambda head, ln, quote: f"{head}{quote}\n{ln}", st.sampled_from(["user", "hi", "a", ""]),
                         line, st.sampled_from(["", '"', '"""']))
    text = st.one_of(injected, injected, st.lists(st.sampled_from(pieces) | st.text(max_size=4) | line,
                                                  max_size=6).map("".join))
    value = text | JSON | st.just("x" * 300_000)
    body: dict = {"model": "fz", "stream": False, "from": "smol"}  # valid: each drawn field replaces one or adds one
    fields = {
        "from": st.sampled_from(["smol", f"{secret}/secret.gguf", f"{secret}/secret.txt"]) | value,
        "files": st.dictionaries(text, st.sampled_from([f"{secret}/secret.gguf", "sha256:" + "0" * 64]) | value,
                                 max_size=3) | JSON,
        "modelfile": st.lists(text, max_size=6).map("\n".join).map(lambda t: "FROM smol\n" + t) | value,
        "parameters": st.dictionaries(st.sampled_from(["stop", "draft", "temperature", "num_ctx", "seed"]) | text,
                                      value, max_size=3) | JSON,
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]) | text | JSON,
                                                    "content": value}), max_size=3) | JSON,
        "system": value, "template": value, "license": value | st.lists(text, max_size=3), "quantize": value,
        "adapters": value, "from_": value, "model": st.sampled_from(["fz:1", "fz2"]) | text | JSON, "stream": JSON,
    }
    for name in data.draw(st.sets(st.sampled_from(sorted(fields)), min_size=1, max_size=3), label="fields"):
        body[name] = data.draw(fields[name], label=name)
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_create_fields_read_no_server_file_and_answer_alike(smol, secret_dir, data):
    """Every /api/create field fuzzed with newlines, quotes, Modelfile keywords, NULs, huge and wrongly typed
    values, and server paths: no 5xx, no file under a server directory opened (the server runs without
    --allow-paths), and the same answer whether the named files exist or not (no path oracle)."""
    body = _create_body(data, secret_dir)
    answers = []
    for secret in (secret_dir, secret_dir[:-1] + "~"):  # the files, then a directory of the same length that is not
        _OPENED.clear()
        _WATCHED[:] = [secret_dir]
        try:
            raw = json.dumps(body).replace(json.dumps(secret_dir)[1:-1], json.dumps(secret)[1:-1])
            r = smol.post("/api/create", content=raw, headers={"content-type": "application/json"})
        finally:
            _WATCHED.clear()
        _check_answer("POST", "/api/create", r)
        assert _OPENED == [], (_OPENED, raw[:300])
        answers.append((r.status_code, r.text.replace(secret, secret_dir)))
    assert answers[0] == answers[1], answers


# ---- content parts of every route and shape (issue 53, finding 7) -------------------------------------------
_PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElF"
        "TkSuQmCC")
_PART_TYPES = ["text", "input_text", "output_text", "summary_text", "refusal", "image_url", "input_image", "image",
               "input_audio", "file", "input_file", "document", "tool_use", "tool_result", "thinking", "bogus"]
_URLS = st.sampled_from([_PNG, "http://127.0.0.1:9/x.png", "data:,x", "data:image/png;base64,@@", "", "x"])
_SOURCE = st.fixed_dictionaries({"type": st.sampled_from(["base64", "url", "file", "x"]) | JSON}, optional={
    "data": st.sampled_from([_PNG.split(",")[1], "@@", ""]) | JSON, "url": _URLS | JSON, "media_type": JSON})
_PART_FIELDS = {  # each type's own fields, well-formed or not
    "text": {"text": st.text(max_size=8) | JSON}, "input_text": {"text": st.text(max_size=8) | JSON},
    "output_text": {"text": JSON}, "summary_text": {"text": JSON}, "refusal": {"refusal": st.text(max_size=8) | JSON},
    "image_url": {"image_url": _URLS | st.fixed_dictionaries({"url": _URLS | JSON}, optional={"detail": JSON}) | JSON},
    "input_image": {"image_url": _URLS | JSON, "file_id": JSON, "detail": JSON},
    "image": {"source": _SOURCE | JSON}, "input_audio": {"input_audio": JSON}, "file": {"file": JSON},
    "input_file": {"file_id": JSON}, "document": {"source": JSON},
    "tool_use": {"id": st.just("c1") | JSON, "name": st.just("f") | JSON, "input": JSON},
    "tool_result": {"tool_use_id": st.just("c1") | JSON, "is_error": JSON,
                    "content": JSON | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": JSON}))},
    "thinking": {"thinking": JSON, "signature": JSON}, "bogus": {"x": JSON},
}
_PART = (st.sampled_from(sorted(_PART_FIELDS)).flatmap(
    lambda t: st.fixed_dictionaries({"type": st.just(t)}, optional=_PART_FIELDS[t]))
    | st.text(max_size=6) | JSON)
_PARTS = st.lists(_PART, min_size=1, max_size=2)
_CONTENT = st.one_of(_PARTS, _PARTS, _PARTS, st.text(max_size=8), JSON)
_CALLS = st.lists(st.fixed_dictionaries({}, optional={"id": JSON, "type": JSON, "function": st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["f", ""]) | JSON, "arguments": JSON | st.just('{"a": 1}')}) | JSON}),
    max_size=2) | JSON
_ROLES = st.sampled_from(["user", "assistant", "system", "tool", "developer"])
_ROLE = st.one_of(_ROLES, _ROLES, _ROLES, JSON)
_MSG = st.fixed_dictionaries({"role": _ROLE, "content": _CONTENT}, optional={
    "images": st.lists(st.sampled_from([_PNG.split(",")[1], "@@"]) | JSON, max_size=2) | JSON, "tool_calls": _CALLS,
    "tool_call_id": JSON, "name": JSON, "thinking": JSON})
_ITEM = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output",
                                                        "custom_tool_call", "reasoning", "bogus"]) | JSON},
                              optional={"role": _ROLE, "content": _CONTENT, "output": _CONTENT, "summary": _CONTENT,
                                        "name": JSON, "call_id": JSON, "arguments": JSON, "input": JSON})
CONTENT_BODIES = {
    "/api/chat": st.fixed_dictionaries({"messages": st.lists(_MSG, min_size=1, max_size=2)}),
    "/api/generate": st.fixed_dictionaries({"images": st.lists(st.sampled_from([_PNG.split(",")[1], "@@"]) | JSON,
                                                               max_size=2) | JSON}),
    "/v1/chat/completions": st.fixed_dictionaries({"messages": st.lists(_MSG, min_size=1, max_size=2)}),
    "/v1/responses": st.fixed_dictionaries({"input": st.lists(_ITEM, min_size=1, max_size=2)}),
    "/v1/messages": st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system"]) | JSON, "content": _CONTENT}), min_size=1,
        max_size=2)}, optional={"system": _CONTENT}),
}


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_content_parts_of_every_shape_are_never_a_5xx(smol, data):
    """Every content-part parser (chat messages with images and tool calls, generate's images, OpenAI's parts,
    Responses' input items, Anthropic's blocks and image sources) on random shapes: a 2xx or a 400 in the route's
    own error format, never a 5xx (``{"type": "image", "source": "x"}`` in /v1/chat/completions was a 500)."""
    path = data.draw(st.sampled_from(sorted(CONTENT_BODIES)), label="route")
    body = {**VALID[path], **data.draw(CONTENT_BODIES[path], label="body")}
    r = smol.post(path, content=_bounded(json.dumps(body).encode()), headers={"content-type": "application/json"})
    _check_answer("POST", path, r)


def test_an_image_part_of_the_wrong_shape_is_a_400_naming_it(smol):
    r = smol.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], "messages": [
        {"role": "user", "content": [{"type": "image", "source": "x"}]}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("content.0.source: input should be"), r.text


@pytest.mark.parametrize("field", ["reasoning_effort", "content type"])
def test_an_unhashable_value_where_a_name_belongs_is_a_400(smol, field):
    """A list where a level or a part type belongs: a 400 (main answered 500: ``unhashable type: 'list'``)."""
    body = {**VALID["/v1/chat/completions"]}
    if field == "reasoning_effort":
        body["reasoning_effort"] = []
    else:
        body["messages"] = [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]
    r = smol.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text


def _injections(secret: str) -> list[str]:
    """Modelfile lines that read a server file if a value were parsed as Modelfile text (the closing ``SYSTEM``
    swallows whatever the server writes after the value on that line)."""
    return [f"user\n{kw} {secret}/{name}\nSYSTEM" for kw in ("FROM", "DRAFT", "PARAMETER draft", "ADAPTER")
            for name in ("secret.gguf", "secret.txt")] + [f'x"""\nFROM {secret}/secret.gguf\nSYSTEM """y',
                                                           f'x"\nFROM {secret}/secret.gguf\n#']


def _with_payload(field: str, payload: str) -> dict:
    """A valid create request (FROM the store's `smol`) with ``payload`` in ``field``: as the value, or as a message's
    role and content, a parameter's key and value, a file name."""
    body: dict = {"model": "fz", "stream": False, "from": "smol"}
    if field == "messages":
        body["messages"] = [{"role": payload, "content": "hi"}, {"role": "user", "content": payload}]
    elif field == "parameters":
        body["parameters"] = {"stop": [payload], payload: 1}
    elif field == "files":
        body.pop("from")
        body["files"] = {payload: "sha256:" + "0" * 64}
    elif field == "license":
        body["license"] = [payload, payload]
    else:
        body[field] = payload
    return body


def test_modelfile_lines_in_every_create_field_are_data(smol, secret_dir):
    """Each /api/create field given text that holds Modelfile lines naming server files (a role of
    ``user\\nFROM /path\\nSYSTEM`` read /path as the projector): no server file is opened, and the answer is the
    same whether the files exist or not (no path oracle)."""
    missing = secret_dir[:-1] + "~"
    for field in ("model", "from", "files", "modelfile", "parameters", "messages", "system", "template", "license",
                  "quantize", "adapters"):
        for payload in _injections(secret_dir):
            answers = []
            for d in (secret_dir, missing):
                _OPENED.clear()
                _WATCHED[:] = [secret_dir]
                try:
                    r = smol.post("/api/create", json=_with_payload(field, payload.replace(secret_dir, d)))
                finally:
                    _WATCHED.clear()
                _check_answer("POST", "/api/create", r)
                assert _OPENED == [], (field, payload, _OPENED)
                answers.append((r.status_code, r.text.replace(d, secret_dir)))
            assert answers[0] == answers[1], (field, payload, answers)


def test_a_failed_pull_does_not_tell_the_client_to_pull(smol):
    """A 404 for a model the server lacks suggests a pull; the 404 of a pull that found no source did too."""
    r = smol.post("/api/pull", json={"model": "nosuch:1b", "stream": False})
    assert r.status_code == 404 and r.json()["error"] == "model 'nosuch:1b' not found in any source", r.text
    r = smol.post("/api/generate", json={"model": "nosuch:1b", "prompt": "Hi"})
    assert r.status_code == 404 and "(try `ollapy pull nosuch:1b`)" in r.json()["error"], r.text


def test_openai_penalties_outside_openais_range_are_400s(smol):
    """OpenAI's API refuses presence_penalty and frequency_penalty outside [-2, 2]; /v1 took 100 silently."""
    for field, value in (("presence_penalty", 100), ("frequency_penalty", 2.5)):
        r = smol.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], field: value})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(f"{field} must be between -2 and 2")
    r = smol.post("/v1/chat/completions", json={**VALID["/v1/chat/completions"], "presence_penalty": 2})
    assert r.status_code == 200, r.text
