"""Crash isolation: a model in a runner child (ollapy.runner) behaves as in-process, and its death fails only
its own requests (RunnerError), never the caller's process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import HANG_GUARD_S, ROOT, cancel_after_first_chunk

from ollapy.engine.interface import ModelRunner
from ollapy.errors import (
    BusyError,
    ContextError,
    ModelLoadError,
    ModelNotFound,
    OptionError,
    RpcUnavailable,
    RunnerError,
)
from ollapy.options import Options
from ollapy.runner import loader
from ollapy.runner.wire import error_from_payload, error_payload

SYSTEM = [{"role": "system", "content": "You are a terse geography tutor."},
          {"role": "user", "content": "What is the capital of France? Then name two rivers in it."}]
COUNT = "Count from 1 to 400, separated by commas: 1, 2, 3,"


def _ref(path):
    return loader.PathRef(name=path.stem, path=path)


def _run(model, prompt, opts):
    text, last = model.submit(prompt, opts).result()
    m = last.metrics
    return text, last.done_reason, m.eval_count, m.prompt_eval_count


def test_errors_cross_the_socket_as_the_same_class_message_and_hint():
    for exc in (BusyError("all 1 slots busy", hint="retry later"), ContextError("prompt of 900 tokens", hint="cut it"),
                OptionError("num_ctx must be >= 1"), ModelNotFound("nope", name="smol:1"),
                RpcUnavailable("rpc down", hint="start it", endpoint="10.0.0.9:50052")):
        back = error_from_payload(error_payload(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.status == exc.status
    assert error_from_payload(error_payload(ModelNotFound("x", name="smol:1"))).name == "smol:1"
    assert error_from_payload(error_payload(RpcUnavailable("x", endpoint="h:1"))).endpoint == "h:1"
    other = error_from_payload(error_payload(ZeroDivisionError("division by zero")))
    assert type(other) is RunnerError and other.status == 502 and "ZeroDivisionError" in str(other)


def test_isolated_greedy_output_and_counts_equal_in_process(smollm2_path):
    opts = Options(num_ctx=1024, num_parallel=2, temperature=0, num_predict=24)
    results, vectors = {}, {}
    for isolated in (False, True):
        with loader.open_model(_ref(smollm2_path), opts, cache=False, isolated=isolated) as m:
            assert isinstance(m, ModelRunner)  # the runner interface, in process and in a child alike
            chat = _run(m, m.chat_prompt(SYSTEM, opts), opts)
            raw = _run(m, m.raw_prompt("The three primary colours are"), opts)
            vectors[isolated] = m.embed(["hello world", "the sea"]).vectors
            results[isolated] = (chat, raw, m.facts, m.supports_tools, m.template.text, m.tokenize("hi"))
        if isolated:
            assert not m.alive
    assert results[True] == results[False]
    assert results[True][0][2] > 0 and results[True][0][3] > 20  # a real answer to a prompt with a system part
    assert vectors[True].shape == (2, 576) and np.allclose(vectors[True], vectors[False], atol=1e-6)


def test_parent_of_an_isolated_model_never_imports_llama_cpp(smollm2_path):
    code = (
        "import sys\nfrom pathlib import Path\nfrom ollapy.runner import loader\nfrom ollapy.options import Options\n"
        f"ref = loader.PathRef(name='smol', path=Path({str(smollm2_path)!r}))\n"
        "o = Options(num_ctx=512, temperature=0, num_predict=4)\n"
        "with loader.open_model(ref, o, cache=False, isolated=True) as m:\n"
        "    text, last = m.chat([{'role': 'user', 'content': 'hi'}], o).result()\n"
        "assert last.metrics.eval_count == 4, last\n"
        "assert not any(k == 'llama_cpp' or k.startswith('llama_cpp.') for k in sys.modules), 'llama_cpp imported'\n"
        "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_child_killed_mid_generation_fails_the_request_with_runner_error(smollm2_path):
    opts = Options(num_ctx=1024, num_parallel=1, temperature=0, num_predict=400)
    m = loader.open_model(_ref(smollm2_path), opts, cache=False, isolated=True)
    try:
        req = m.submit(m.raw_prompt(COUNT), opts)
        it = iter(req)
        first = next(it)
        assert not first.done
        os.kill(m.pid, signal.SIGABRT)
        with pytest.raises(RunnerError) as info:
            for _ in it:
                pass
        assert f"model runner for {smollm2_path.stem} stopped (SIGABRT)" in info.value.message
        assert info.value.status == 502 and "reloads" in info.value.hint
        assert not m.alive
        with pytest.raises(RunnerError, match="SIGABRT"):
            m.submit(m.raw_prompt(COUNT), opts)  # calls on a dead runner fail the same way, at once
        assert m.stats()["slots_busy"] == 0 and m.snapshot().stats["slots_busy"] == 0  # ps never crashes
        assert m.info()["runner_pid"] == m.pid
    finally:
        assert m.close() == 0
        m.close()  # idempotent


def test_pending_requests_end_even_when_describing_the_stopped_runner_fails(smollm2_path, monkeypatch):
    """The reader thread ends every pending request whatever goes wrong while it words the error: a request
    must never wait forever on a runner that is gone."""
    import threading

    opts = Options(num_ctx=1024, num_parallel=1, temperature=0, num_predict=400)
    with loader.open_model(_ref(smollm2_path), opts, cache=False, isolated=True) as m:

        def broken_description():
            raise RuntimeError("cannot describe")

        monkeypatch.setattr(m, "_death_error", broken_description)
        it = iter(m.submit(m.raw_prompt(COUNT), opts))
        next(it)
        outcome = []

        def drain():
            try:
                for _ in it:
                    pass
                outcome.append("ended without an error")
            except RunnerError as exc:
                outcome.append(exc.message)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        os.kill(m.pid, signal.SIGKILL)
        reader.join(timeout=HANG_GUARD_S)  # a guard against a hang, not a speed limit
        assert outcome == [f"model runner for {smollm2_path.stem} stopped (RuntimeError describing it)"]


def test_cancel_frees_the_slot_in_the_child(smollm2_path):
    opts = Options(num_ctx=1024, num_parallel=1, temperature=0, num_predict=300)
    with loader.open_model(_ref(smollm2_path), opts, cache=False, isolated=True) as m:
        cancel_after_first_chunk(m.submit(m.raw_prompt(COUNT), opts))
        short = opts.merged({"num_predict": 6})
        text, last = m.submit(m.raw_prompt("Hello"), short).result()
        assert last.metrics.eval_count == 6
        stats = m.stats()
        # the cancelled request stopped in the child within a few steps: far fewer than its 300 tokens
        assert stats["requests_done"] >= 1 and stats["steps"] < 150 and stats["slots_busy"] == 0, stats


def test_unreachable_rpc_endpoint_is_refused_before_any_child_starts(smollm2_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def no_spawn(*a, **k):
        raise AssertionError("a runner child was started")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    with pytest.raises(RpcUnavailable) as info:
        loader.open_model(_ref(smollm2_path), Options(rpc=f"127.0.0.1:{port}"), cache=False)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_load_error_in_the_child_is_the_same_model_load_error(tmp_path):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, not a model\n")
    errors = {}
    for isolated in (False, True):
        with pytest.raises(ModelLoadError) as info:
            loader.open_model(_ref(bad), Options(), cache=False, isolated=isolated)
        errors[isolated] = str(info.value)
    assert errors[True] == errors[False]


def test_runtime_drops_a_model_whose_runner_died_and_loads_it_again(tmp_path):
    import asyncio

    from ollapy.server.scheduler import Runtime

    class DeadableModel:
        """Stands in for a ProcessModel: ``alive`` turns false when its runner dies."""

        def __init__(self) -> None:
            self.alive, self.closed = True, 0

        def info(self) -> dict:
            return {"num_ctx": 512}

        def snapshot(self):
            from ollapy.engine.interface import RunnerSnapshot

            return RunnerSnapshot({"slots": 1, "slots_busy": 0, "queue_depth": 0})

        def close(self) -> int:
            self.closed += 1
            return 0

    loaded: list[DeadableModel] = []

    def load(ref, options):
        loaded.append(DeadableModel())
        return loaded[-1]

    rt = Runtime(loader=load, resolver=lambda name: loader.PathRef(name=name, path=tmp_path / "m.gguf"))

    async def scenario():
        entry, _, _ = await rt.acquire("m")
        rt.release_nowait(entry)
        loaded[0].alive = False
        assert [s["key"] for s in rt.ps()] == ["m"]  # listed, no crash, until the next request
        again, _, load_ns = await rt.acquire("m")
        rt.release_nowait(again)
        return again, load_ns

    again, load_ns = asyncio.run(scenario())
    assert again.model is loaded[1] and load_ns > 0 and loaded[0].closed == 1 and loaded[1].closed == 0


@pytest.mark.slow
def test_a_lost_rpc_server_aborts_only_the_child_and_its_error_names_ggmls_line(smollm2_path):
    from rpc_helpers import RpcServer

    server = RpcServer().start()
    try:
        opts = Options(num_ctx=512, num_parallel=1, temperature=0, num_predict=300, rpc=server.endpoint)
        with loader.open_model(_ref(smollm2_path), opts, cache=False) as m:  # rpc set: isolated by default
            assert m.info()["runner"] == "process"
            it = iter(m.submit(m.raw_prompt(COUNT), opts))
            next(it)
            server.kill()  # ggml's RPC client aborts the process that loses its server
            with pytest.raises(RunnerError) as info:
                for _ in it:
                    pass
        assert "stopped (SIGABRT): ggml-rpc.cpp:" in info.value.message, info.value.message
        assert server.endpoint in info.value.hint
    finally:
        server.kill()
