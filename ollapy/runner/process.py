"""The parent's side of a runner child: :class:`ProcessModel`, a drop-in for ``LoadedModel``.

A :class:`ProcessModel` starts a runner child (an isolated interpreter in a neutral working directory, see
:mod:`.launch`; its own session, no core dumps, GGML_NO_BACKTRACE=1), sends it the model to load and
waits for ``ready``. It then implements the runner interface
(:class:`~ollapy.engine.interface.ModelRunner`) over the socket: prompt building, ``submit``/``chat`` (a real
:class:`~ollapy.engine.request.Request`: iterate it, ``async for`` it with ``loop=``, ``result()``,
``cancel()``), ``embed``, ``info``, ``stats``, ``cache_stats``, ``snapshot``, the model facts, ``close``.
Errors raised in the child come back as the same :class:`~ollapy.errors.OllapyError` subclass with the same
words.

Waiting: every call waits at most ``OLLAPY_RUNNER_TIMEOUT`` seconds for the child (RunnerError past it, the
call cancelled there); ``info`` and ``snapshot`` never wait (the facts come with ``ready``, the figures with
the status message the child sends every second); ``cancel`` never blocks its caller (it is queued to a
writer thread), so an event loop that cancels a stream of a stopped child goes on.

Threads: one reader receives every message and settles calls, pushes
chunks into their Request or keeps the latest status; one writer sends cancels; one more reads the child's
stderr (:class:`~.childlog.ChildLog`: logged again here, a short tail kept for error messages).

Child death (end of file while it should be serving): every pending call and
request fails with RunnerError ``model runner for NAME stopped (SIGABRT): <last
stderr line>``; :attr:`ProcessModel.alive` turns false and later calls fail the
same way. The runtime then drops the model and reloads it on the next request.

Close order (:meth:`ProcessModel.close`, idempotent, also the context
manager's exit): 1. send ``close`` and wait (bounded) for the child's answer (skipped for a child whose status
stopped coming: stopped or hung, it is killed at once),
the number of prompt-cache states it could not save (the child stops its
engine, drains its cache, frees the model); a Ctrl-C here is passed on as
SIGINT (the drain stops early) and re-raised afterwards; 2. wait for the child
to exit, kill it past a few seconds; 3. shut the socket down, join the reader
and stderr threads, close the socket; 4. fail whatever is still pending.
Nothing depends on garbage collection or atexit.

This module never imports llama_cpp (the parent of an RPC model must not load
ggml's RPC client).
"""
from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ollapy import config
from ollapy.engine.interface import RunnerSnapshot
from ollapy.engine.request import Prompt, Request
from ollapy.errors import DecodeError, OllapyError, OptionError, RunnerError
from ollapy.options import Options
from ollapy.runner.childlog import ChildLog
from ollapy.runner.handles import PendingCall, ProcessRequest, fresh_error
from ollapy.runner.launch import NEUTRAL_CWD, child_command, child_environment
from ollapy.runner.wire import EmbeddingResult, ReadyFacts, error_from_payload, load_spec

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("ollapy.runner")

CLOSE_GRACE_S = 10.0  # after the answer to close (or none), how long the child may take to exit before a kill


class ProcessModel:
    """One model loaded in a runner child: a :class:`~ollapy.engine.interface.ModelRunner`; see the module doc.

    Raises, from the constructor: RpcUnavailable (``options.rpc`` set and an
    endpoint fails the handshake: no child is started), the child's load error
    (ModelLoadError...), RunnerError when the child dies while loading.
    """

    def __init__(self, ref, options: Options, *, cache: bool = True, write_back: bool = False,
                 max_queue: int = 512) -> None:
        if options.rpc:
            from ollapy.rpc_endpoint import check_endpoints, parse_endpoints

            check_endpoints(parse_endpoints(options.rpc))
        self.options = options
        self.path = Path(ref.path)
        self.name = ref.name or self.path.name
        self.digest = getattr(ref, "digest", None)
        self.unsaved_states = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # _calls, _requests, _dead
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._calls: dict[int, PendingCall] = {}
        self._requests: dict[int, ProcessRequest] = {}
        self._dead: RunnerError | None = None
        self._closing = False
        self._closed = False
        self._reader: threading.Thread | None = None
        self._cancels: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._timeout = config.runner_timeout()
        self._proc, self._sock, self._conn = self._spawn()
        self._stderr = ChildLog(self._proc.stdout, self.name, self.pid)
        try:
            facts = self._load(load_spec(ref, options, cache=cache, write_back=write_back, max_queue=max_queue,
                                         log_level=logging.getLogger("ollapy").getEffectiveLevel()))
        except BaseException as exc:
            self._closed = True  # a load error: the child exits by itself; anything else (Ctrl-C): kill it now
            self._stop_process(grace=CLOSE_GRACE_S if isinstance(exc, OllapyError) else 0.0, quiet=True)
            raise
        self._ready = facts
        self.facts = facts.facts
        self.architecture = facts.architecture
        self.template = facts.template
        self.load_duration_ns = facts.load_duration_ns
        self._info = dict(facts.info)
        self._snapshot = RunnerSnapshot(facts.snapshot.stats, facts.snapshot.cache)  # taken now, in this process
        self._reader = threading.Thread(target=self._read, name=f"runner-reader-{self.pid}", daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write_cancels, name=f"runner-writer-{self.pid}", daemon=True)
        self._writer.start()

    # ---- process --------------------------------------------------------------------------------
    def _spawn(self) -> tuple[subprocess.Popen, socket.socket, Connection]:
        parent_sock, child_sock = socket.socketpair()
        try:
            proc = subprocess.Popen(child_command(self.name, child_sock.fileno()), pass_fds=(child_sock.fileno(),),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=child_environment(), cwd=NEUTRAL_CWD, start_new_session=True)
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        return proc, parent_sock, Connection(os.dup(parent_sock.fileno()))

    @property
    def pid(self) -> int:
        """The runner child's process id."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """True while the child serves this model (false once it died or the model was closed)."""
        return self._dead is None and not self._closed and self._proc.poll() is None

    def _load(self, spec: dict) -> ReadyFacts:
        self._send(("load", spec))
        while True:
            try:
                if not self._conn.poll(0.25):
                    if self._proc.poll() is not None and not self._conn.poll(0):
                        raise self._death_error()
                    continue
                kind, body = self._conn.recv()
            except (EOFError, OSError):
                raise self._death_error() from None
            if kind == "ready":
                return body
            if kind == "failed":
                raise error_from_payload(body)

    def _death_error(self) -> RunnerError:
        """The RunnerError for a child that stopped: how it ended and its last line."""
        try:
            rc = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        self._stderr.join(timeout=2)  # the tail is complete once the child's output is closed
        if rc is None:
            how = "stopped answering"
        elif rc < 0:
            try:
                how = f"stopped ({signal.Signals(-rc).name})"
            except ValueError:
                how = f"stopped (signal {-rc})"
        else:
            how = f"stopped (exit status {rc})"
        line = self._stderr.last_line()
        hint = "the next request reloads the model"
        if self.options.rpc:
            from ollapy.rpc_endpoint import parse_endpoints, unreachable_endpoints

            down = unreachable_endpoints(parse_endpoints(self.options.rpc))
            hint += (f"; RPC server {', '.join(down)} does not answer" if down
                     else f"; check the RPC servers {self.options.rpc}")
        hint += "; set OLLAPY_DEBUG=1 to see the runner's log"
        return RunnerError(f"model runner for {self.name} {how}" + (f": {line}" if line else ""), hint=hint)

    # ---- messages -------------------------------------------------------------------------------
    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def _read(self) -> None:
        """The reader thread: settle calls, push chunks and errors into requests; on end of file, fail the rest."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # noqa: BLE001 - a message that does not unpickle: the stream is lost
                log.exception("runner %s: unreadable message", self.name)
                break
            kind, mid, body = msg[0], msg[1], msg[2]
            if kind == "status":
                self._snapshot = RunnerSnapshot(body.stats, body.cache)  # stamped with this process's clock
            elif kind in ("result", "error"):
                with self._lock:
                    call = self._calls.pop(mid, None)
                if call is not None and kind == "result":
                    call.settle(body)
                elif call is not None:
                    call.settle(None, error_from_payload(body))
            elif kind == "chunk":
                with self._lock:
                    req = self._requests.get(mid) if not body.done else self._requests.pop(mid, None)
                if req is not None:
                    req.push(body)
            elif kind == "fail":
                with self._lock:
                    req = self._requests.pop(mid, None)
                if req is not None:
                    req.push(error_from_payload(body))
        if self._closing:
            err = RunnerError(f"{self.name} was unloaded", hint="retry the request")
        else:
            try:
                err = self._death_error()
            except Exception as exc:  # noqa: BLE001 - whatever happens here, the pending requests must end
                log.exception("describing the stopped runner of %s failed", self.name)
                err = RunnerError(f"model runner for {self.name} stopped ({exc.__class__.__name__} describing it)",
                                  hint="the next request reloads the model")
            log.info("%s", err.message)  # the failed requests carry it; a CLI prints it once
        self._fail_pending(err)

    def _fail_pending(self, err: RunnerError) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = err
            calls, self._calls = list(self._calls.values()), {}
            reqs, self._requests = list(self._requests.values()), {}
        for call in calls:
            call.settle(None, fresh_error(err))
        for req in reqs:
            req.push(fresh_error(err))

    def _register(self, mid: int, req: ProcessRequest | None = None) -> PendingCall:
        call = PendingCall()
        with self._lock:
            if self._dead is not None:
                raise fresh_error(self._dead)
            if self._closed:
                raise DecodeError(f"{self.name} is being unloaded", hint="retry the request")
            self._calls[mid] = call
            if req is not None:
                self._requests[mid] = req
        return call

    def _call(self, op: str, *args, timeout: float | None = None, **kwargs) -> Any:
        """Run ``op`` (a :data:`ollapy.runner.wire.CALLS` name) in the child and return its value.

        Waits at most ``timeout`` s (default ``OLLAPY_RUNNER_TIMEOUT``); raises RunnerError past it."""
        mid = next(self._ids)
        call = self._register(mid)
        try:
            self._send(("call", mid, op, args, kwargs))
        except OSError:
            pass  # the child is gone: the reader fails the call
        try:
            return self._wait(call, op, timeout)
        finally:
            with self._lock:
                self._calls.pop(mid, None)

    def _wait(self, call: PendingCall, op: str, timeout: float | None) -> Any:
        limit = self._timeout if timeout is None else timeout
        try:
            return call.wait(limit)
        except TimeoutError:
            raise RunnerError(f"model runner for {self.name} did not answer {op} within {limit:g}s",
                              hint="it may be stopped or overloaded; raise OLLAPY_RUNNER_TIMEOUT, or unload the "
                                   "model (keep_alive 0) to restart it") from None

    def _send_cancel(self, rid: int, kind: str = "cancel") -> None:
        """Queue a cancel (or ``kind`` ``"finish"``: :meth:`Request.finish_early`) for the writer thread: never
        blocks (called on a server's event loop)."""
        with self._lock:
            pending = rid in self._requests
        if pending and self._dead is None:
            self._cancels.put((kind, rid))

    def _write_cancels(self) -> None:
        """The writer thread: send each queued cancel or finish (a stopped child may block this thread, nobody
        else)."""
        while True:
            item = self._cancels.get()
            if item is None:
                return
            try:
                self._send(item)
            except OSError:
                return

    # ---- prompts (built in the child, which holds the tokenizer and template) -----------------
    def tokenize(self, text: str) -> list[int]:
        """As ``LoadedModel.tokenize``: the model's special-token rules, never two BOS tokens."""
        return self._call("tokenize", text)

    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """As ``LoadedModel.tokenize_text``: ``llama_tokenize`` with these two switches."""
        return self._call("tokenize_text", text, add_special=add_special, parse_special=parse_special)

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """As ``LoadedModel.token_pieces``: each token's bytes. Raises OptionError for an id outside the vocabulary."""
        return self._call("token_pieces", tokens)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list[dict] | None = None,
               think: bool | str | None = None) -> str:
        """As ``LoadedModel.render``: chat messages to prompt text. Raises OptionError."""
        return self._call("render", messages, add_generation_prompt, tools=tools, think=think)

    def chat_prompt(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
                    think: bool | str | None = None) -> Prompt:
        """As ``LoadedModel.chat_prompt``: tokens, ``keep`` and cache save points of a chat."""
        return self._call("chat_prompt", messages, options, tools=tools, think=think)

    def raw_prompt(self, text: str) -> Prompt:
        """As ``LoadedModel.raw_prompt``: a prompt used verbatim."""
        return self._call("raw_prompt", text)

    def fim_prompt(self, request, options: Options | None = None) -> Prompt:
        """As ``LoadedModel.fim_prompt``: a code completion's prompt (``request`` an
        :class:`ollapy.chat.fim.FimRequest`). Raises OptionError."""
        return self._call("fim_prompt", request, options)

    def grammar_for(self, fmt) -> str | None:
        """As ``LoadedModel.grammar_for``: GBNF for Ollama's ``format``. Raises OptionError."""
        return self._call("grammar_for", fmt)

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tool definitions."""
        return self._ready.supports_tools

    @property
    def supports_insert(self) -> bool:
        """Whether the model completes between a prefix and a suffix (FIM tokens or a ``suffix`` template)."""
        return self._ready.supports_insert

    @property
    def supports_thinking(self) -> bool:
        """Whether the chat template has a reasoning section."""
        return self._ready.supports_thinking

    @property
    def embedding_only(self) -> bool:
        """True for an embedding model."""
        return self._ready.embedding_only

    # ---- generation -------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, options: Options, *, fmt=None, cache: bool = True,
               loop: asyncio.AbstractEventLoop | None = None, pin: bool = False, logprobs: int = -1,
               timeout: float | None = None) -> Request:
        """As ``LoadedModel.submit``; returns a :class:`ProcessRequest` fed by the reader thread.

        Raises here what the child's engine raises on submit (BusyError, OptionError for a bad ``format``),
        RunnerError when the child is gone or does not accept it within ``timeout`` s (default
        ``OLLAPY_RUNNER_TIMEOUT``; the request is cancelled there).
        """
        mid = next(self._ids)
        req = ProcessRequest(tokens=list(prompt.tokens), options=options, keep=prompt.keep, cache=cache,
                             save_points=tuple(prompt.save_points), pin=pin, loop=loop, logprobs=logprobs,
                             id=mid, runner=self)
        call = self._register(mid, req)
        try:
            self._send(("submit", mid, prompt, options, {"fmt": fmt, "cache": cache, "pin": pin,
                                                          "logprobs": logprobs}))
        except OSError:
            pass  # the reader fails it
        try:
            self._wait(call, "submit", timeout)
        except BaseException:
            with self._lock:
                self._calls.pop(mid, None)
                late = self._requests.pop(mid, None) is not None
            if late and self._dead is None:
                self._cancels.put(("cancel", mid))  # accepted after we gave up: end it in the child
            raise
        return req

    def chat(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
             think: bool | str | None = None, **kw) -> Request:
        """Render ``messages`` and submit, as ``LoadedModel.chat``."""
        options = options or self.options
        return self.submit(self.chat_prompt(messages, options, tools=tools, think=think), options, **kw)

    def embed(self, inputs, *, truncate: bool = True, normalized: bool = True,
              dimensions: int | None = None) -> EmbeddingResult:
        """As ``LoadedModel.embed``: ``vectors`` float32 ``(len(inputs), dim)``, ``token_counts``... Raises
        OptionError, ContextError, DecodeError as the child's embedder does."""
        if isinstance(inputs, (str, bytes)):
            raise OptionError("inputs must be a list")
        return self._call("embed", list(inputs), truncate=truncate, normalized=normalized, dimensions=dimensions)

    def info(self) -> dict:
        """Model facts as ``LoadedModel.info`` (taken when the child was ready: no round trip, so ``ps`` never
        waits on a busy or dead runner), plus ``runner`` and ``runner_pid``."""
        return {**self._info, "runner": "process", "runner_pid": self.pid}

    @property
    def cache_block(self) -> int | None:
        """Tokens per prompt-cache block in the child; None without a prompt cache."""
        return self._ready.cache_block

    def stats(self) -> dict:
        """The child's engine figures now (a round trip, bounded by ``OLLAPY_RUNNER_TIMEOUT``); a dead runner
        gives its last figures with nothing busy or queued. Raises RunnerError past the timeout."""
        if not self.alive:
            return {**self._snapshot.stats, "slots_busy": 0, "queue_depth": 0}
        return self._call("stats")

    def cache_stats(self):
        """The child's :class:`ollapy.cache.stats.CacheStats` now (a round trip); the last known once it is gone."""
        if not self.alive:
            return self._snapshot.cache
        return self._call("cache_stats")

    def snapshot(self) -> RunnerSnapshot:
        """The figures the child last sent (every second); never waits. Its ``taken_at`` is when this process
        received them: a stopped child's snapshot grows old (``stale()``), a dead one's shows nothing busy."""
        snap = self._snapshot
        if self._dead is not None or self._closed:
            return RunnerSnapshot({**snap.stats, "slots_busy": 0, "queue_depth": 0}, snap.cache, snap.taken_at)
        return snap

    # ---- close -------------------------------------------------------------------------------------
    def __enter__(self) -> ProcessModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, timeout: float = 120.0) -> int:
        """Close the model in the child (engine, bounded cache drain), end the child; idempotent.

        Returns how many prompt-cache states the child could not save. A Ctrl-C
        while waiting is passed on to the child (its drain stops early) and
        re-raised once the child is gone; ``unsaved_states`` keeps the count.
        """
        with self._close_lock:
            if self._closed:
                return self.unsaved_states
            self._closed = True
        interrupted = False
        hung = self._dead is None and self._snapshot.stale()
        if hung:  # its status thread stopped too (SIGSTOP, a hang): it would not answer close either
            log.warning("model runner for %s stopped answering %.0fs ago; killing it", self.name,
                        self._snapshot.age_s())
        try:
            if self._dead is None and self._proc.poll() is None and not hung:
                interrupted = self._close_child(timeout)
        finally:
            self._stop_process(grace=0.0 if hung else CLOSE_GRACE_S, quiet=hung)
        if interrupted:
            raise KeyboardInterrupt
        return self.unsaved_states

    def _close_child(self, timeout: float) -> bool:
        """Ask the child to close; True when a Ctrl-C came while waiting."""
        mid = next(self._ids)
        call = PendingCall()
        with self._lock:
            self._calls[mid] = call
        self._closing = True
        try:
            self._send(("close", mid, timeout))
        except OSError:
            return False
        interrupted = False
        try:
            self.unsaved_states = int(call.wait(timeout + 15) or 0)
        except KeyboardInterrupt:
            interrupted = True
            try:
                os.kill(self.pid, signal.SIGINT)
                self.unsaved_states = int(call.wait(15) or 0)
            except (OSError, RunnerError, TimeoutError, KeyboardInterrupt):
                pass
        except (RunnerError, TimeoutError) as exc:
            log.warning("closing %s: %s", self.name, exc)
        return interrupted

    def _stop_process(self, grace: float, quiet: bool = False) -> None:
        """Wait ``grace`` s for the child to exit, then kill it; join the threads, close the socket."""
        self._closing = True
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            if not quiet:
                log.warning("model runner for %s did not exit; killing it", self.name)
            self._proc.kill()
            self._proc.wait()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=10)
        self._cancels.put(None)  # ends the writer thread
        self._stderr.join(timeout=10)
        self._conn.close()
        self._sock.close()
        self._fail_pending(RunnerError(f"{self.name} was unloaded", hint="retry the request"))
