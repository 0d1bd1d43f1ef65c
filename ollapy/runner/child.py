"""The runner child: one model loaded in its own process, served to its parent over a socket.

Started by :class:`ollapy.runner.process.ProcessModel` in an isolated interpreter (:mod:`.launch`:
``python -I -c BOOTSTRAP ollapy.runner.child FD NAME``, NAME only labels the process in ``ps``) where ``FD`` is
its end of a socketpair,
wrapped in a :class:`multiprocessing.connection.Connection` (pickled tuples,
see :mod:`ollapy.runner.wire`). The first message is ``load``; the model is
opened with the in-process path below the factory (:func:`ollapy.runner.loader.open_local`) and the child answers
``ready`` with its :class:`~ollapy.runner.wire.ReadyFacts`, or ``failed`` with the load error. From then on a
status thread sends the model's :class:`~ollapy.engine.interface.RunnerSnapshot` every second.

Then the main thread reads messages in order: ``call`` runs on a small
worker pool (prompt building, embeddings, figures); ``submit`` queues a
generation whose chunks the engine's loop thread sends back as it pushes them
(:class:`ChunkSender`); ``cancel`` cancels a generation by id; ``close`` closes the model (stop
the engine, drain the prompt cache), answers with the number of states not
saved and exits 0. End of file on the socket (the parent is gone) closes the
model the same way and exits.

The child never writes core dumps (RLIMIT_CORE 0), sets GGML_NO_BACKTRACE=1
(ggml would otherwise run gdb on an abort) and runs in its own session, so a
Ctrl-C in the terminal reaches only the parent. Its Python log records go to
stderr as ``LEVEL logger: message`` lines, which the parent logs again.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from ollapy.runner.wire import CALLS, STATUS_INTERVAL_S, EmbeddingResult, ReadyFacts, error_payload

log = logging.getLogger("ollapy.runner")

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"  # parsed by the parent (ollapy.runner.process)


class RunnerChild:
    """The child's side of one connection: loads the model, serves calls and generations, closes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.model = None  # ollapy.engine.model.LoadedModel once loaded
        self.requests: dict[int, object] = {}  # id -> engine Request still streaming
        self._send_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="runner-call")
        self._stopped = threading.Event()

    def send(self, msg: tuple) -> bool:
        """Send one message; False when the parent is gone (or the value cannot be pickled, logged)."""
        try:
            with self._send_lock:
                self.conn.send(msg)
            return True
        except (OSError, ValueError):
            return False
        except Exception:  # noqa: BLE001 - a value that does not pickle: the caller gets an error instead
            log.exception("runner: cannot send %s", msg[0])
            if msg[0] == "result":
                return self.send(("error", msg[1], error_payload(RuntimeError(f"cannot send the result of {msg[0]}"))))
            return False

    # ---- load ---------------------------------------------------------------------------------
    def load(self, spec: dict) -> bool:
        """Open the model of a ``load`` spec; answers ``ready`` or ``failed``. True when loaded."""
        from ollapy.runner.loader import PathRef, open_local

        r = spec["ref"]
        ref = PathRef(name=r["name"], path=r["path"], digest=r.get("digest"), template=r.get("template"),
                      projector=r.get("projector"))
        try:
            model = open_local(ref, spec["options"], cache=spec["cache"], write_back=spec["write_back"],
                               max_queue=spec["max_queue"])
        except BaseException as exc:  # noqa: BLE001 - every load failure goes to the parent as its error
            self.send(("failed", error_payload(exc)))
            return False
        self.model = model
        facts = ReadyFacts(
            pid=os.getpid(), architecture=model.architecture, template=model.template, facts=model.facts,
            supports_tools=model.supports_tools, supports_thinking=model.supports_thinking,
            embedding_only=model.embedding_only, load_duration_ns=model.load_duration_ns, info=model.info(),
            snapshot=model.snapshot(), cache_block=model.cache_block, supports_insert=model.supports_insert)
        if not self.send(("ready", facts)):
            return False
        threading.Thread(target=self._send_status, name="runner-status", daemon=True).start()
        return True

    def _send_status(self) -> None:
        """The status thread: the model's snapshot every :data:`STATUS_INTERVAL_S` s until it is closed."""
        while not self._stopped.wait(STATUS_INTERVAL_S):
            model = self.model
            if model is None:
                return
            try:
                snap = model.snapshot()
            except Exception:  # noqa: BLE001 - figures only; the next round tries again
                log.debug("runner: snapshot failed", exc_info=True)
                continue
            if not self.send(("status", 0, snap)):
                return

    # ---- serving ------------------------------------------------------------------------------
    def serve(self) -> int:
        """Answer messages until ``close`` or end of file; returns the exit status (0)."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                log.debug("runner: parent gone, closing the model")
                self.close_model(120.0)
                return 0
            except KeyboardInterrupt:  # only the parent signals us, and only during close
                continue
            kind = msg[0]
            if kind == "call":
                self._pool.submit(self._call, *msg[1:])
            elif kind == "submit":
                self._submit(*msg[1:])
            elif kind == "cancel":
                req = self.requests.get(msg[1])
                if req is not None:
                    req.cancel()
            elif kind == "finish":  # Request.finish_early: end it as finished (the caller's own limit)
                req = self.requests.get(msg[1])
                if req is not None:
                    req.finish_early()
            elif kind == "close":
                unsaved = self.close_model(float(msg[2]))
                self.send(("result", msg[1], unsaved))
                return 0
            else:
                log.warning("runner: unknown message %r", kind)

    def _call(self, cid: int, op: str, args: tuple, kwargs: dict) -> None:
        model = self.model
        try:
            if op not in CALLS or model is None:
                raise ValueError(f"unknown runner call {op!r}")
            if op == "embed":
                value = EmbeddingResult.of(model.embed(*args, **kwargs))
            else:
                value = getattr(model, op)(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it in the parent
            self.send(("error", cid, error_payload(exc)))
            return
        self.send(("result", cid, value))

    def _submit(self, rid: int, prompt, options, kwargs: dict) -> None:
        try:
            if self.model is None:
                raise ValueError("no model loaded")
            req = self.model.submit(prompt, options, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            self.send(("error", rid, error_payload(exc)))
            return
        self.requests[rid] = req
        self.send(("result", rid, None))
        ChunkSender(self, rid, req).attach()

    def forward(self, rid: int, req, item) -> None:
        """Send one item the engine pushed into ``req`` (a chunk, or its terminal error); called by the engine's
        loop thread. A parent that is gone cancels the request."""
        if isinstance(item, BaseException):
            self.requests.pop(rid, None)
            self.send(("fail", rid, error_payload(item)))
            return
        if item.done:
            self.requests.pop(rid, None)
        if not self.send(("chunk", rid, item)):
            req.cancel()

    # ---- close --------------------------------------------------------------------------------
    def close_model(self, timeout: float) -> int:
        """Close the model (engine stopped, prompt cache drained within ``timeout`` s); returns states not
        saved. A SIGINT from the parent during the drain stops it early (counted as not saved)."""
        model, self.model = self.model, None
        self._stopped.set()
        if model is None:
            return 0
        try:
            unsaved = model.close(timeout)
        except KeyboardInterrupt:
            unsaved = model.unsaved_states
        self._pool.shutdown(wait=False, cancel_futures=True)
        return int(unsaved or 0)


class ChunkSender:
    """Stands in for a Request's queue so that the engine's own thread sends each chunk as it pushes it (no
    forwarding thread: one less wakeup per token while ggml's threads compute).

    :meth:`attach` swaps it in after submit; chunks the engine pushed before that are sent first, in order.
    """

    def __init__(self, child: RunnerChild, rid: int, req) -> None:
        self.child, self.rid, self.req = child, rid, req
        self._lock = threading.Lock()
        self._held: list | None = []  # items pushed while attaching; None once attached

    def put(self, item) -> None:
        """``Request.push``'s enqueue: send now (engine thread), or hold until attached."""
        with self._lock:
            if self._held is not None:
                self._held.append(item)
                return
        self.child.forward(self.rid, self.req, item)

    def attach(self) -> None:
        """Take the Request's queue over: what it holds already, then what came while swapping, is sent."""
        old, self.req._q = self.req._q, self
        early = []
        while True:
            try:
                early.append(old.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            for item in early + self._held:
                self.child.forward(self.rid, self.req, item)
            self._held = None


def prepare_process() -> None:
    """No core dumps, no gdb backtrace from ggml on an abort."""
    os.environ["GGML_NO_BACKTRACE"] = "1"
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on every platform
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m ollapy.runner.child FD``: serve one model over the socket ``FD``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    prepare_process()
    conn = Connection(int(argv[0]))
    try:
        kind, spec = conn.recv()
    except (EOFError, OSError, KeyboardInterrupt):
        return 0
    if kind != "load":
        return 2
    logging.basicConfig(level=spec.get("log_level", logging.WARNING), stream=sys.stderr, format=LOG_FORMAT)
    child = RunnerChild(conn)
    if not child.load(spec):
        return 1
    return child.serve()


def run(argv: list[str]) -> None:
    """The child's entry point (see :mod:`ollapy.runner.launch`): :func:`main`, then exit without interpreter
    shutdown (the model is closed and its cache drained: nothing is left for it to join)."""
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
