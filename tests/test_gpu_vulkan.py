"""The GPU path on a real device: layer offload, tensor_split with RPC, the prompt cache, context shift,
embeddings and device errors, through `ollapy` processes as users run them.

Marked ``gpu``: the default suite skips them (conftest: no GPU device in this build). ``scripts/test_gpu.sh``
runs them on Mesa's software Vulkan device (lavapipe), where decoding takes about 2 s a token: every run is a
short prompt and a few tokens. ollapy keeps every layer off a software device unless asked
(:mod:`ollapy.engine.backend.vulkan`), so the script opts in as a user would, with ``GGML_VK_VISIBLE_DEVICES``
set to the device's index; the tests of that default remove the variable from their children's environment.
The CPU reference is the same build with its GPUs hidden
(``GGML_VK_VISIBLE_DEVICES=`` and ``CUDA_VISIBLE_DEVICES=`` empty: ggml then finds no GPU and the process is
CPU-only, the code path of a CPU build), with the same attention path (``flash_attn=off``) unless a test says otherwise.
"""
from __future__ import annotations

import json
import re

import httpx
import numpy as np
import pytest
from conftest import HANG_GUARD_S, live_server, run_cli
from rpc_helpers import RpcServer

pytestmark = pytest.mark.gpu

PROMPT = "What is the capital of France? Answer in one word."
GREEDY = ("-o", "temperature=0", "-o", "repeat_penalty=1", "-o", "num_predict=4", "-o", "num_ctx=512")
FA_OFF = ("-o", "flash_attn=off")
CPU_ONLY = {"GGML_VK_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}  # ggml then finds no GPU
SYSTEM = " ".join(f"Rule {i}: answer politely in one short sentence." for i in range(1, 9))  # > 64 tokens: cached


def _run(model, *extra: str, env: dict | None = None, prompt: str = PROMPT):
    out = run_cli("run", str(model), *GREEDY, "--verbose", *extra, prompt, env=env, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    assert out.stdout.strip(), out.stderr.decode(errors="replace")[-2000:]
    return out


def _offloaded(stderr: bytes) -> tuple[int, int]:
    """(offloaded, total) layers from llama.cpp's own log line (printed with OLLAPY_DEBUG=1)."""
    m = re.search(rb"offloaded (\d+)/(\d+) layers to GPU", stderr)
    assert m, stderr.decode(errors="replace")[-3000:]
    return int(m.group(1)), int(m.group(2))


def _reused(stderr: bytes) -> tuple[int, str]:
    m = re.search(rb"^prompt cache: +(\d+) token\(s\) reused(?: \(([a-z ]+)(?:, [^)]*)?\))?", stderr, re.M)
    assert m, stderr.decode(errors="replace")[-1500:]
    return int(m.group(1)), (m.group(2) or b"none").decode()


@pytest.fixture(scope="module")
def cpu_text(smollm2_path, gemma_path):
    """The CPU build's greedy answers (flash_attn=off), per model fixture name; computed once."""
    done: dict[str, bytes] = {}

    def text(name: str) -> bytes:
        if name not in done:
            path = smollm2_path if name == "smollm2_path" else gemma_path
            done[name] = _run(path, "--no-cache", *FA_OFF, env=CPU_ONLY).stdout
        return done[name]

    return text


def _info(env: dict | None = None) -> dict:
    out = run_cli("info", "--json", env=env, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def test_info_lists_the_gpu_device_and_gpu_offload_yes():
    data = _info()
    assert data["gpu_offload"] is True
    gpus = [d for d in data["devices"] if d["type"] in ("gpu", "igpu")]
    assert gpus, data["devices"]
    for d in gpus:
        assert d["name"].startswith(d["backend"]) and 0 < d["free"] <= d["total"], d
    assert data["devices"][-1]["backend"] == "CPU"  # ggml registers the CPU last
    text = run_cli("info", timeout=HANG_GUARD_S).stdout.decode()
    assert "gpu offload:       yes" in text
    assert re.search(rf"^  {gpus[0]['name']} +{re.escape(gpus[0]['description'])}  {gpus[0]['type']}  ", text, re.M), text
    # with the GPUs hidden (a variable the user sets is left alone) the same build offloads nothing
    hidden = _info(env=CPU_ONLY)
    assert hidden["gpu_offload"] is False and [d["backend"] for d in hidden["devices"]] == ["CPU"]
    assert hidden["vulkan_visible_devices"] is None


def _software_only(monkeypatch) -> str:
    """The software device's name, with this test's children started as a user's would be, without
    ``GGML_VK_VISIBLE_DEVICES`` (the suite's opt-in) or ollapy's own mark of it. Skips unless this is a Vulkan build
    whose only Vulkan devices are CPU-type (lavapipe)."""
    from ollapy.engine.backend.vulkan import ENV, MARK, build_has_vulkan, software_device

    found = software_device() if build_has_vulkan() else None
    if found is None:
        pytest.skip("not a Vulkan build whose only Vulkan devices are CPU-type (lavapipe)")
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(MARK, raising=False)
    return found[1]


def test_a_software_vulkan_device_alone_is_listed_but_opt_in_and_info_says_why(monkeypatch):
    name = _software_only(monkeypatch)
    data = _info()
    (gpu,) = [d for d in data["devices"] if d["backend"] == "Vulkan"]
    assert gpu["name"] == "Vulkan0" and gpu["description"] == name
    assert data["gpu_offload"] is False  # listed (num_gpu can ask for it), not used by default
    assert data["vulkan_visible_devices"].startswith("GGML_VK_VISIBLE_DEVICES=0 set by ollapy")
    text = run_cli("info", timeout=HANG_GUARD_S).stdout.decode()
    assert "gpu offload:       no by default: the only GPU is a software Vulkan device" in text, text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("vulkan:")]
    assert name in line and "-o num_gpu=N" in line and "GGML_VK_VISIBLE_DEVICES= (empty)" in line, line
    # the user's own variable chooses the device: then it is offloaded to by default, and ollapy says nothing
    chosen = _info(env={"GGML_VK_VISIBLE_DEVICES": "0"})
    assert chosen["gpu_offload"] is True and chosen["vulkan_visible_devices"] is None


def test_a_default_run_with_only_a_software_device_keeps_every_layer_on_the_cpu(smollm2_path, cpu_text, tmp_path,
                                                                                 monkeypatch):
    """Issue 38 (4): lavapipe decodes far slower than the CPU backend. By default the model gets no device at all:
    0 of 31 layers offloaded and no Vulkan buffer (not the weights' host buffer, not the KV, not a compute buffer for
    a prompt's products), the CPU build's greedy text. ``-o num_gpu=4`` asks for the device and gets 4 layers on it;
    a server running its models in child processes (``OLLAPY_RUNNER=process``) does the same."""
    _software_only(monkeypatch)
    expected = cpu_text("smollm2_path")
    vulkan_buffer = re.compile(rb"^.*Vulkan\w*.*buffer size.*$", re.M)
    default = _run(smollm2_path, "--no-cache", env={"OLLAPY_DEBUG": "1"})
    assert b"GGML_VK_VISIBLE_DEVICES=0 set by ollapy" in default.stderr
    assert _offloaded(default.stderr) == (0, 31)
    assert not vulkan_buffer.findall(default.stderr), vulkan_buffer.findall(default.stderr)
    assert default.stdout == expected  # flash attention stays off, as on the CPU build
    asked = _run(smollm2_path, "--no-cache", *FA_OFF, "-o", "num_gpu=4", env={"OLLAPY_DEBUG": "1"})
    assert _offloaded(asked.stderr) == (4, 31)
    assert any(b"Vulkan0" in ln for ln in vulkan_buffer.findall(asked.stderr)), asked.stderr.decode(errors="replace")[-3000:]
    assert asked.stdout == expected
    with live_server(tmp_path, "--allow-paths", env={"OLLAPY_RUNNER": "process"}) as url:
        for options, processor in (({}, "100% CPU"), ({"num_gpu": 4}, "87%/13% CPU/GPU")):
            body = {"model": str(smollm2_path), "options": options}  # no prompt: load only
            r = httpx.post(f"{url}/api/generate", json=body, timeout=HANG_GUARD_S)
            assert r.status_code == 200, r.text
            (m,) = httpx.get(f"{url}/api/ps", timeout=HANG_GUARD_S).json()["models"]
            assert m["size_vram"] == (0 if not options else m["size"] * 4 // 31), m
            table = run_cli("ps", env={"OLLAPY_HOST": url}, timeout=HANG_GUARD_S).stdout.decode().splitlines()
            assert processor in table[1], table


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_full_partial_and_no_offload_give_the_cpu_builds_greedy_text(model, request, cpu_text):
    path = request.getfixturevalue(model)
    layers = 31 if model == "smollm2_path" else 19  # repeating layers plus the output layer
    expected = cpu_text(model)
    for num_gpu, on_gpu in ((-1, layers), (4, 4), (0, 0)):
        got = _run(path, "--no-cache", *FA_OFF, "-o", f"num_gpu={num_gpu}", env={"OLLAPY_DEBUG": "1"})
        assert _offloaded(got.stderr) == (on_gpu, layers)
        assert got.stdout == expected, (num_gpu, got.stdout, expected)


def test_ps_shows_the_share_of_the_model_on_the_gpu(smollm2_path, tmp_path):
    """`/api/ps` size_vram and `ollapy ps` PROCESSOR follow the layers on the device (weights and KV go with
    their layers): all 31 of SmolLM2's, then 4 of 31."""
    with live_server(tmp_path, "--allow-paths") as url:
        for num_gpu, on_gpu, processor in ((-1, 31, "100% GPU"), (4, 4, "87%/13% CPU/GPU")):
            body = {"model": str(smollm2_path), "options": {"num_gpu": num_gpu}}  # no prompt: load only
            r = httpx.post(f"{url}/api/generate", json=body, timeout=HANG_GUARD_S)
            assert r.status_code == 200, r.text
            (m,) = httpx.get(f"{url}/api/ps", timeout=HANG_GUARD_S).json()["models"]
            assert m["size_vram"] == m["size"] * on_gpu // 31, m
            table = run_cli("ps", env={"OLLAPY_HOST": url}, timeout=HANG_GUARD_S).stdout.decode().splitlines()
            assert processor in table[1], table


def test_tensor_split_over_the_vulkan_device_and_a_local_rpc_server(smollm2_path, cpu_text):
    server = RpcServer(devices=["CPU"]).start()  # the RPC host lends its CPU; this host's GPU is Vulkan0
    try:
        got = _run(smollm2_path, "--no-cache", *FA_OFF, "-o", f"rpc={server.endpoint}", "-o", "tensor_split=1,1")
        assert got.stdout == cpu_text("smollm2_path")
    finally:
        server.kill()


def test_prompt_cache_across_processes_on_the_device(smollm2_path, tmp_path):
    env = {"OLLAPY_CACHE_DIR": str(tmp_path / "cache")}
    cold = _run(smollm2_path, "--system", SYSTEM, *FA_OFF, env=env)
    assert _reused(cold.stderr) == (0, "none")
    warm = _run(smollm2_path, "--system", SYSTEM, *FA_OFF, env=env)
    n, source = _reused(warm.stderr)
    assert source == "cache disk" and n >= 64, (n, source)
    assert warm.stdout == cold.stdout


@pytest.mark.parametrize("fa", ["off", "auto"])
def test_states_never_move_between_the_device_and_the_cpu_layout(smollm2_path, tmp_path, fa):
    """A state saved with layers on the device never restores on the CPU, nor the other way round, whatever the
    KV settings: the devices that computed its cells are part of the cache salt (issue 53: the device's kernels
    round differently from the CPU's, so a restored state is not what a cold prefill computes). A miss, never a
    wrong restore; the greedy text is the same either way."""
    opts = ("--system", SYSTEM) + (FA_OFF if fa == "off" else ())
    for first, second in ((None, CPU_ONLY), (CPU_ONLY, None)):
        env = {"OLLAPY_CACHE_DIR": str(tmp_path / f"{'gpu' if first is None else 'cpu'}-first")}
        one = _run(smollm2_path, *opts, env={**env, **(first or {})})
        assert _reused(one.stderr) == (0, "none")
        two = _run(smollm2_path, *opts, env={**env, **(second or {})})
        assert _reused(two.stderr) == (0, "none"), first
        assert two.stdout == one.stdout, first


def test_context_shift_with_every_layer_on_the_device(smollm2_path):
    args = ("--no-cache", *FA_OFF, "-o", "num_ctx=48", "-o", "num_predict=10")  # a 45-token prompt: shifts
    prompt = "Count to 50: 1, 2, 3,"
    gpu = _run(smollm2_path, *args, prompt=prompt)
    cpu = _run(smollm2_path, *args, prompt=prompt, env=CPU_ONLY)
    for out in (gpu, cpu):
        m = re.search(rb"^context shifts: +(\d+)", out.stderr, re.M)
        assert m and int(m.group(1)) >= 1, out.stderr.decode(errors="replace")[-1500:]
    assert gpu.stdout == cpu.stdout


def test_embeddings_on_the_device_match_the_cpu(smollm2_path):
    texts = ("The cat sat on the mat.", "Quarterly taxes are due in April.")
    gpu = run_cli("embed", str(smollm2_path), *texts, timeout=HANG_GUARD_S)
    cpu = run_cli("embed", str(smollm2_path), *texts, env=CPU_ONLY, timeout=HANG_GUARD_S)
    assert gpu.returncode == 0 and cpu.returncode == 0, (gpu.stderr, cpu.stderr)
    g = np.array([json.loads(x) for x in gpu.stdout.decode().splitlines()])
    c = np.array([json.loads(x) for x in cpu.stdout.decode().splitlines()])
    assert g.shape == c.shape == (2, 576)
    assert np.allclose(np.linalg.norm(g, axis=1), 1.0, atol=1e-5)
    cos = (g * c).sum(axis=1)  # both unit length
    assert cos.min() > 0.999, cos  # float kernels differ between the backends; the vectors agree


def _kv_bytes_per_token(path) -> int:
    """f16 K and V bytes per token of a llama-architecture GGUF (SmolLM2), from its header."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields

    def value(key: str) -> int:
        return int(fields[key].parts[fields[key].data[0]][0])

    head_dim = value("llama.embedding_length") // value("llama.attention.head_count")
    return value("llama.block_count") * 2 * value("llama.attention.head_count_kv") * head_dim * 2


def test_a_context_the_device_cannot_hold_is_one_line_and_exit_1(smollm2_path, tmp_path):
    """A context option validation accepts (the largest, options.py's bound) whose KV cache alone is larger than
    the device's memory, with every layer on the device: llama.cpp fails to allocate it. The CLI prints one line
    naming num_ctx and exits 1. A server answers the same load with a one-line 400, keeps nothing of it (``ps`` is
    empty: the device released) and then loads the model with a context that fits, every layer on the device."""
    from ollapy.options import coerce_option

    num_ctx = 2**23
    assert coerce_option("num_ctx", num_ctx) == num_ctx  # passes validation: the failure is the device's
    (gpu,) = [d for d in _info()["devices"] if d["type"] in ("gpu", "igpu")][:1]
    assert num_ctx * _kv_bytes_per_token(smollm2_path) > gpu["total"], gpu
    out = run_cli("run", str(smollm2_path), "-o", f"num_ctx={num_ctx}", "-o", "num_predict=1", "Hi",
                  timeout=HANG_GUARD_S)
    assert out.returncode == 1, out.stderr.decode(errors="replace")[-2000:]
    lines = out.stderr.decode().splitlines()
    assert lines[-1].startswith("Error:") and "num_ctx" in lines[-1], lines
    # before it only ggml-vulkan's own std::cerr lines, which bypass llama.cpp's log callback (docs/gpu.md)
    assert all(ln.startswith("ggml_vulkan: ") for ln in lines[:-1]), lines
    assert out.stdout == b""
    with live_server(tmp_path, "--allow-paths") as url:
        body = {"model": str(smollm2_path), "options": {"num_ctx": num_ctx}}
        r = httpx.post(f"{url}/api/generate", json=body, timeout=HANG_GUARD_S)
        assert r.status_code == 400 and "num_ctx" in r.json()["error"] and "\n" not in r.json()["error"], r.text
        assert httpx.get(f"{url}/api/ps", timeout=HANG_GUARD_S).json()["models"] == []
        r = httpx.post(f"{url}/api/generate", json={"model": str(smollm2_path)}, timeout=HANG_GUARD_S)
        assert r.status_code == 200, r.text
        (m,) = httpx.get(f"{url}/api/ps", timeout=HANG_GUARD_S).json()["models"]
        assert m["size_vram"] == m["size"], m
