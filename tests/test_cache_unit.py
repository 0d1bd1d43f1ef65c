"""Prompt cache without a model: file format checks, the block index under hash collisions, caps, stats."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ollapy import config
from ollapy.cache import fileformat as ff
from ollapy.cache.index import BlockIndex, common_prefix
from ollapy.cache.salt import file_sha256, kv_salt, normalize_digest
from ollapy.cache.stats import Stats, aggregate
from ollapy.cache.tiers import LAYOUT, PIN, Entry, RamTier, disk_usage, enforce_disk_cap

SHA = "a" * 64
SALT = kv_salt("f16", "auto", "0.3.36")


def _write(path: Path, tokens=None, payload=b"x" * 1000, sha=SHA, salt=SALT) -> Path:
    ff.write_file(path, sha, salt, "m", tokens or list(range(100)), payload)
    return path


def test_roundtrip(tmp_path):
    p = _write(tmp_path / "a.kv", payload=os.urandom(5000))
    h = ff.read_header(p, SHA, SALT)
    assert h.tokens == list(range(100))
    assert len(ff.read_payload(h)) == 5000


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip_payload", "flip_tokens", "flip_header", "version",
                                    "magic", "pad"])
def test_damaged_files_fail_checks(tmp_path, damage):
    p = _write(tmp_path / "a.kv", payload=os.urandom(5000))
    data = bytearray(p.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "empty":
        data = bytearray()
    elif damage == "flip_payload":
        data[-100] ^= 1
    elif damage == "flip_tokens":
        h = ff.read_header(p)
        data[h.payload_offset - 8] ^= 1
    elif damage == "flip_header":
        data[40] ^= 1
    elif damage == "version":
        data[8] = 99
    elif damage == "magic":
        data[0] ^= 0xFF
    elif damage == "pad":
        data += b"\0"
    p.write_bytes(bytes(data))
    with pytest.raises(ff.CacheFileError):
        ff.read_payload(ff.read_header(p, SHA, SALT))


def test_foreign_model_and_other_kv_type(tmp_path):
    p = _write(tmp_path / "a.kv")
    with pytest.raises(ff.CacheFileError, match="foreign model"):
        ff.read_header(p, "b" * 64, SALT)
    with pytest.raises(ff.CacheFileError, match="other KV"):
        ff.read_header(p, SHA, kv_salt("q8_0", "auto", "0.3.36"))


def test_quantized_kv_forces_flash_attention_in_salt():
    assert kv_salt("q4_0", "auto", "x")["flash_attn"] == "on"
    assert kv_salt("f16", "auto", "x") != kv_salt("q8_0", "auto", "x")


class _E:
    def __init__(self, tokens):
        self.tokens = tokens


def test_index_finds_longest_verified_prefix():
    idx = BlockIndex(b"salt", block=4)
    a, b = _E(list(range(20))), _E(list(range(10)) + [99] * 10)
    idx.add(a)
    idx.add(b)
    e, n = idx.best(list(range(14)) + [7])
    assert e is a and n == 14
    assert idx.covering(list(range(12))) == [a]
    assert idx.covered_by(list(range(30))) == [a]
    idx.remove(a)
    e, n = idx.best(list(range(14)))
    assert e is b and n == 10


def test_forced_hash_collisions_never_serve_a_wrong_prefix():
    idx = BlockIndex(b"salt", block=4, hash_fn=lambda parent, block: b"same")
    wrong = _E([5] * 40)
    right = _E([1, 2, 3, 4, 5, 6])
    idx.add(wrong)
    idx.add(right)
    e, n = idx.best([9] * 40)
    assert e is None and n == 0  # hashes all collide, tokens don't match
    e, n = idx.best([1, 2, 3, 4, 5, 0])
    assert e is right and n == 5
    assert idx.covering([5] * 8) == [wrong]


def test_common_prefix():
    a = list(range(1000))
    assert common_prefix(a, a[:700] + [-1]) == 700
    assert common_prefix(a, []) == 0


def test_parse_size():
    assert config.parse_size("1GiB") == 1 << 30
    assert config.parse_size("500M") == 500_000_000
    assert config.parse_size("1024") == 1024
    with pytest.raises(ValueError):
        config.parse_size("lots")


def test_ram_tier_cap_and_order():
    r = RamTier(3000)
    es = [Entry(name=str(i), tokens=[i], nbytes=1000, last_used=i) for i in range(5)]
    es[0].hits = 1
    es[1].pinned = True
    for e in es:
        r.put(e, b"x" * 1000)
        assert r.bytes <= 3000
    # evicted: 2 (never hit, oldest unpinned), then 3 (never hit); kept: 0 (served a hit), 1 (pinned), 4 (newest)
    assert set(r.entries) == {"0", "1", "4"}
    assert r.bytes == 3000


def test_ram_tier_evicts_a_state_continued_from_before_the_state_that_continued_it():
    """A conversation's previous turn (restored once, by the turn that went on from it) goes before the newest
    turn's never-hit state; a state restored twice (a branch point) stays."""
    r = RamTier(3000)
    prev = Entry(name="prev", tokens=[1], nbytes=1000, last_used=1, hits=1, continued="restore")
    branch = Entry(name="branch", tokens=[2], nbytes=1000, last_used=0, hits=2, continued="restore")
    newest = Entry(name="newest", tokens=[1, 2], nbytes=1000, last_used=2)
    for e in (branch, prev, newest):
        r.put(e, b"x" * 1000)
    r.put(Entry(name="other", tokens=[9], nbytes=1000, last_used=3), b"x" * 1000)
    assert set(r.entries) == {"branch", "newest", "other"}


def test_disk_cap_keeps_pinned_and_hit_entries(tmp_path):
    d = tmp_path / LAYOUT / "m-s"
    paths = []
    for i in range(6):
        p = _write(d / f"{i}.kv", tokens=list(range(i, i + 100)), payload=b"y" * 10_000)
        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    paths[0].with_suffix(PIN).touch()
    paths[1].with_suffix(".hit").touch()
    size = max(p.stat().st_size for p in paths)  # headers differ by a byte or two (timestamps)
    enforce_disk_cap(tmp_path, 3 * size)
    left = sorted(p.name for p in d.glob("*.kv"))
    assert disk_usage(tmp_path)["disk_bytes"] <= 3 * size
    assert "0.kv" in left and "1.kv" in left and "5.kv" in left


def test_stats_persist_across_processes(tmp_path):
    s = Stats(tmp_path)
    s.add(hits_disk=2, tokens_reused=100)
    s.save()
    dead = tmp_path / "stats" / "999999999-x.json"
    dead.write_text('{"pid": 999999999, "misses": 3}')
    tot = aggregate(tmp_path)
    assert tot["hits_disk"] == 2 and tot["misses"] == 3
    assert not dead.exists()  # folded into total.json
    assert aggregate(tmp_path)["misses"] == 3


def test_stats_of_a_replica_on_another_host_are_never_folded(tmp_path):
    """A cache directory on network storage: a pid from another host says nothing about that process here."""
    d = tmp_path / "stats"
    d.mkdir()
    other = d / "999999999-y.json"
    other.write_text('{"pid": 999999999, "host": "another-host.invalid", "misses": 4}')
    for _ in range(2):  # summed every time, and never folded (which would count it twice once it rewrites)
        assert aggregate(tmp_path)["misses"] == 4
        assert other.exists() and not (d / "total.json").exists()


def test_model_sha_is_memoized(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 1000)
    d = file_sha256(f, tmp_path)
    memo = next((tmp_path / "digests").glob("*.json"))
    memo.write_text(memo.read_text().replace(d, "c" * 64))
    assert file_sha256(f, tmp_path) == "c" * 64  # served from the memo, not re-hashed
    f.write_bytes(b"GGUF" + b"\1" * 1001)
    assert file_sha256(f, tmp_path) != "c" * 64  # size/mtime changed: re-hashed
    assert normalize_digest("sha256:" + "A" * 64) == "a" * 64


def test_writer_killed_mid_write_leaves_nothing_trusted(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from ollapy.cache.tiers import iter_state_files

    d = tmp_path / LAYOUT / "m-s"
    target = d / "big.kv"
    code = (
        "import sys; from pathlib import Path; from ollapy.cache import fileformat as ff\n"
        f"ff.write_file(Path({str(target)!r}), {SHA!r}, {SALT!r}, 'm', list(range(100)), b'z' * (600 << 20))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    tmp = []
    while time.monotonic() < deadline and not tmp:
        tmp = [p for p in d.glob(ff.TMP_PREFIX + "*") if p.stat().st_size > 0] if d.exists() else []
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert tmp, "the writer never started"
    assert not target.exists()  # only the temporary file was written: nothing under a trusted name
    assert [p for p, *_ in iter_state_files(tmp_path)] == []  # no state file; the listing reaps the dead pid's temp
    assert not tmp[0].exists()  # a temporary file whose writer (this host, this pid space) is gone is cleaned up


# ---- the disk writer's lifecycle ----------------------------------------------------------------------------
def _slow_write(writer, d: Path, name: str, chunks: int, delay: float):
    """Queue a write of ``chunks`` x 1 KiB to ``d/name`` through a temp file, checking for abort per chunk."""
    import time

    from ollapy.fsutil import write_atomically

    def job(check):
        def body(f):
            for _ in range(chunks):
                check()
                time.sleep(delay)
                f.write(b"z" * 1024)

        write_atomically(d / name, body, prefix=writer.tmp_prefix, suffix=".kv")

    writer.tmp_dirs.add(d)
    writer.submit(job)


def test_writer_close_drains_every_queued_write(tmp_path):
    from ollapy.cache.writer import CacheWriter, busy_writers

    w = CacheWriter()
    for i in range(3):
        _slow_write(w, tmp_path, f"{i}.kv", chunks=5, delay=0.01)
    assert busy_writers() >= 1  # held strongly while it has work
    res = w.close(timeout=60)
    assert res.unsaved == 0 and res.removed == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.kv", "1.kv", "2.kv"]
    assert w.submit(lambda check: None) is False  # closed: no new work


def test_writer_close_timeout_aborts_and_removes_own_temp_files(tmp_path):
    from ollapy.cache.writer import CacheWriter

    w = CacheWriter()
    _slow_write(w, tmp_path, "big.kv", chunks=10_000, delay=0.01)
    _slow_write(w, tmp_path, "next.kv", chunks=1, delay=0.0)
    res = w.close(timeout=0.3)
    assert res.unsaved == 2  # the running write and the queued one
    assert list(tmp_path.iterdir()) == []  # no temp file, no half-written entry


def test_drain_all_closes_writers_nobody_closed(tmp_path):
    import gc

    from ollapy.cache.writer import CacheWriter, busy_writers, drain_all

    w = CacheWriter()
    _slow_write(w, tmp_path, "orphan.kv", chunks=20, delay=0.01)
    del w
    gc.collect()
    assert busy_writers() >= 1  # the process-wide registry still holds it
    res = drain_all(timeout=60)
    assert res.unsaved == 0 and (tmp_path / "orphan.kv").exists()
    assert busy_writers() == 0


def test_writer_runs_idle_while_serving_and_normal_when_draining(tmp_path):
    import threading
    import time

    from ollapy.cache.writer import CacheWriter

    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("Linux scheduling policies only")
    started, gate = threading.Event(), threading.Event()

    def blocked(check):
        started.set()
        gate.wait(30)

    w = CacheWriter()
    w.submit(blocked)
    assert started.wait(10)
    assert os.sched_getscheduler(w._tid) == os.SCHED_IDLE  # while a model serves: never takes a decode core
    closer = threading.Thread(target=w.close, kwargs={"timeout": 30})
    closer.start()
    deadline = time.monotonic() + 10
    while os.sched_getscheduler(w._tid) != os.SCHED_OTHER and time.monotonic() < deadline:
        time.sleep(0.01)
    policy = os.sched_getscheduler(w._tid)  # read while the job is still blocked: the drain raised it
    gate.set()
    closer.join(30)
    assert policy == os.SCHED_OTHER


def test_temp_files_are_reaped_by_their_owner_or_by_directory_time_never_by_our_clock(tmp_path):
    """A dead writer of this pid space: reaped at once, whatever the times say. Another host's temp file: reaped
    only once the directory (same file server clock) has changed an hour after it last grew, so a clock that
    is hours off on either side neither reaps a live writer's file nor keeps a dead one forever."""
    import subprocess
    import sys
    import time

    from ollapy.cache.tempfiles import pid_space
    from ollapy.cache.tiers import iter_state_files

    d = tmp_path / LAYOUT / "m-s"
    d.mkdir(parents=True)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    now = time.time()
    dead_here = d / f".tmp-{dead}-{pid_space()}-abcdef-x1.kv"
    mine = d / f".tmp-{os.getpid()}-{pid_space()}-abcdef-x2.kv"
    other_host = d / f".tmp-{dead}-0badf00d-abcdef-x3.kv"  # that pid means nothing here
    for p in (dead_here, mine, other_host):
        p.write_bytes(b"partial")
    os.utime(dead_here, (now + 7200,) * 2)  # stamped by a file server whose clock runs two hours ahead
    os.utime(other_host, (now - 7200,) * 2)  # two hours old by our clock...
    os.utime(d, (now - 7200 + 60,) * 2)  # ...but the directory changed only a minute after it: still being written
    list(iter_state_files(tmp_path))
    assert not dead_here.exists() and mine.exists() and other_host.exists()
    os.utime(d, (now - 7200 + 3601,) * 2)  # an hour of directory activity since it last grew: orphaned
    list(iter_state_files(tmp_path))
    assert not other_host.exists() and mine.exists()


def test_a_writer_that_gives_up_removes_only_its_own_temp_files(tmp_path):
    """Two model names on one GGUF share a directory: one writer's timeout never deletes the other's file."""
    import threading

    from ollapy.cache.writer import CacheWriter
    from ollapy.fsutil import write_atomically

    sibling, mine = CacheWriter(), CacheWriter()
    assert sibling.tmp_prefix != mine.tmp_prefix
    started, gate = threading.Event(), threading.Event()

    def held(check):  # the sibling is in the middle of writing a state file
        def body(f):
            f.write(b"half")
            started.set()
            gate.wait(60)

        write_atomically(tmp_path / "sibling.kv", body, prefix=sibling.tmp_prefix, suffix=".kv")

    sibling.tmp_dirs.add(tmp_path)
    sibling.submit(held)
    assert started.wait(60)
    _slow_write(mine, tmp_path, "big.kv", chunks=10_000, delay=0.01)
    res = mine.close(timeout=0.3)
    assert res.unsaved == 1
    assert [p.name.startswith(sibling.tmp_prefix) for p in tmp_path.iterdir()] == [True]
    gate.set()
    assert sibling.close(timeout=60).unsaved == 0
    assert [p.name for p in tmp_path.iterdir()] == ["sibling.kv"]


# ---- portable sequence states -------------------------------------------------------------------------------
def _raw_state(n_stream: int, seq: int, block: bytes) -> bytearray:
    import struct

    out = bytearray(struct.pack("<IiI", 0xAF143CD8, seq, n_stream))
    for s in range(n_stream):
        out += block if s == seq else struct.pack("<I", 0)
    return out


@pytest.mark.parametrize("n_stream,seq", [(1, 0), (4, 0), (4, 2), (4, 3), (2, 1)])
def test_seq_state_rewrites_to_and_from_the_one_stream_layout(n_stream, seq):
    import struct

    from ollapy.engine.backend import seqstate

    block = struct.pack("<I", 3) + bytes(range(1, 200)) + b"\0\0\0\0"  # cell_count 3; may end in zero bytes
    portable = seqstate.to_portable(_raw_state(n_stream, seq, block), n_stream)
    assert bytes(portable) == struct.pack("<IiI", 0xAF143CD8, seq, 1) + block
    for target in (1, 2, 4):
        back = seqstate.from_portable(bytes(portable), target)
        assert bytes(back) == bytes(_raw_state(target, 0, block))[:4] + struct.pack("<i", seq) \
            + bytes(_raw_state(target, 0, block))[8:]


def test_seq_state_that_does_not_parse_is_refused():
    import struct

    from ollapy.engine.backend import seqstate

    assert seqstate.to_portable(_raw_state(2, 0, struct.pack("<I", 3) + b"x" * 10), 4) is None  # wrong count
    head = struct.pack("<Ii", 0xAF143CD8, 0)
    assert seqstate.to_portable(bytearray(head + struct.pack("<III", 2, 0, 0)), 2) is None  # no cells
    two = bytearray(head + struct.pack("<I", 2)) + struct.pack("<I", 1) + b"ab" + struct.pack("<I", 1) + b"cd"
    assert seqstate.to_portable(two, 2) is None  # two streams hold cells
    assert seqstate.from_portable(head + struct.pack("<II", 4, 1), 1) is None  # not in the portable layout
    assert seqstate.to_portable(bytearray(struct.pack("<IiII", 1, 0, 1, 3)), 1) is None  # wrong magic


def _bound(tmp_path: Path, n_swa: int = 0, *, ram_bytes: int | None = None, digest: str | None = "sha256:" + SHA):
    """A BoundCache on a stand-in model (no llama.cpp): the admission rules only see tokens and bytes.

    ``digest`` None: a path model whose sha256 the cache must compute."""
    from types import SimpleNamespace

    from ollapy.cache import PromptCache

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    backend = SimpleNamespace(cfg=SimpleNamespace(kv_cache_type="f16", flash_attn="auto"), n_swa=n_swa, token_piece=None)
    ref = SimpleNamespace(path=model, name="m", digest=digest)
    return PromptCache(ref, None, root=tmp_path / "cache", write_back=True, ram_bytes=ram_bytes).bind(
        SimpleNamespace(backend=backend, path=model, digest=digest, name="m"))


@pytest.mark.parametrize("n_swa", [0, 512])
def test_write_back_keeps_a_short_state_only_a_sliding_window_model_needs(tmp_path, n_swa):
    """A longer file covers a shorter prefix only when states can be trimmed: a sliding-window model
    (whose states serve only whole) must write the short one back too, or the next process misses it."""
    c = _bound(tmp_path, n_swa)
    long_toks, short_toks = list(range(1, 1001)), list(range(1, 201))
    c.store(long_toks, lambda: b"L" * 5000, persist=True)
    c.store(short_toks, lambda: b"S" * 1000)
    c.close()
    written = {len(e.tokens) for e in c.entries.values() if e.on_disk}
    assert written == ({1000} if n_swa == 0 else {1000, 200})
    again = _bound(tmp_path, n_swa)
    cand = again.peek(short_toks + [7, 8, 9])
    assert cand is not None and cand.tier == "disk" and cand.n_tokens == 200
    assert len(cand.entry.tokens) == (200 if n_swa else 1000)  # trimmable: the long file serves its first 200
    again.close()


def test_closing_a_write_back_cache_writes_only_the_newest_one_off_state(tmp_path):
    """`ollapy run --each-line` leaves one RAM-only state per line: at exit only the last answer (the one a
    next process may continue) is written, not all of them."""
    import time

    c = _bound(tmp_path, 0)
    for i in range(5):
        c.store([1000 + i] * 100, lambda: b"Q" * 1000)
        time.sleep(0.01)
    c.close()
    assert sorted(e.tokens[0] for e in c.entries.values() if e.on_disk) == [1004]
    assert c.snapshot().files_written == 1


# ---- the cache's accounting (issue 20 item 4): one test per defect -----------------------------------------
def test_a_disk_hit_forgets_the_ram_only_entries_it_evicts(tmp_path):
    """A RAM-only entry evicted to hold a disk hit's payload exists nowhere else: it leaves the index too,
    instead of taking a candidate slot for the server's lifetime."""
    first = _bound(tmp_path)
    disk_toks = list(range(1, 201))
    first.store(disk_toks, lambda: b"D" * 1000, persist=True)
    first.close()
    c = _bound(tmp_path, ram_bytes=1500)
    ram_toks = list(range(500, 700))
    c.store(ram_toks, lambda: b"R" * 1000)  # a finished request's state: RAM only
    assert c.peek(ram_toks + [1]).tier == "ram"
    cand = c.peek(disk_toks + [7])
    assert cand.tier == "disk" and cand.n_tokens == 200
    c.record_hit(c.load(cand))  # the disk state moves into RAM and evicts the RAM-only one
    assert [e.tokens for e in c.entries.values()] == [disk_toks]
    assert c.index.entries() == [cand.entry]
    snap = c.snapshot()
    assert (snap.entries, snap.ram_entries, snap.ram_bytes, snap.hits_disk) == (1, 1, 1000, 1)
    c.close()


def test_a_disk_hit_changes_the_ram_tier_only_under_the_cache_lock(tmp_path):
    """/api/ps and /metrics read the RAM tier under the lock (snapshot()); a hit must write it under the same lock."""
    first = _bound(tmp_path)
    toks = list(range(1, 201))
    first.store(toks, lambda: b"D" * 1000, persist=True)
    first.close()
    c = _bound(tmp_path)
    held: list[bool] = []
    put = c.ram.put
    c.ram.put = lambda e, payload, blocks=None: (held.append(c._lock._is_owned()), put(e, payload, blocks))[1]
    c.record_hit(c.load(c.peek(toks + [1])))
    assert held == [True]
    assert c.snapshot().ram_bytes == 1000
    c.close()


def test_peek_offers_the_next_shorter_prefix_and_the_smaller_of_equal_ones(tmp_path):
    """A system-prompt state behind a long chat state: excluded, the long one gives way to the shorter prefix."""
    c = _bound(tmp_path)
    system = list(range(1, 129))  # two blocks
    chat = system + list(range(1000, 1400))
    c.store(system, lambda: b"S" * 2_000, persist=True)  # the save point at the end of the system prompt
    c.store(chat, lambda: b"C" * 50_000)  # the conversation's state, RAM only
    prompt = chat[:140] + [7] * 10
    long = c.peek(prompt)
    assert (len(long.entry.tokens), long.n_tokens) == (528, 140)
    short = c.peek(prompt, exclude={long.name})
    assert (short.entry.tokens, short.n_tokens, short.nbytes) == (system, 128, 2_000)
    assert c.peek(prompt, exclude={long.name, short.name}) is None
    assert c.peek(system + [5] * 10).entry.tokens == system  # equally long matches: the smaller state
    c.close()


@pytest.mark.parametrize("defer", [False, True])
def test_a_file_another_replica_rewrote_is_read_again_not_deleted(tmp_path, defer):
    """The header this process cached when it listed the directory is stale once a replica renamed a new copy
    into place: the file is re-read and used, never deleted as corrupt."""
    toks = list(range(1, 201))
    a = _bound(tmp_path)
    a.store(toks, lambda: b"A" * 1000, persist=True)
    a.close()
    b = _bound(tmp_path)  # lists the directory: the header of a's file is cached
    cand = b.peek(toks + [1])
    path = cand.entry.path
    ff.write_file(path, SHA, b.salt, "m", toks, b"B" * 1200)  # another replica rewrites the same entry
    hit = b.load(cand, defer_check=defer)
    assert hit is not None and hit.verified() and bytes(hit.load()) == b"B" * 1200
    b.record_hit(hit)
    assert path.exists() and b.snapshot().corrupt == 0
    b.close()


def test_a_failed_deferred_check_deletes_the_file_only_if_it_was_not_rewritten_since(tmp_path):
    toks = list(range(1, 201))
    a = _bound(tmp_path)
    a.store(toks, lambda: b"A" * 1000, persist=True)
    a.close()
    path = next((tmp_path / "cache").rglob("*.kv"))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))  # corrupt in place (same file)
    for rewritten in (True, False):
        b = _bound(tmp_path)
        hit = b.load(b.peek(toks + [1]), defer_check=True)
        assert not hit.verified()
        if rewritten:  # a replica renamed a good copy into place while this one was being restored
            ff.write_file(path, SHA, b.salt, "m", toks, b"G" * 1000)
        b.record_corrupt(hit)
        assert path.exists() is rewritten and b.snapshot().corrupt == 1
        b.close()
        if rewritten:
            assert bytes(ff.read_payload(ff.read_header(path, SHA, b.salt))) == b"G" * 1000
            path.write_bytes(bytes(data))


def test_peek_never_waits_on_a_directory_listing_that_hangs(tmp_path, monkeypatch):
    """The directory is listed on the cache's sync thread; the engine waits for it a bounded time at most."""
    import threading

    from ollapy.cache.tiers import DiskTier

    c = _bound(tmp_path)
    toks = list(range(1, 201))
    c.store(toks, lambda: b"X" * 1000)
    entered, gate, finished = threading.Event(), threading.Event(), threading.Event()
    listed_on: list[str] = []
    real = DiskTier.listing

    def hung(self):
        listed_on.append(threading.current_thread().name)
        entered.set()
        gate.wait(60)  # a guard only: the disk "comes back" when the test ends
        finished.set()
        return real(self)

    monkeypatch.setattr(DiskTier, "listing", hung)
    c._sync._last_request = float("-inf")  # the index is due for a refresh
    first, second = c.peek(toks + [1]), c.peek(toks + [2])
    assert entered.wait(60) and not finished.is_set()  # both answered while the listing still hangs
    assert (first.tier, first.n_tokens, second.tier) == ("ram", 200, "ram")
    assert listed_on == ["ollapy-cache-sync"]
    gate.set()
    c.close()


def test_an_unhashed_model_never_stalls_the_engine_and_its_early_states_are_kept(tmp_path, monkeypatch):
    """A path model's first request runs while its sha256 is computed: no wait, and its state is not lost."""
    import threading

    from ollapy.cache import manager

    gate, finished = threading.Event(), threading.Event()
    hashed_on: list[str] = []

    def slow_sha(path, root):
        hashed_on.append(threading.current_thread().name)
        gate.wait(60)
        finished.set()
        return SHA

    monkeypatch.setattr(manager, "file_sha256", slow_sha)
    c = _bound(tmp_path, digest=None)
    toks = list(range(1, 201))
    assert c.peek(toks + [1]) is None  # nothing to offer yet, and no wait for the hash
    c.store(toks, lambda: b"E" * 1000)
    assert not finished.is_set()
    gate.set()
    assert c._sync.ready.wait(60)
    cand = c.peek(toks + [1])
    assert (cand.tier, cand.n_tokens) == ("ram", 200)
    assert hashed_on == ["ollapy-cache-sync"]
    c.close()
    assert [e.tokens for e in c.entries.values() if e.on_disk] == [toks]  # written back at close


def test_counters_are_persisted_on_the_sync_thread_never_by_the_engine(tmp_path, monkeypatch):
    import threading
    import time

    from ollapy.cache import stats

    saved_on: list[str] = []
    monkeypatch.setattr(stats, "_write_json", lambda path, data: saved_on.append(threading.current_thread().name))
    c = _bound(tmp_path)
    for _ in range(3):
        c.record_miss()
    deadline = time.monotonic() + 60  # a guard only: the sync thread saves within a second
    while not saved_on and time.monotonic() < deadline:
        time.sleep(0.01)
    assert saved_on == ["ollapy-cache-sync"]
    c.close()


def test_the_bound_cache_is_the_engines_prefix_source(tmp_path):
    """The engine meets the cache only through PrefixSource: same methods, same parameter names."""
    import inspect

    from ollapy.cache.manager import BoundCache, Candidate, Hit
    from ollapy.engine.prefix.source import PrefixCandidate, PrefixHit, PrefixSource

    c = _bound(tmp_path)
    assert isinstance(c, PrefixSource)
    for proto, impl in ((PrefixSource, BoundCache), (PrefixCandidate, Candidate), (PrefixHit, Hit)):
        names = [n for n in vars(proto) if not n.startswith("_")]
        assert names, proto
        for n in names:
            want = getattr(proto, n)
            got = getattr(impl, n, None)
            assert got is not None or n in getattr(impl, "__dataclass_fields__", {}), (impl, n)
            if inspect.isfunction(want) and inspect.isfunction(got):
                assert list(inspect.signature(want).parameters) == list(inspect.signature(got).parameters), n
    c.close()
