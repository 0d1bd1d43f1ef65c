"""A fake of :class:`ollapy.engine.backend.context.Backend` at the llama.cpp boundary, for scheduling tests.

It keeps per-sequence KV as lists of (position, token) cells with llama.cpp's
non-unified semantics that matter to the planner: a cross-stream ``seq_cp``
copies the cell metadata at once but the buffer contents only at the next
``decode`` (so a ``state_set`` between the two would be overwritten), and
``state_set`` refuses states longer than ``num_ctx`` (returns False, as
``llama_state_seq_set_data`` returns 0). Every call is appended to ``calls``.

Greedy "logits": the next token is ``(last token + 1) % n_vocab``, skipping
token 0, which is the only end-of-generation token.
"""
from __future__ import annotations

import threading

import numpy as np

from ollapy.engine.backend import bindings as real_backend


class FakeBackend:
    """Records calls; ``kv`` maps seq_id -> list of tokens held at positions 0..n-1."""

    def __init__(self, n_parallel: int = 2, num_ctx: int = 256, n_batch: int = 64, n_vocab: int = 50,
                 log: list | None = None) -> None:
        real_backend.finish_imports()  # the real Sampler needs numpy and the ctypes bindings (no model)
        self.n_parallel = n_parallel
        self.num_ctx = num_ctx
        self.n_batch = n_batch
        self.n_ubatch = n_batch
        self.n_vocab = n_vocab
        self.vocab = None
        self.can_shift = True
        self.n_swa = 0
        self.calls: list[tuple] = []
        self.log = log if log is not None else []
        self.kv: dict[int, list[int]] = {i: [] for i in range(n_parallel)}
        self.data: dict[int, list[int]] = {i: [] for i in range(n_parallel)}  # buffer contents (what a decode reads)
        self._queued: list[tuple[int, int]] = []
        self._rows: list[np.ndarray] = []
        self.closed = False
        self.cfg = None
        self.threads = 1
        self.n_decodes = 0
        self.block_at = 0  # > 0: the decode with this number waits for `gate` (a test submits meanwhile)
        self.gate = threading.Event()

    def kv_bytes_per_token(self) -> int:
        return 1000

    def set_threads(self, n: int) -> None:
        self.calls.append(("set_threads", n))
        self.threads = n

    # ---- decode ------------------------------------------------------------------------------
    def decode(self, toks, pos, seqs, want) -> None:
        self.n_decodes += 1
        if self.n_decodes == self.block_at:
            assert self.gate.wait(30), "the test never opened the gate"
        self.calls.append(("decode", len(toks)))
        for src, dst in self._queued:  # llama_kv_cache::update copies queued streams first
            self.data[dst] = list(self.data[src])
        self._queued.clear()
        self._rows = []
        for t, p, s, w in zip(toks, pos, seqs, want):
            assert p == len(self.kv[s]), f"seq {s}: position {p} but it holds {len(self.kv[s])} cells"
            self.kv[s].append(t)
            d = self.data[s]
            del d[p:]
            d.append(t)
            if w:
                assert self.kv[s] == self.data[s], f"seq {s}: KV contents differ from its cells (corrupt)"
                row = np.full(self.n_vocab, -1.0, dtype=np.float32)
                nxt = (t + 1) % self.n_vocab or 1
                row[nxt] = 1.0
                self._rows.append(row)
            else:
                self._rows.append(None)

    def logits_row(self, row: int) -> np.ndarray:
        r = self._rows[row]
        assert r is not None
        return r

    def is_eog(self, tok: int) -> bool:
        return tok == 0

    def token_piece(self, tok: int, special: bool = False) -> bytes:
        return b"t%d " % tok

    # ---- sequences ---------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> bool:
        self.calls.append(("seq_rm", seq, p0, p1))
        cells = self.kv[seq]
        end = len(cells) if p1 < 0 else p1
        del cells[max(0, p0):end]
        del self.data[seq][max(0, p0):end]
        return True

    def seq_clear(self, seq: int) -> None:
        self.calls.append(("seq_clear", seq))
        self.kv[seq] = []
        self.data[seq] = []

    def seq_cp(self, src: int, dst: int) -> None:
        self.calls.append(("seq_cp", src, dst))
        self.kv[dst] = list(self.kv[src])
        self._queued.append((src, dst))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("seq_add", seq, p0, p1, delta))

    def seq_pos_min(self, seq: int) -> int:
        return 0 if self.kv[seq] else -1

    def seq_pos_max(self, seq: int) -> int:
        return len(self.kv[seq]) - 1

    def state_get(self, seq: int) -> bytearray:
        self.calls.append(("state_get", seq))
        return bytearray(np.array(self.kv[seq], dtype=np.int32).tobytes())

    def state_set(self, seq: int, data) -> bool:
        self.calls.append(("state_set", seq))
        toks = np.frombuffer(bytes(data), dtype=np.int32).tolist()
        self.kv[seq] = []
        self.data[seq] = []
        if len(toks) > self.num_ctx:
            return False
        self.kv[seq] = list(toks)
        self.data[seq] = list(toks)
        return True

    def close(self) -> None:
        self.log.append("backend.close")
        self.closed = True
