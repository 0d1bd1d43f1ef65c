"""The prompt cache's block pool without a model: blocks stored once, reference counts, eviction, block files.

States here are synthetic but content-addressed like llama.cpp's: a header, then one cell per position whose
bytes depend only on the tokens up to it (as a cell's K and V do), so two prompts sharing ``k`` blocks of
tokens share ``k`` blocks of bytes. :class:`FakeKV` cuts them the way :mod:`ollapy.cache.kvstate` cuts real
states (blocks of cells, the rest in the tail); the real splitter is tested on real models in
tests/test_kvstate.py and tests/test_cache_block_models.py.
"""
from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ollapy.cache import PromptCache
from ollapy.cache import fileformat as ff
from ollapy.cache.blocks import BLOCK_SUFFIX, GRACE_S, BlockPool, block_path, map_block, write_block
from ollapy.cache.diskcap import LAYOUT, block_usage, disk_usage, enforce_disk_cap
from ollapy.cache.writer import CacheWriter

CELL = 32  # bytes per cell of the synthetic states
B = 64


def fake_state(tokens: list[int]) -> bytearray:
    """A state whose cell ``i`` is a hash of ``tokens[:i + 1]`` (8-byte header: magic, cell count)."""
    out = bytearray(b"FK" + bytes(2) + struct.pack("<I", len(tokens)))
    h = hashlib.blake2b(digest_size=CELL)
    for t in tokens:
        h.update(struct.pack("<i", t))
        out += h.copy().digest()
    return out


class FakeKV:
    """Cuts fake states into blocks of ``b`` cells and joins them back (the API of ollapy.cache.kvstate)."""

    @staticmethod
    def split_state(state, b):
        mv = memoryview(state)
        if bytes(mv[:2]) != b"FK":
            return None
        n = struct.unpack("<I", mv[4:8])[0]
        k = n // b
        blocks = [bytes(mv[8 + i * b * CELL: 8 + (i + 1) * b * CELL]) for i in range(k)]
        tail = bytes(mv[:8]) + struct.pack("<I", b) + bytes(mv[8 + k * b * CELL:])
        return SimpleNamespace(blocks=blocks, tail=tail, n_cells=n)

    @staticmethod
    def join_state(blocks, tail):
        tail = memoryview(tail)
        n = struct.unpack("<I", tail[4:8])[0]
        b = struct.unpack("<I", tail[8:12])[0]
        if len(blocks) != n // b or any(len(x) != b * CELL for x in blocks):
            raise ValueError("blocks do not fit the tail")
        out = bytearray(tail[:8])
        for x in blocks:
            out += x
        out += tail[12:]
        return out


def _bound(root: Path, ram_bytes: int = 1 << 30, disk_bytes: int = 1 << 30, n_swa: int = 0, queue_bytes=None):
    model = root / "m.gguf"
    root.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"GGUF")
    backend = SimpleNamespace(cfg=SimpleNamespace(kv_cache_type="f16", flash_attn="auto"), n_swa=n_swa,
                              token_piece=None)
    digest = "sha256:" + "b" * 64
    ref = SimpleNamespace(path=model, name="m", digest=digest)
    return PromptCache(ref, None, root=root / "cache", ram_bytes=ram_bytes, disk_bytes=disk_bytes, block_tokens=B,
                       splitter=FakeKV, queue_bytes=queue_bytes).bind(
        SimpleNamespace(backend=backend, path=model, digest=digest, name="m"))


def _store(c, tokens, persist=False, pinned=False):
    c.store(list(tokens), lambda: fake_state(list(tokens)), persist=persist, pinned=pinned)


def _restore(c, tokens):
    hit = c.lookup(list(tokens))
    assert hit is not None
    assert hit.verified()
    return hit


SYSTEM = list(range(1000, 1000 + 5 * B + 17))  # 5 full blocks and a partial one


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=B, max_value=6 * B + 5), seed=st.integers(0, 1000))
def test_a_restore_joins_the_chain_back_byte_for_byte(tmp_path_factory, n, seed):
    """Split at store, join at restore (RAM, then disk in a new process's cache): the bytes stored come back."""
    root = tmp_path_factory.mktemp("c")
    toks = [(seed * 7919 + i * 31) % 5000 for i in range(n)]
    c = _bound(root)
    _store(c, toks, persist=True)
    e = next(iter(c.entries.values()))
    assert len(e.blocks) == n // B
    hit = _restore(c, toks)
    assert hit.tier == "ram" and bytes(hit.load()) == bytes(fake_state(toks)) and hit.n_blocks == n // B
    c.record_hit(hit)
    c.close()
    c2 = _bound(root)
    hit = _restore(c2, toks)
    assert hit.tier == "disk" and bytes(hit.load()) == bytes(fake_state(toks))
    c2.record_hit(hit)
    c2.close()


def test_ten_conversations_share_the_system_prompt_blocks_once_in_ram_and_on_disk(tmp_path):
    c = _bound(tmp_path)
    _store(c, SYSTEM, persist=True)
    convs = [SYSTEM + [7000 + 10 * i + j for j in range(2 * B)] for i in range(10)]
    for conv in convs:
        _store(c, conv, persist=True)
    c.flush()
    shared = (len(SYSTEM) // B) * B * CELL
    own = sum((len(x) // B) * B * CELL for x in convs) - 10 * shared
    snap = c.snapshot()
    assert snap.ram_block_bytes == shared + own  # the system prompt's blocks once, not eleven times
    assert snap.ram_shared_bytes == shared
    assert snap.blocks_reused >= 10 * (len(SYSTEM) // B)
    u = block_usage(c.root)
    assert u["entries"] == 11 and u["shared_bytes"] > shared  # block files carry a small header
    assert u["blocks"] == len(c.ram.pool)
    assert u["dedupe_ratio"] > 1.5  # token ids (4 bytes) weigh here against 32-byte cells; real cells are KBs
    for conv in convs:
        assert bytes(_restore(c, conv).load()) == bytes(fake_state(conv))
    c.close()


def test_a_turn_writes_only_the_blocks_that_are_not_there_yet(tmp_path):
    c = _bound(tmp_path)
    conv = list(range(1, 3 * B + 10))
    _store(c, conv, persist=True)
    before = c.snapshot()
    conv2 = conv + list(range(5000, 5000 + 2 * B))
    _store(c, conv2, persist=True)
    after = c.snapshot()
    assert after.blocks_written - before.blocks_written == len(conv2) // B - len(conv) // B
    new_bytes = after.bytes_written - before.bytes_written
    assert new_bytes < len(fake_state(conv2)) - 2 * B * CELL  # not the whole state again
    c.close()


def test_a_divergence_inside_a_block_makes_a_new_block(tmp_path):
    """Copy-on-write: a conversation that differs from another inside block 2 shares blocks 0-1 only, and the
    other conversation's blocks are unchanged."""
    c = _bound(tmp_path)
    a = list(range(1, 4 * B + 1))
    b = a[:2 * B + 5] + [9999] + a[2 * B + 6:]
    _store(c, a)
    names_a = c.entries[c._name(a)].blocks
    _store(c, b)
    names_b = c.entries[c._name(b)].blocks
    assert names_a[:2] == names_b[:2] and not set(names_a[2:]) & set(names_b[2:])
    assert bytes(_restore(c, a).load()) == bytes(fake_state(a))
    assert bytes(_restore(c, b).load()) == bytes(fake_state(b))
    c.close()


def test_reference_counts_under_eviction(tmp_path):
    """A small RAM tier: evicting an entry frees only the blocks no other entry holds; a pinned entry pins its
    blocks; the invariants (bytes, references) hold after every store."""
    one = len(fake_state(SYSTEM + list(range(2 * B))))
    c = _bound(tmp_path, ram_bytes=int(2.5 * one))
    _store(c, SYSTEM, pinned=True)
    c.flush()
    pinned = set(c.entries[c._name(SYSTEM)].blocks)
    for i in range(12):
        _store(c, SYSTEM + [20000 + 100 * i + j for j in range(2 * B)])
        with c._lock:
            c.ram._check()
            assert c.ram.bytes <= c.ram.cap
            held = [e for e in c.ram.entries.values()]
            for name in pinned:  # the pinned entry holds its blocks; every held entry adds one reference
                assert c.ram.pool.refs(name) == sum(name in e.blocks for e in held) >= 1
    snap = c.snapshot()
    assert snap.blocks_evicted > 0 and c._name(SYSTEM) in c.ram.entries
    c.close()


def test_a_vanished_block_is_a_miss_not_corruption(tmp_path):
    c = _bound(tmp_path)
    toks = list(range(1, 3 * B + 1))
    _store(c, toks, persist=True)
    c.close()
    c2 = _bound(tmp_path)
    e = c2.entries[c2._name(toks)]
    block_path(c2.disk.dir, B, e.blocks[1]).unlink()
    assert c2.lookup(toks) is None
    snap = c2.snapshot()
    assert snap.corrupt == 0 and snap.misses == 1  # counted as a miss (`ollapy cache stats`, /metrics)
    assert snap.dangling == 1 and not e.path.exists()  # an entry never whole again is dropped at once (issue 53)
    c2.refresh()
    assert c2._name(toks) not in c2.entries and c2.lookup(toks) is None  # not listed again, no second failed restore
    assert c2.snapshot().misses == 1
    c2.close()


def test_an_eviction_never_deletes_a_block_another_process_just_referenced(tmp_path, monkeypatch):
    """Two caches (two processes' worth: own writers and listings) on one directory. Cache A enforces the disk
    cap from a listing; between that listing and A's deletions cache B writes a new entry on the same system
    prompt, whose blocks an entry A evicts was the only one to name in A's listing. B's entry must restore
    afterwards: A keeps the blocks B touched (issue 53, finding 4)."""
    from ollapy.cache import diskcap

    a = _bound(tmp_path)
    old = SYSTEM + list(range(40000, 40000 + B))
    _store(a, old, persist=True)
    a.close()
    for p in (tmp_path / "cache").rglob("*"):  # written long ago: past every grace
        if p.is_file():
            os.utime(p, (time.time() - 2 * GRACE_S,) * 2)
    b = _bound(tmp_path)
    new = SYSTEM + list(range(50000, 50000 + B))
    real_delete, raced = diskcap.delete_entry_files, []

    def delete_then_race(path, keep_pin=False):
        real_delete(path, keep_pin)
        if not raced:  # the other process writes right after A's listing
            raced.append(path)
            _store(b, new, persist=True)
            assert b.flush()

    monkeypatch.setattr(diskcap, "delete_entry_files", delete_then_race)
    enforce_disk_cap(tmp_path / "cache", 1)
    monkeypatch.undo()
    assert raced, "the eviction deleted nothing"
    b.close()
    c = _bound(tmp_path)
    hit = c.lookup(new)
    assert hit is not None and hit.verified() and bytes(hit.load()) == bytes(fake_state(new))
    assert c.snapshot().dangling == 0
    c.close()


def _fds_and_maps() -> tuple[int, int]:
    return len(os.listdir("/proc/self/fd")), len(Path("/proc/self/maps").read_text().splitlines())


@pytest.mark.parametrize("map_min", [None, 0])
def test_blocks_restored_from_disk_hold_no_file_descriptor(tmp_path, monkeypatch, map_min):
    """Disk hits put their blocks into the RAM tier; each used to hold the descriptor CPython's mmap keeps
    (issue 53: 189 fds after 12 restores, EMFILE past 1,024). Hundreds of blocks held: no descriptor each; with
    every file mapped (``map_min`` 0) one mapping each, unmapped once the cache lets go of them."""
    if map_min is not None:
        from ollapy.cache import filemap

        monkeypatch.setattr(filemap, "MAP_MIN_BYTES", map_min)
    c = _bound(tmp_path)
    convs = [[60000 + 1000 * i + j for j in range(4 * B + 3)] for i in range(60)]
    for conv in convs:
        _store(c, conv, persist=True)
    c.close()
    fds0, maps0 = _fds_and_maps()
    c2 = _bound(tmp_path)
    for conv in convs:
        hit = _restore(c2, conv)
        assert hit.tier == "disk" and bytes(hit.load()) == bytes(fake_state(conv))
        c2.record_hit(hit)
    del hit
    held = len(c2.ram.pool)
    assert held >= 4 * len(convs)
    fds1, maps1 = _fds_and_maps()
    assert fds1 - fds0 < 16, (fds0, fds1, held)  # the cache's own threads and files, not one per block
    if map_min == 0:
        assert maps1 - maps0 >= held  # mapped, each block once
    else:
        assert maps1 - maps0 < 16, (maps0, maps1)  # small blocks are read, not mapped
    c2.close()
    del c2
    gc.collect()
    fds2, maps2 = _fds_and_maps()
    assert maps2 - maps0 < 16 and fds2 - fds0 < 16, (maps0, maps2, fds0, fds2)


def test_a_damaged_block_fails_its_checksum_and_only_it_is_deleted(tmp_path):
    c = _bound(tmp_path)
    toks = list(range(1, 3 * B + 1))
    _store(c, toks, persist=True)
    c.close()
    c2 = _bound(tmp_path)
    e = c2.entries[c2._name(toks)]
    p = block_path(c2.disk.dir, B, e.blocks[0])
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(data)
    hit = c2.load(c2.peek(toks), defer_check=True)
    assert hit is not None and not hit.verified()
    c2.record_corrupt(hit)
    assert not p.exists() and block_path(c2.disk.dir, B, e.blocks[1]).exists()
    assert c2.lookup(toks) is None
    c2.close()


def _write_same_block(args) -> bool:
    path, data, prefix = args
    return write_block(Path(path), data, prefix)


def test_two_processes_writing_the_same_blocks_leave_one_valid_file(tmp_path):
    d = tmp_path / "blocks-64-k1"
    data = os.urandom(3 << 20)
    paths = [d / f"{i:032x}{BLOCK_SUFFIX}" for i in range(6)]
    jobs = [(str(p), data, f".tmp-w{w}-") for p in paths for w in range(4)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        wrote = pool.map(_write_same_block, jobs)
    for i, p in enumerate(paths):
        assert sum(wrote[i * 4:(i + 1) * 4]) == 1  # one writer linked it, the others found it there
        view, crc = map_block(p)
        assert bytes(view) == data and zlib.crc32(view) == crc
    assert sorted(x.name for x in d.iterdir()) == sorted(p.name for p in paths)  # no temporary file left


def test_files_of_another_version_are_left_alone(tmp_path):
    """Rolling upgrade: entry and block files of a format this code does not know, and the old whole-state
    layout, are skipped by the index and never deleted, not even by the disk cap."""
    c = _bound(tmp_path)
    toks = list(range(1, 3 * B + 1))
    _store(c, toks, persist=True)
    c.flush()
    d = c.disk.dir
    future = d / ("f" * 32 + ff.SUFFIX)
    raw = bytearray((d / f"{c._name(toks)}{ff.SUFFIX}").read_bytes())
    raw[8:12] = struct.pack("<I", 99)
    future.write_bytes(raw)
    future_block = d / "blocks-64-k9" / ("e" * 32 + BLOCK_SUFFIX)
    future_block.parent.mkdir()
    future_block.write_bytes(b"OLLAPYKB" + struct.pack("<I", 7) + os.urandom(100))
    odd_block = block_path(d, B, "d" * 32)
    odd_block.write_bytes(b"OTHERMAG" + os.urandom(100))
    old = tmp_path / "cache" / "v1" / d.name / ("a" * 32 + ff.SUFFIX)
    old.parent.mkdir(parents=True)
    ff.write_file(old, c.disk.model_sha256, c.salt, "m", toks, b"x" * 1000)
    c.refresh()
    assert len(c.entries) == 1
    enforce_disk_cap(c.root, 0)  # everything of ours may go; nothing else
    assert future.exists() and future_block.exists() and old.exists()
    assert block_usage(c.root)["unknown_files"] == 1
    c.close()
    c2 = _bound(tmp_path)
    assert future.exists() and c2.lookup(toks) is None
    c2.close()
    c = c2
    os.utime(odd_block, (1, 1))  # long past any grace, referenced by nobody: still another format's file
    enforce_disk_cap(c.root, 0)
    assert odd_block.exists()


def test_the_disk_cap_evicts_entries_then_the_blocks_they_alone_held(tmp_path):
    c = _bound(tmp_path)
    _store(c, SYSTEM, persist=True, pinned=True)
    convs = [SYSTEM + [30000 + 100 * i + j for j in range(3 * B)] for i in range(6)]
    for conv in convs:
        _store(c, conv, persist=True)
    c.flush()
    u = disk_usage(c.root)
    cap = u["disk_bytes"] - 3 * 3 * B * CELL
    enforce_disk_cap(c.root, cap, now=time.time() + GRACE_S + 1)  # blocks written within the grace would stay
    u2 = disk_usage(c.root)
    assert u2["disk_bytes"] <= cap
    left = block_usage(c.root)
    assert left["unreferenced_blocks"] == 0  # the evicted entries' own blocks went with them
    c.close()
    c2 = _bound(tmp_path)
    assert bytes(_restore(c2, SYSTEM).load()) == bytes(fake_state(SYSTEM))  # pinned: its blocks stayed
    c2.close()


def test_the_writer_queue_is_bounded_in_bytes():
    w = CacheWriter(budget=1000)
    gate = threading.Event()
    assert w.submit(lambda _c: gate.wait(10), nbytes=600)
    time.sleep(0.05)
    assert not w.submit(lambda _c: None, nbytes=500)  # 600 + 500 > 1000: refused
    assert w.submit(lambda _c: None, nbytes=400)
    assert w.queued_bytes == 1000 and w.refused == 1
    gate.set()
    assert w.flush(10)
    assert w.queued_bytes == 0
    assert w.submit(lambda _c: None, nbytes=900)
    w.close(10)


def test_a_store_the_queue_cannot_take_is_not_counted_as_written(tmp_path):
    c = _bound(tmp_path, queue_bytes=10 * B * CELL)
    gate = threading.Event()
    c.disk.writer.submit(lambda _c: gate.wait(10), nbytes=9 * B * CELL)
    _store(c, list(range(1, 4 * B)), persist=True)
    assert c.snapshot().files_written == 0 and c.disk.writer.refused == 1
    gate.set()
    c.close()


_KILLED_WRITER = """
import sys, time
from pathlib import Path
from ollapy.cache.blocks import write_block
from ollapy.cache.tempfiles import writer_prefix
n = [0]
def check():
    n[0] += 1
    if n[0] == 2:
        print("writing", flush=True)
        time.sleep(60)
write_block(Path(sys.argv[1]), bytes(64 << 20), writer_prefix(), check)
"""


def test_a_killed_writer_leaves_no_partial_block(tmp_path):
    d = tmp_path / "cache" / LAYOUT / "m-s"
    path = d / "blocks-64-k1" / ("c" * 32 + BLOCK_SUFFIX)
    path.parent.mkdir(parents=True)
    p = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not path.exists()  # never a partial block under the final name
    assert [x for x in path.parent.iterdir()]  # its temporary file is there until reaped
    disk_usage(tmp_path / "cache")  # a listing reaps the dead writer's temporary file
    assert list(path.parent.iterdir()) == []


def test_block_pool_counts():
    pool = BlockPool()
    held, new = pool.acquire(["a", "b"], [b"1" * 10, b"2" * 10])
    assert new == 2 and pool.bytes == 20
    held, new = pool.acquire(["a", "c"], [b"x" * 10, b"3" * 10])
    assert new == 1 and held[0] == b"1" * 10  # the copy already held wins
    assert pool.shared_bytes() == 10
    assert pool.release(["a", "b"]) == 1 and pool.refs("a") == 1
    assert pool.release(["a", "c"]) == 2 and pool.bytes == 0
    pool.check()


def test_snapshot_never_waits_for_a_state_being_copied(tmp_path):
    """/api/ps and /metrics call snapshot() on the event loop: the cache lock is not held while get_state copies
    a state out of llama.cpp (here: blocked until released)."""
    c = _bound(tmp_path)
    toks = list(range(1, 3 * B))
    copying, release = threading.Event(), threading.Event()

    def slow_state():
        copying.set()
        release.wait(30)
        return fake_state(toks)

    t = threading.Thread(target=c.store, args=(toks, slow_state))
    t.start()
    assert copying.wait(30)
    done = threading.Event()
    threading.Thread(target=lambda: (c.snapshot(), done.set()), daemon=True).start()
    assert done.wait(5), "snapshot() waited for a state copy"
    release.set()
    t.join(30)
    assert c.snapshot().ram_entries == 1
    c.close()


def test_verbose_says_how_many_kv_blocks_a_restore_read():
    from ollapy.cli.output import format_stats

    m = {"total_duration": 2 * 10**9, "load_duration": 0, "prompt_eval_count": 2661, "prompt_cache_tokens": 2560,
         "prefix_source": "cache disk", "prompt_cache_blocks": 10, "prompt_eval_duration": 50 * 10**6,
         "eval_count": 4, "eval_duration": 10**8}
    assert "prompt cache:         2560 token(s) reused (cache disk, 10 KV blocks)" in format_stats(m)
    m["prompt_cache_blocks"] = 0
    assert "2560 token(s) reused (cache disk)\n" in format_stats(m) + "\n"


def test_a_block_file_is_written_whole_when_the_kernel_takes_a_few_bytes_a_call(tmp_path, monkeypatch):
    """write_block sends the header with the first chunk in one ``writev`` (a separate small write leaves the
    page cache in small folios: more page faults when a restore maps the block) and resumes after a short write."""
    import ollapy.cache.blocks as blocks_mod

    calls = []
    real = os.writev

    def short_writev(fd, bufs):
        calls.append([len(b) for b in bufs])
        head = bytes(memoryview(bufs[0]).cast("B")[:7])  # at most 7 bytes a call
        return real(fd, [head])

    monkeypatch.setattr(blocks_mod.os, "writev", short_writev)
    data = os.urandom(100)
    p = tmp_path / f"{'ab' * 16}{BLOCK_SUFFIX}"
    assert write_block(p, data, ".tmp-t-")
    assert calls[0] == [blocks_mod._BHDR.size, 100]  # header and data in one call
    assert len(calls) > 100 // 7  # it went on after each short write
    monkeypatch.undo()
    view, crc = map_block(p)
    assert bytes(view) == data and crc == zlib.crc32(data)


_UNDER_ULIMIT = """
import socket, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import test_cache_blocks as t
try:
    from ollapy.cache import filemap
    filemap.MAP_MIN_BYTES = 0  # every block mapped, as a real model's blocks of hundreds of KB are
except ImportError:
    pass
root = Path(sys.argv[1])
convs = [[70000 + 1000 * i + j for j in range(4 * t.B + 3)] for i in range(80)]
c = t._bound(root)
for conv in convs:
    t._store(c, conv, persist=True)
c.close()
c = t._bound(root)
restored = 0
for conv in convs:
    hit = c.lookup(conv)
    if hit is not None and hit.verified() and bytes(hit.load()) == bytes(t.fake_state(conv)):
        c.record_hit(hit)
        restored += 1
srv = socket.create_server(("127.0.0.1", 0))
clients = [socket.create_connection(srv.getsockname()) for _ in range(32)]
accepted = [srv.accept()[0] for _ in range(32)]
print(restored, len(c.ram.pool), len(accepted))
"""


def test_many_restores_under_ulimit_256_leave_descriptors_for_connections(tmp_path):
    """Issue 53 under `ulimit -n 256` (soft and hard: nothing to raise it to): 320 blocks restored from disk and
    held in the RAM tier, every one mapped, then 32 loopback connections accepted."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT, str(tmp_path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["80", "320", "32"], proc.stdout
