"""The remote tier's store client: a Valkey/Redis connection, a circuit breaker, the background write queue.

:class:`RemoteStore` speaks to one Valkey or Redis server (``OLLAPY_CACHE_REMOTE``: ``redis://``,
``rediss://`` (TLS), ``valkey://``, ``valkeys://`` or ``unix://``) through the ``valkey`` client library
(``redis`` where ``valkey`` is not installed); both are the optional extra ``ollapy[remote]``. It offers
what :mod:`ollapy.cache.remote_tier` needs and nothing that lists keys: a pipelined ``EXISTS`` over a list of
keys (one round trip), pipelined ``GET`` s in chunks under a deadline, and ``SET NX`` writes queued for a
background thread.

Faults never fail a request: every operation catches the client's errors, counts them and returns "nothing
there". Round trips on a request's path run under a short socket timeout (``probe_timeout``: a stalled
store costs at most that once); bulk reads under a per-read timeout plus a deadline checked between chunks.
After :data:`BREAKER_ERRORS` errors in a row the breaker opens: the store is skipped for
:data:`BREAKER_OPEN_S` seconds, then one probe (``PING``) decides whether it closes again (the circuit
breaker of Nygard's *Release It!*).

Writes: :meth:`RemoteStore.put_async` appends to a queue bounded in bytes that drops its oldest items when
full; one daemon thread at idle CPU priority (:func:`ollapy.cache.writer.set_thread_priority`) sends them
as pipelined ``SET key value NX`` for blocks (an existing one, written by another replica, is never replaced)
and a plain ``SET`` for entries (the newest state anchored in a block wins: a conversation's next turn).
:meth:`RemoteStore.close` stops it, dropping what is still queued after a bounded wait.

The password never appears in a log line, an error or ``ollapy info``: :func:`redact` is applied to every
URL this module shows.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ollapy.cache.remote_reader import ReadAhead
from ollapy.config import redact_url
from ollapy.errors import OllapyError

log = logging.getLogger("ollapy.cache")

BREAKER_ERRORS = 3  # errors in a row that open the breaker
BREAKER_OPEN_S = 5.0  # seconds the store is skipped before a probe
PROBE_TIMEOUT_S = 0.04  # socket timeout of a round trip on a request's path (EXISTS, a small GET)
READ_TIMEOUT_S = 0.5  # socket timeout of one read of a bulk transfer (each recv, not the whole transfer)
CONNECT_TIMEOUT_S = 0.2
ENTRY_DELAY_S = 1.0  # an entry's values wait this long for a newer state of its key (a turn's later save point)
PENDING_ENTRIES = 256  # entries waiting out that delay, at most
QUEUE_BYTES = 256 << 20  # the write queue's bound; the oldest items are dropped past it
GET_CHUNK = 8  # values per pipelined GET round trip of a bulk read (the deadline is checked between them)
READ_SIZE = 1 << 20  # bytes one receive of a bulk read asks for (the client's default 64 KiB: 16x the GIL hand-offs)
READ_AHEAD_BYTES = 64 << 20  # bytes a bulk read receives ahead of its caller (a restore's buffer is prepared meanwhile)
SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix")
INSTALL_HINT = "pip install 'ollapy[remote]'"

__all__ = ["RemoteStore", "RemoteUnavailable", "StoreStats", "open_store", "redact"]


class RemoteUnavailable(OllapyError):
    """The remote tier cannot be used as configured (no client library, a bad URL, an unreadable password file)."""


def redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***`` (:func:`ollapy.config.redact_url`)."""
    return redact_url(url)


def _client_module():
    """The ``valkey`` module, else ``redis``; RemoteUnavailable naming the extra when neither is installed, or
    when the ``crc32c`` package (the values' checksum, :mod:`ollapy.cache.remote_format`) is missing."""
    try:
        import crc32c  # noqa: F401
    except ImportError:
        raise RemoteUnavailable(f"OLLAPY_CACHE_REMOTE needs the crc32c package: {INSTALL_HINT}") from None
    try:
        import valkey

        return valkey
    except ImportError:
        pass
    try:
        import redis

        return redis
    except ImportError:
        raise RemoteUnavailable(f"OLLAPY_CACHE_REMOTE needs a Valkey/Redis client: {INSTALL_HINT}") from None


def _client_url(url: str, lib_name: str) -> str:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise RemoteUnavailable(f"OLLAPY_CACHE_REMOTE {redact(url)!r}: the scheme must be one of "
                                + ", ".join(f"{s}://" for s in SCHEMES))
    if lib_name == "redis" and scheme in ("valkey", "valkeys"):  # redis-py knows only its own schemes
        url = url.replace(scheme, "redis" if scheme == "valkey" else "rediss", 1)
    return url


@dataclass(frozen=True)
class StoreStats:
    """A snapshot of one store client: counters since it opened and gauges now.

    ``errors`` (operations that failed: timeouts, refused connections), ``bytes_read``/``bytes_written``,
    ``bytes_sent`` (every ``SET`` sent, stored or not),
    ``values_written`` (``SET NX`` that stored), ``values_existing`` (``SET NX`` that found the key there),
    ``dropped`` (queued writes dropped: the queue was full, or the breaker was open), ``superseded`` (entry
    writes a newer state of the same key replaced before they were sent), ``entry_bytes_sent`` (of
    ``bytes_sent``, the entries'), ``read_s`` (seconds spent
    in bulk reads: ``bytes_read / read_s`` is the measured bandwidth), ``probe_ms`` (the last lookup round
    trip), ``queue_depth``/``queue_bytes`` (writes waiting), ``breaker`` ("closed", "open" or "half-open").
    """

    errors: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_sent: int = 0
    values_written: int = 0
    values_existing: int = 0
    dropped: int = 0
    superseded: int = 0
    entry_bytes_sent: int = 0
    read_s: float = 0.0
    probe_ms: float = 0.0
    queue_depth: int = 0
    queue_bytes: int = 0
    breaker: str = "closed"


class RemoteStore:
    """One Valkey/Redis server, used by the remote tier; thread-safe (the client's pools are).

    Raises :class:`RemoteUnavailable` at construction for a missing library or a bad URL; never after: every
    operation answers "nothing there" (and counts an error) when the store fails.
    """

    def __init__(self, url: str, password: str | None = None, *, probe_timeout: float = PROBE_TIMEOUT_S,
                 read_timeout: float = READ_TIMEOUT_S, queue_bytes: int = QUEUE_BYTES,
                 breaker_errors: int = BREAKER_ERRORS, breaker_open_s: float = BREAKER_OPEN_S) -> None:
        lib = _client_module()
        self.url = redact(url)
        curl = _client_url(url, lib.__name__)
        extra = {"password": password} if password else {}
        try:
            self._fast = lib.from_url(curl, socket_timeout=probe_timeout, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                      **extra)
            self._bulk = lib.from_url(curl, socket_timeout=read_timeout, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                      socket_read_size=READ_SIZE, **extra)
        except ValueError as exc:
            raise RemoteUnavailable(f"OLLAPY_CACHE_REMOTE {self.url!r}: {str(exc).replace(url, self.url)}") from None
        self._errors_cls = (lib.RedisError if hasattr(lib, "RedisError") else lib.ValkeyError, OSError)
        self.breaker_errors = breaker_errors
        self.breaker_open_s = breaker_open_s
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._open_until = 0.0
        self._half_open = False
        self._c = {"errors": 0, "bytes_read": 0, "bytes_written": 0, "bytes_sent": 0, "values_written": 0,
                   "values_existing": 0, "dropped": 0, "superseded": 0, "entry_bytes_sent": 0}
        self._read_s = 0.0
        self._probe_ms = 0.0
        self.queue_cap = queue_bytes
        self._queue: deque[tuple[Callable[[], list[tuple[str, list, bool]]], int, str | None]] = deque()
        self._queued = 0
        self._pending: dict[str, tuple[list, float]] = {}  # entry key -> (its values, when they are sent)
        self._urgent = False  # a flush asked for the delayed entries now
        self._sending = False  # the writer holds a write it took off the queue
        self._cv = threading.Condition(self._lock)
        self._closing = False
        self._writer = threading.Thread(target=self._run, name="ollapy-remote-writer", daemon=True)
        self._writer.start()

    # ---- breaker ---------------------------------------------------------------------------
    def available(self) -> bool:
        """False while the breaker is open; after :attr:`breaker_open_s` one ``PING`` decides (half-open)."""
        with self._lock:
            if self._open_until == 0.0:
                return True
            if time.monotonic() < self._open_until or self._half_open:
                return False
            self._half_open = True
        try:
            ok = bool(self._fast.ping())
        except self._errors_cls:
            ok = False
        with self._lock:
            self._half_open = False
            if ok:
                self._open_until, self._in_a_row = 0.0, 0
                log.info("prompt cache: remote store %s answers again", self.url)
            else:
                self._open_until = time.monotonic() + self.breaker_open_s
        return ok

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self._c["errors"] += 1
            self._in_a_row += 1
            opened = self._in_a_row >= self.breaker_errors and self._open_until == 0.0
            if self._in_a_row >= self.breaker_errors:
                self._open_until = time.monotonic() + self.breaker_open_s
        if opened:
            log.warning("prompt cache: remote store %s failing (%s: %s); skipped for %.0f s", self.url, what,
                        type(exc).__name__, self.breaker_open_s)
        else:
            log.debug("prompt cache: remote %s failed: %s", what, type(exc).__name__)

    def _succeeded(self) -> None:
        """A round trip on a request's path answered in time: the error streak ends (a bulk read or a write that
        succeeds slowly does not end it: a store that answers those but stalls lookups still opens the breaker)."""
        with self._lock:
            self._in_a_row = 0

    def breaker_state(self) -> str:
        """``closed`` (in use), ``open`` (skipped) or ``half-open`` (a probe is running)."""
        with self._lock:
            return "closed" if self._open_until == 0.0 else ("half-open" if self._half_open else "open")

    # ---- reads -----------------------------------------------------------------------------
    def exists(self, keys: list[str]) -> list[bool] | None:
        """Which of ``keys`` the store holds, in one pipelined round trip; None when the store failed."""
        if not keys or not self.available():
            return None
        t0 = time.perf_counter()
        try:
            pipe = self._fast.pipeline(transaction=False)
            for k in keys:
                pipe.exists(k)
            out = [bool(x) for x in pipe.execute()]
        except self._errors_cls as exc:
            self._failed("EXISTS", exc)
            return None
        self._succeeded()
        self._probe_ms = (time.perf_counter() - t0) * 1e3
        return out

    def get_one(self, key: str) -> bytes | None:
        """One small value (a request path round trip, under the probe timeout); None when missing or failed."""
        if not self.available():
            return None
        try:
            raw = self._fast.get(key)
        except self._errors_cls as exc:
            self._failed("GET", exc)
            return None
        self._succeeded()
        with self._lock:
            self._c["bytes_read"] += len(raw or b"")
        return raw

    def get_many(self, keys: list[str], deadline: float) -> ReadAhead:
        """The values of ``keys`` in order (None for a missing one), read by pipelined ``GET`` s of
        :data:`GET_CHUNK` keys on a reader thread that starts now and receives up to :data:`READ_AHEAD_BYTES`
        ahead of the caller (:class:`~ollapy.cache.remote_reader.ReadAhead`); the values end early when
        ``time.monotonic()`` passes ``deadline`` or the store fails. The caller closes it (``with`` or
        ``finally``): that stops and joins the thread."""
        chunks = [keys[i:i + GET_CHUNK] for i in range(0, len(keys), GET_CHUNK)]
        return ReadAhead(chunks, self._get_chunk, deadline, self.available, READ_AHEAD_BYTES)

    def _get_chunk(self, keys: list[str]) -> list | None:
        """One pipelined round trip of ``GET`` s (bulk timeout); None (an error counted) when the store failed."""
        t0 = time.perf_counter()
        try:
            pipe = self._bulk.pipeline(transaction=False)
            for k in keys:
                pipe.get(k)
            values = pipe.execute()
        except self._errors_cls as exc:
            self._failed("GET", exc)
            return None
        n = sum(len(v) for v in values if v is not None)
        with self._lock:
            self._c["bytes_read"] += n
            self._read_s += time.perf_counter() - t0
        return values

    def bandwidth(self) -> float | None:
        """Bytes per second the bulk reads measured so far (None before the first MiB)."""
        with self._lock:
            n, s = self._c["bytes_read"], self._read_s
        return n / s if n >= (1 << 20) and s > 0 else None

    # ---- writes ----------------------------------------------------------------------------
    def put_async(self, make: Callable[[], list[tuple[str, list, bool]]], nbytes: int, key: str | None = None) -> bool:
        """Queue a write of about ``nbytes``; the writer thread calls ``make()`` for the values to ``SET``:
        ``(key, pieces, check)``, the pieces of a value joined at send time; ``check`` True (a block, immutable)
        sends it only when an ``EXISTS`` finds the key missing, as ``SET NX`` (no bytes resent, the first copy
        kept); False (an entry) as a plain ``SET``: the newest state anchored in a block replaces an older
        one. Encoding (checksums) runs on the writer thread, never the caller's.

        ``key`` (an entry's key): a newer write of the same key supersedes this one. Still queued, the older
        write is dropped unsent (its blocks are the newer one's: the same anchor is the same block chain); made
        already, its entry values wait :data:`ENTRY_DELAY_S` before they are sent, and a newer entry of the key
        replaces them there; ``superseded`` counts both. (An entry of another key is never superseded, even by a
        state extending it: a shared system prompt's entry is what other conversations find.) The oldest queued
        items are dropped to stay under the queue's bytes. False when refused (closing, breaker open, or larger
        than the whole queue)."""
        with self._cv:
            if self._closing or nbytes > self.queue_cap or self._open_until:
                self._c["dropped"] += 1
                return False
            if key is not None:
                for item in [x for x in self._queue if x[2] == key]:
                    self._queue.remove(item)
                    self._queued -= item[1]
                    self._c["superseded"] += 1
            while self._queue and self._queued + nbytes > self.queue_cap:
                _, n, _ = self._queue.popleft()
                self._queued -= n
                self._c["dropped"] += 1
            self._queue.append((make, nbytes, key))
            self._queued += nbytes
            self._cv.notify()
        return True

    def _next_work(self):
        """(make, nbytes, key) of the next queued write, or (None, due entries) when only entries are due; None
        when closing with nothing left. Waits on the condition (held) until one of those holds."""
        while True:
            now = time.monotonic()
            due = [k for k, (_, t) in self._pending.items() if t <= now]
            if due:
                return None, [self._pending.pop(k)[0] for k in due]
            if self._queue:
                return self._queue.popleft()
            if self._pending and (self._urgent or self._closing):  # a flush: the queue first (it may supersede)
                return None, [self._pending.pop(k)[0] for k in list(self._pending)]
            if self._closing:
                return None
            self._urgent = False
            wait = min((t for _, t in self._pending.values()), default=now + 3600) - now
            self._cv.wait(max(wait, 0.001))

    def _run(self) -> None:
        from ollapy.cache.writer import set_thread_priority

        set_thread_priority(threading.get_native_id(), idle=True)
        while True:
            with self._cv:
                work = self._next_work()
                self._sending = True
            if work is None:
                with self._cv:
                    self._sending = False
                    self._cv.notify_all()
                return
            try:
                if work[0] is None:  # entries whose delay passed (or a flush): sent now
                    self._send([v for values in work[1] for v in values])
                else:
                    self._make_and_send(*work)
            finally:
                with self._cv:
                    if work[0] is not None:
                        self._queued -= work[1]
                    self._sending = False
                    self._cv.notify_all()

    def _make_and_send(self, make, nbytes: int, key: str | None) -> None:
        try:
            values = make()
        except Exception:  # noqa: BLE001 - a state that does not encode is dropped, never the writer
            log.debug("prompt cache: a remote write could not be encoded", exc_info=True)
            with self._lock:
                self._c["dropped"] += 1
            return
        blocks = [v for v in values if v[2]]
        if blocks:
            self._send(blocks)
        entries = [v for v in values if not v[2]]
        if not entries:
            return
        if key is None:
            self._send(entries)
            return
        with self._cv:  # the entry waits a moment: a newer state of the same key replaces it unsent
            if self._pending.pop(key, None) is not None:
                self._c["superseded"] += 1
            self._pending[key] = (entries, time.monotonic() + ENTRY_DELAY_S)
            if len(self._pending) > PENDING_ENTRIES:  # bounded: what waits goes out now
                self._urgent = True

    def _send(self, values: list[tuple[str, list, bool]]) -> None:
        if not self.available():
            with self._lock:
                self._c["dropped"] += 1
            return
        try:
            probe = [k for k, _, check in values if check]
            present: set[str] = set()
            if probe:  # blocks another replica (or an earlier turn) stored already are not sent again
                pipe = self._bulk.pipeline(transaction=False)
                for k in probe:
                    pipe.exists(k)
                present = {k for k, there in zip(probe, pipe.execute()) if there}
            todo = [v for v in values if v[0] not in present]
            pipe = self._bulk.pipeline(transaction=False)
            for key, pieces, check in todo:
                pipe.set(key, b"".join(pieces), nx=check)
            done = pipe.execute() if todo else []
        except self._errors_cls as exc:
            self._failed("SET", exc)
            return
        with self._lock:
            self._c["values_existing"] += len(present)
            for (_key, pieces, check), stored in zip(todo, done):
                n = sum(len(memoryview(p).cast("B")) for p in pieces)
                self._c["bytes_sent"] += n
                if not check:
                    self._c["entry_bytes_sent"] += n
                if stored:
                    self._c["values_written"] += 1
                    self._c["bytes_written"] += n
                else:
                    self._c["values_existing"] += 1

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is queued, delayed entries included, now; wait (at most ``timeout`` s) until it went out.
        True when nothing is left."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._queued or self._pending or self._sending:
                self._urgent = True
                self._cv.notify_all()
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (at most ``timeout`` s, dropped after), stop the writer, close the connections."""
        self.flush(timeout)
        with self._cv:
            self._closing = True
            self._c["dropped"] += len(self._queue) + len(self._pending)
            self._queue.clear()
            self._pending.clear()
            self._cv.notify_all()
        self._writer.join(timeout)
        for client in (self._fast, self._bulk):
            try:
                client.close()
            except self._errors_cls:
                pass

    def snapshot(self) -> StoreStats:
        """The counters and gauges now."""
        state = self.breaker_state()
        with self._lock:
            return StoreStats(**self._c, read_s=self._read_s, probe_ms=self._probe_ms,
                              queue_depth=len(self._queue) + len(self._pending),
                              queue_bytes=self._queued, breaker=state)


def open_store(url: str, password_file: str = "", password: str | None = None) -> RemoteStore:
    """A :class:`RemoteStore` for ``url``; the password is the first line of ``password_file`` when given.

    Raises :class:`RemoteUnavailable` (one line, the URL redacted) for a missing library, a bad URL or an
    unreadable password file.
    """
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as f:
                password = f.readline().strip()
        except OSError as exc:
            raise RemoteUnavailable(f"OLLAPY_CACHE_REMOTE_PASSWORD_FILE {password_file!r}: {exc.strerror}") from None
    return RemoteStore(url, password)
