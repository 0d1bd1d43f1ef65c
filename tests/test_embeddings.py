"""Embeddings end to end on the real SmolLM2 model: the engine, /api/embed, /api/embeddings, /v1/embeddings
(through the official ``ollama`` and ``openai`` clients), ``ollapy embed`` in a pipe, and ``ollapy run`` with an
embedding-only model. The live server is test_server_api's fixture (4 slots, model ``smol``, num_ctx 1024)."""
from __future__ import annotations

import base64
import importlib.util
import json
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import ROOT, run_cli
from test_server_api import oc, server  # noqa: F401 - the shared live server and its ollama client

CAT = "The cat sat quietly on the warm mat by the fire."
CAT2 = "A cat was sitting calmly on the rug near the fireplace."
TAX = "Quarterly tax filings are due to the revenue office in April."
LONG = "word " * 1200  # more tokens than the server's num_ctx of 1024


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def model(smollm2_path):
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    with LoadedModel(smollm2_path, Options(num_ctx=1024, num_batch=64)) as m:
        yield m


def _same_vectors(a, b) -> bool:
    """The same embeddings up to kernel rounding: a batch and a text alone go through matmuls of other shapes,
    which on an AVX2-only CPU sum in another order (measured: max |diff| 0.003-0.005, cosine 0.99991); a packing
    or pooling bug gives another text's vector (measured cosine: 0.965 between CAT and CAT2, 0.997 between
    "CAT (7)" and "CAT (8)"), below the 0.999 asked here."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.sum(a * b, axis=1) > 1 - 1e-3)) and np.abs(a - b).max() < 2e-2


# ---- engine ---------------------------------------------------------------------------------------------
def test_engine_shapes_norms_order_and_batch_equals_single(model):
    e = model.embed([CAT, CAT2, TAX])
    assert e.vectors.shape == (3, 576) and e.vectors.dtype == np.float32 and e.pooling == "last"
    assert np.allclose(np.linalg.norm(e.vectors, axis=1), 1.0, atol=1e-5)
    assert _cos(e.vectors[0], e.vectors[1]) > _cos(e.vectors[0], e.vectors[2])
    single = np.stack([model.embed([t]).vectors[0] for t in (CAT, CAT2, TAX)])
    assert _same_vectors(single, e.vectors)
    rev = model.embed([TAX, CAT2, CAT]).vectors
    assert _same_vectors(rev[::-1], e.vectors)
    assert list(e.token_counts) == [len(model.backend.tokenize(t)) for t in (CAT, CAT2, TAX)]


def test_engine_packs_many_inputs_and_chunks_a_long_one(model):
    texts = [f"{CAT} ({i})" for i in range(40)]  # 40 x ~15 tokens over n_batch 64: several decodes
    many = model.embed(texts).vectors
    assert _same_vectors(many[7:8], model.embed([texts[7]]).vectors)
    # 200 tokens through n_batch 64 in chunks (LAST pooling keeps the KV between them) = one pass of n_batch 256
    text = " ".join(["the quick brown fox jumps"] * 40)
    from ollapy.engine.backend.embedding import Embedder

    wide = Embedder(model.backend, num_ctx=1024, num_batch=256)
    try:
        assert _cos(model.embed([text]).vectors[0], wide.embed([text]).vectors[0]) > 1 - 1e-4
    finally:
        wide.close()


def test_engine_errors_and_dimensions(model):
    from ollapy.errors import ContextError, OptionError

    with pytest.raises(OptionError, match="empty"):
        model.embed([])
    with pytest.raises(OptionError, match="token id"):
        model.embed([[1, 2, 10**7]])
    with pytest.raises(ContextError, match="1024"):
        model.embed([LONG], truncate=False)
    cut = model.embed([LONG])
    assert cut.token_counts == (1024,) and cut.truncated == (True,)
    full = model.embed([CAT]).vectors[0]
    d8 = model.embed([CAT], dimensions=8).vectors[0]
    assert d8.shape == (8,) and np.allclose(d8, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    raw = model.embed([CAT], normalized=False).vectors[0]
    assert abs(np.linalg.norm(raw) - 1) > 1e-3 and _cos(raw, full) > 1 - 1e-6


def test_engine_embeds_on_one_owned_thread(smollm2_path):
    """Embeddings asked from six long-lived threads (a server's worker pool) decode on the embedder's one thread:
    the process gains at most that thread and its OpenMP team (n_threads - 1), not a team per caller, and
    close() takes them away again (measured in the soak before: 8 more threads per model)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    def os_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    n_threads = 2  # fixed (no adaptive lowering): with OpenMP, each thread that decodes gets a team of 1 more
    with LoadedModel(smollm2_path, Options(num_ctx=256, num_batch=64, num_thread=n_threads)) as m:
        from ollapy.engine.backend.embedding import Embedder

        emb = Embedder(m.backend, num_ctx=256, num_batch=64)
        callers, ready = ThreadPoolExecutor(6), threading.Barrier(6)

        def call(i: int):
            ready.wait(timeout=60)  # six distinct caller threads, all alive until the pool shuts down
            return emb.embed([f"{CAT} ({i})"]).vectors[0]

        try:
            base = os_threads()
            vectors = list(callers.map(call, range(6)))
            grown = os_threads() - base
            assert all(v.shape == (576,) for v in vectors)
            assert grown <= 6 + 1 + (n_threads - 1), f"{grown} more OS threads for 6 callers"
            emb.close()
            for _ in range(100):  # the team's threads end just after the thread that owned them
                if os_threads() - base <= 6:
                    break
                time.sleep(0.05)
            assert os_threads() - base <= 6, "the embedder's threads outlived close()"
        finally:
            emb.close()
            callers.shutdown()


# ---- Ollama API -----------------------------------------------------------------------------------------
def test_api_embed_through_the_ollama_client(oc):  # noqa: F811
    r = oc.embed(model="smol", input=[CAT, CAT2, TAX])
    v = np.array(r.embeddings)
    assert v.shape == (3, 576) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert _cos(v[0], v[1]) > _cos(v[0], v[2])
    assert r.model == "smol" and r.prompt_eval_count > 10 and r.total_duration > 0 and r.load_duration is not None
    one = oc.embed(model="smol", input=CAT)
    assert len(one.embeddings) == 1 and np.abs(np.array(one.embeddings[0]) - v[0]).max() < 1e-4
    d = oc.embed(model="smol", input=CAT, dimensions=16).embeddings[0]
    assert len(d) == 16 and abs(np.linalg.norm(d) - 1) < 1e-5
    assert np.allclose(d, v[0][:16] / np.linalg.norm(v[0][:16]), atol=1e-5)


def test_api_embed_truncate_and_errors(server):  # noqa: F811
    url = server.url + "/api/embed"
    r = httpx.post(url, json={"model": "smol", "input": LONG, "truncate": False}, timeout=120)
    assert r.status_code == 400 and "1024" in r.json()["error"]
    r = httpx.post(url, json={"model": "smol", "input": LONG}, timeout=120)
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 1024
    r = httpx.post(url, json={"model": "smol", "input": [1, 2]}, timeout=60)
    assert r.status_code == 400 and "input" in r.json()["error"]
    r = httpx.post(url, json={"model": "smol", "input": "x", "dimensions": 0}, timeout=60)
    assert r.status_code == 400 and "dimensions" in r.json()["error"]
    r = httpx.post(url, json={"model": "smol", "input": []}, timeout=60)  # as Ollama: loads, no vectors
    assert r.status_code == 200 and r.json()["embeddings"] == []


def test_legacy_embeddings_is_not_normalised(oc):  # noqa: F811
    legacy = np.array(oc.embeddings(model="smol", prompt=CAT).embedding)
    new = np.array(oc.embed(model="smol", input=CAT).embeddings[0])
    assert legacy.shape == (576,) and abs(np.linalg.norm(legacy) - 1) > 1e-2
    assert _cos(legacy, new) > 1 - 1e-5
    assert oc.embeddings(model="smol", prompt="").embedding == []


# ---- OpenAI API -----------------------------------------------------------------------------------------
def test_v1_embeddings_through_the_openai_client(server, model):  # noqa: F811
    import openai

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    ref = np.array(httpx.post(server.url + "/api/embed", json={"model": "smol", "input": [CAT, TAX]},
                              timeout=60).json()["embeddings"])
    r = c.embeddings.create(model="smol", input=[CAT, TAX])  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1]
    assert np.abs(np.array([d.embedding for d in r.data]) - ref).max() < 1e-6
    assert r.usage.prompt_tokens == r.usage.total_tokens > 10
    f = c.embeddings.create(model="smol", input=CAT, encoding_format="float", dimensions=32)
    assert len(f.data) == 1 and len(f.data[0].embedding) == 32
    raw = httpx.post(server.url + "/v1/embeddings", json={"model": "smol", "input": CAT, "encoding_format": "base64"},
                     timeout=60).json()
    floats = struct.unpack("<576f", base64.b64decode(raw["data"][0]["embedding"]))
    assert np.abs(np.array(floats) - ref[0]).max() < 1e-6 and raw["object"] == "list"
    toks = model.backend.tokenize(CAT)
    for inp in (toks, [toks, model.backend.tokenize(TAX)]):
        r = c.embeddings.create(model="smol", input=inp, encoding_format="float")
        assert _cos(r.data[0].embedding, ref[0]) > 1 - 1e-5


def test_v1_embeddings_errors_in_openai_shape(server):  # noqa: F811
    for body in ({"model": "smol", "input": []}, {"model": "smol", "input": [[1, 2, 99999999]]},
                 {"model": "smol", "input": "x", "encoding_format": "hex"},
                 {"model": "smol", "input": LONG, "truncate": False}):
        r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=120)
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], body


# ---- embeddings beside generation --------------------------------------------------------------------------
def test_generation_is_undisturbed_by_concurrent_embeddings(oc):  # noqa: F811
    opts = {"temperature": 0, "num_predict": 40, "repeat_penalty": 1.0}
    prompt = "Write two sentences about the sea."
    alone = oc.generate(model="smol", prompt=prompt, options=opts).response
    result: dict = {}
    gen = threading.Thread(target=lambda: result.update(text=oc.generate(model="smol", prompt=prompt, options=opts).response))
    gen.start()
    n = 0
    while gen.is_alive() or n == 0:
        assert len(oc.embed(model="smol", input=[CAT, TAX, f"{CAT2} {n}"]).embeddings) == 3
        n += 1
    gen.join()
    assert result["text"] == alone and len(alone) > 20


# ---- CLI ------------------------------------------------------------------------------------------------------
def test_cli_embed_in_a_real_pipe(smollm2_path):
    cmd = f"printf 'a cat\\nthe dog\\n' | {sys.executable} -m ollapy.cli.main embed {smollm2_path} --dimensions 8"
    p = subprocess.run(cmd, shell=True, capture_output=True, cwd=str(ROOT), timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 2
    vecs = [json.loads(ln) for ln in lines]
    assert all(len(v) == 8 and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
    args = run_cli("embed", str(smollm2_path), "a cat", "the dog", "--dimensions", "8")
    assert args.returncode == 0 and np.allclose([json.loads(x) for x in args.stdout.decode().splitlines()], vecs, atol=1e-5)


def test_cli_embed_errors_are_one_line(smollm2_path):
    p = run_cli("embed", str(smollm2_path), input="x\n\ny\n")
    assert p.returncode == 1 and p.stdout == b""
    assert p.stderr.decode().count("\n") == 1 and "line 2" in p.stderr.decode()
    p = run_cli("embed", str(smollm2_path), "--no-truncate", "-o", "num_ctx=64", input=LONG + "\n")
    assert p.returncode == 1 and p.stderr.decode().count("\n") == 1 and "64" in p.stderr.decode()


def _with_pooling_type(src: Path, dst: Path, pooling: int) -> None:
    """A copy of the GGUF ``src`` declaring ``{arch}.pooling_type`` (scripts/make_embedding_gguf.py)."""
    spec = importlib.util.spec_from_file_location("make_embedding_gguf", ROOT / "scripts" / "make_embedding_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.with_pooling_type(src, dst, pooling)


def test_run_with_an_embedding_only_model_prints_its_vector(smollm2_path, tmp_path):
    emb = tmp_path / "smol-embed.gguf"
    _with_pooling_type(smollm2_path, emb, 3)  # LAST, as decoder embedding models declare it
    p = run_cli("run", str(emb), CAT)
    assert p.returncode == 0, p.stderr
    vec = json.loads(p.stdout.decode())
    assert len(vec) == 576 and abs(np.linalg.norm(vec) - 1) < 1e-5
    same = json.loads(run_cli("embed", str(smollm2_path), CAT).stdout.decode())
    assert _cos(vec, same) > 1 - 1e-5  # LAST is also what a decoder without a pooling type gets
