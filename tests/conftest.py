"""Shared fixtures: the real test models (fetched by scripts/fetch_test_models.py) and loaded engines."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A suite started in the background by a script (`bash .ci/run &`, nohup) inherits SIGINT ignored, and so would
# every `ollapy` process it starts: the Ctrl-C tests (REPL, rpc-server) would then wait for an exit that never
# comes. A user's terminal gives the default, so the tests run with it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_test_models", ROOT / "scripts" / "fetch_test_models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fetch_test_models", mod)
    spec.loader.exec_module(mod)
    return mod


def _model_path(name: str) -> Path:
    mod = _fetch_module()
    model = next(m for m in mod.MODELS if m.name == name)
    path = mod.default_dir() / model.filename
    if not (path.is_file() and path.stat().st_size == model.size):
        path = mod.fetch_model(model, mod.default_dir())
    return path


GPU_BACKENDS = ("vulkan", "cuda", "metal", "hip", "sycl", "opencl")  # ggml backend libraries that bring a GPU


def gpu_device_present() -> bool:
    """True when the installed llama.cpp finds a GPU device to offload layers to (``ollapy info``'s ``gpu
    offload``). A build without a GPU backend library answers at once; a GPU build is asked in a subprocess,
    so that this process does not initialise llama.cpp's backends."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if not any(any(lib.glob(f"*ggml-{name}*")) for name in GPU_BACKENDS):
        return False
    probe = "from ollapy.engine.backend.bindings import supports_gpu_offload; print(supports_gpu_offload())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, cwd=str(ROOT), timeout=300)
    return out.stdout.strip() == b"True"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, with one reason, when there is no GPU device."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not gpu_device_present():
        skip = pytest.mark.skip(reason="no GPU device: this llama.cpp build offloads to none (`ollapy info`: gpu "
                                       "offload); scripts/test_gpu.sh runs these on Mesa's lavapipe")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path to SmolLM2-135M-Instruct Q4_1 (verified size)."""
    return _model_path("smollm2")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Path to Gemma-3-270M Q4_K_M (verified size)."""
    return _model_path("gemma3")


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Path to Qwen2.5-Coder-0.5B-Instruct Q4_K_M (verified size): the test model with FIM tokens."""
    return _model_path("qwen-coder")


def _draft_module():
    spec = importlib.util.spec_from_file_location("make_draft_gguf", ROOT / "scripts" / "make_draft_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DRAFT_LAYERS = 4
"""Blocks kept in the test draft model (SmolLM2-135M has 30)."""


@pytest.fixture(scope="session")
def smollm2_draft_path(smollm2_path, tmp_path_factory) -> Path:
    """A same-vocabulary draft model: SmolLM2's first :data:`DRAFT_LAYERS` blocks, cut with
    scripts/make_draft_gguf.py once per test session into a temporary directory."""
    out = tmp_path_factory.mktemp("draft-models") / f"smollm2-draft-{DRAFT_LAYERS}.gguf"
    return _draft_module().make_draft_gguf(smollm2_path, out, DRAFT_LAYERS)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Keep every test's store, prompt cache and state out of the user's real directories."""
    base = tmp_path_factory.mktemp("ollapy-home")
    monkeypatch.setenv("OLLAPY_MODELS", str(base / "models"))
    monkeypatch.setenv("OLLAPY_CACHE_DIR", str(base / "prompt-cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("OLLAPY_HOST", "127.0.0.1:9")  # nothing answers there: run stays in-process
    yield


@pytest.fixture
def bare_app_env(tmp_path, monkeypatch):
    """For a server app run without its lifespan (FastAPI's TestClient): an empty store, no Ollama store, no
    extra allowed hosts and no API key from the environment."""
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.delenv("OLLAPY_ALLOWED_HOSTS", raising=False)
    monkeypatch.delenv("OLLAPY_API_KEY", raising=False)


HANG_GUARD_S = 900
"""Seconds after which a test treats a process or thread as hung: a guard, never a performance bound."""


def run_cli(*args: str, input: bytes | str | None = None, env: dict | None = None, timeout: float = 300,
            cwd: Path | None = None):
    """Run ``python -m ollapy.cli.main ARGS`` in a subprocess (in ``cwd``, by default the repository); returns
    CompletedProcess with bytes output."""
    full_env = dict(os.environ)
    full_env.pop("OLLAPY_DEBUG", None)
    full_env.update(env or {})
    if isinstance(input, str):
        input = input.encode()
    return subprocess.run([sys.executable, "-m", "ollapy.cli.main", *args], input=input, capture_output=True,
                          env=full_env, timeout=timeout, cwd=str(cwd or ROOT))


def edited_gguf_copy(src: Path, dst: Path, key: str, index: int = 0, value: int | None = None) -> Path:
    """A copy of the GGUF ``src`` with one header value changed in place (the ``gguf`` library's writable
    reader): the scalar ``key`` set to ``value``, or (``value`` None) the first byte of string ``index`` of the
    array ``key`` changed to ``#`` (or ``%`` where it is ``#``), so that its length stays."""
    import shutil

    from gguf import GGUFReader

    shutil.copyfile(src, dst)
    reader = GGUFReader(dst, "r+")
    field = reader.fields[key]
    part = field.parts[field.data[index]]
    part[0] = value if value is not None else (ord("#") if part[0] != ord("#") else ord("%"))
    reader.data.flush()
    del reader
    return dst


def plain_greedy(backend, tokens: list[int], n: int) -> list[int]:
    """Reference greedy decoding on a loaded ``Backend``: a fresh sequence 0, ``tokens`` in one batch, then ``n``
    argmax steps; returns the ``n`` token ids (sequence 0 is cleared again)."""
    from array import array

    import numpy as np

    backend.seq_clear(0)
    k = len(tokens)
    backend.decode(array("i", tokens), array("i", range(k)), array("i", [0] * k), array("b", [0] * (k - 1) + [1]))
    out = [int(np.argmax(backend.logits_row(k - 1)))]
    while len(out) < n:
        backend.decode(array("i", [out[-1]]), array("i", [k + len(out) - 1]), array("i", [0]), array("b", [1]))
        out.append(int(np.argmax(backend.logits_row(0))))
    backend.seq_clear(0)
    return out


@contextlib.contextmanager
def live_server(base: Path, *serve_args: str, env: dict | None = None, start_timeout: float = 180):
    """Run ``ollapy serve`` on a free loopback port with its store, prompt cache and state under ``base``;
    yields its URL once it answers; on exit SIGTERM, which must end it with status 0. A server that has not
    answered within ``start_timeout`` seconds is killed and the run fails with RuntimeError (never a hang)."""
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = dict(os.environ)
    full_env.pop("OLLAPY_DEBUG", None)
    full_env.update(OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_CONTEXT_LENGTH="1024", OLLAPY_MODELS=str(base / "models"),
                    OLLAPY_CACHE_DIR=str(base / "cache"), XDG_STATE_HOME=str(base / "state"))
    full_env.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve", *serve_args], env=full_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError(f"ollapy serve exited with {proc.returncode} before answering") from None
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(timeout=60)
                    raise RuntimeError(f"ollapy serve did not answer within {start_timeout:g} s") from None
                time.sleep(0.1)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        raise
    try:
        yield url
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


@contextlib.contextmanager
def live_api(base: Path, gguf: Path, models: dict[str, dict], env: dict | None = None):
    """A :func:`live_server` (with ``env``) whose store holds ``models`` (name -> extra ``create()`` arguments such
    as ``template``), each made from the GGUF at ``gguf`` uploaded once as a blob through the official ollama
    client. Yields ``url``, ``oc`` (``ollama.Client``) and ``oai`` (``openai.OpenAI`` on ``/v1``)."""
    from types import SimpleNamespace

    import ollama
    import openai

    with live_server(base, env=env) as url:
        oc = ollama.Client(host=url)
        blob = oc.create_blob(gguf)
        for name, extra in models.items():
            oc.create(model=name, files={"model.gguf": blob}, **extra)
        yield SimpleNamespace(url=url, oc=oc, oai=openai.OpenAI(base_url=url + "/v1", api_key="none"))


def cancel_after_first_chunk(request) -> None:
    """Take one streamed chunk of ``request`` (it is generating), cancel it, and assert that the rest of its
    stream ends with :class:`ollapy.errors.Cancelled`."""
    from ollapy.errors import Cancelled

    it = iter(request)
    next(it)
    request.cancel()
    with pytest.raises(Cancelled):
        for _ in it:
            pass


def post_chat(url: str, system: str, question: str, num_predict: int, model: str = "smol") -> dict:
    """A greedy, non-streamed ``/api/chat`` of ``system`` + ``question`` to the server at ``url``; the answer's
    JSON (asserted to be a 200)."""
    import httpx

    body = {"model": model, "stream": False, "options": {"temperature": 0, "num_predict": num_predict},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    r = httpx.post(url + "/api/chat", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()
