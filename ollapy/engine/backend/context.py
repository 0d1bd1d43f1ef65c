"""The llama.cpp model and context: typed operations over llama.cpp's C API.

A :class:`Backend` owns one ``llama_model`` and ONE ``llama_context`` with
``n_seq_max = n_parallel`` sequences of ``num_ctx`` tokens each (the KV cache is
not unified, so each sequence gets its own stream of ``num_ctx`` cells, as in
llama-server with ``--no-kv-unified``). Decoding, sequences and states are
called from the engine's loop thread only. Tokenizing and token pieces are
also called from other threads (the server builds prompts in worker threads):
those calls use per-call buffers and only add to dicts, which is safe.

Loading the bindings lives in :mod:`.bindings`; templates and grammars in
:mod:`.templating`.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ollapy.engine.backend import bindings, seqstate, window
from ollapy.engine.backend.abort import AbortFlag
from ollapy.engine.backend.adapters import LoraSet
from ollapy.engine.backend.bindings import (
    C,
    choose_extra_bufts,
    finish_imports,
    init_backend,
    one_row_products_differ,
    start_imports,
    tiled_matmul_on,
)
from ollapy.engine.backend.placement import compute_identity, place_layers
from ollapy.engine.cpuload import default_threads
from ollapy.engine.hardware import choose_flash_attn
from ollapy.engine.interrupt import deferred_sigint
from ollapy.errors import DecodeAborted, DecodeError, ModelLoadError
from ollapy.surrogates import replace_surrogates

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("ollapy.engine")


def _logits_address_fn():
    """``llama_get_logits_ith`` returning the address as an int: the binding's ``POINTER(c_float)`` result
    costs a cast per token. Falls back to the binding if its library handle is not where it used to be."""
    lib = getattr(C, "_lib", None)
    if lib is not None and hasattr(lib, "llama_get_logits_ith"):
        return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(("llama_get_logits_ith", lib))
    return lambda ctx, row: ctypes.cast(C.llama_get_logits_ith(ctx, row), ctypes.c_void_p).value


_logits_address = _logits_address_fn()

_KV_TYPES = {"f16": C.GGML_TYPE_F16, "q8_0": C.GGML_TYPE_Q8_0, "q4_0": C.GGML_TYPE_Q4_0}
_FLASH = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def _load_model(path: Path, mp, interrupted: threading.Event):
    """``llama_model_load_from_file`` that stops early once ``interrupted`` is set: the progress callback then
    returns false (llama.h: "If it returns false, model loading is immediately aborted")."""

    @C.llama_progress_callback
    def progress(fraction, user_data):  # pragma: no cover - C callback
        return not interrupted.is_set()

    mp.progress_callback = progress
    return C.llama_model_load_from_file(str(path).encode(), mp)


@dataclass(frozen=True)
class ContextConfig:
    """Load-time settings. ``num_ctx`` is per sequence; ``num_gpu`` -1 = all layers when offload is supported."""

    n_parallel: int = 1
    num_ctx: int = 4096
    num_batch: int = 512
    num_gpu: int = -1
    num_thread: int = 0
    kv_cache_type: str = "f16"
    flash_attn: str = "auto"
    extra_bufts: str = "auto"
    rpc: tuple[str, ...] = ()  # RPC servers ("host:port") whose devices take layers (see .rpc)
    tensor_split: tuple[float, ...] = ()  # proportions per device in .rpc.model_devices order; () = by free memory
    adapters: tuple = ()  # LoRA adapters (.adapters.AdapterSpec), attached to every context of the model


class Backend:
    """One loaded model and its single multi-sequence context.

    Raises ModelLoadError when the file is missing, a directory, not GGUF or
    truncated, or the context cannot be created.
    """

    def __init__(self, path: str | Path, cfg: ContextConfig) -> None:
        path = Path(path)
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file", hint="check the path or run `ollapy list`")
        if path.is_dir():
            raise ModelLoadError(f"{path} is a directory, not a GGUF file", hint="pass the .gguf file inside it")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file", hint="ollapy runs llama.cpp GGUF models")
        init_backend()
        start_imports()  # numpy and the chat formatter import while llama.cpp reads the weights
        self.path = path
        self.cfg = cfg
        self.extra_bufts, self.extra_bufts_reason = choose_extra_bufts(cfg.extra_bufts)
        mp = C.llama_model_default_params()
        offload, self.devices, placement_arrays = place_layers(mp, cfg)
        self.gpu_offload = bool(offload and mp.n_gpu_layers > 0)  # layers go to a GPU (or an RPC device)
        mp.use_extra_bufts = self.extra_bufts
        # Ctrl-C is deferred while llama.cpp works (it would be swallowed in a ctypes callback) and raised here
        with deferred_sigint() as interrupted:
            self.model = _load_model(path, mp, interrupted)
            del placement_arrays  # llama.cpp copied the device list and split while loading
            if interrupted.is_set():
                self.close()
                raise KeyboardInterrupt
            if not self.model:
                raise ModelLoadError(f"{path}: llama.cpp could not load this model (truncated or unsupported GGUF)",
                                     hint="re-download it, or set OLLAPY_DEBUG=1 to see llama.cpp's log")
            # (layers on devices, layers) as llama.cpp counts them: the repeating layers plus the output layer
            n_layers = C.llama_model_n_layer(self.model) + 1
            self.gpu_layers = (min(mp.n_gpu_layers, n_layers), n_layers)
            try:
                self.loras = LoraSet(self.model, cfg.adapters)  # frees what it loaded and raises on a bad adapter
            except ModelLoadError:
                self.close()
                raise
            self.vocab = C.llama_model_get_vocab(self.model)
            self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
            self.n_ctx_train = C.llama_model_n_ctx_train(self.model)
            self.n_parallel = max(1, cfg.n_parallel)
            self.num_ctx = cfg.num_ctx
            self.n_batch = max(cfg.num_batch, self.n_parallel, 8)  # a chunk of 2 aligned to 4 always fits
            cp = C.llama_context_default_params()
            cp.n_ctx = self.num_ctx * self.n_parallel
            cp.n_batch = self.n_batch
            cp.n_ubatch = self.n_ubatch = min(self.n_batch, 512)
            cp.n_seq_max = self.n_parallel
            threads = cfg.num_thread or default_threads()  # the process's own CPUs (affinity, cgroup quota)
            cp.n_threads = threads
            cp.n_threads_batch = threads
            cp.type_k = cp.type_v = _KV_TYPES[cfg.kv_cache_type]
            self.flash_attn = choose_flash_attn(cfg.flash_attn, cfg.kv_cache_type, bool(offload) and mp.n_gpu_layers > 0)
            cp.flash_attn_type = _FLASH[self.flash_attn]
            cp.kv_unified = False
            cp.swa_full = True
            cp.no_perf = True
            self.threads = threads
            self.ctx = C.llama_init_from_model(self.model, cp)
            if interrupted.is_set():
                self.close()
                raise KeyboardInterrupt
        if not self.ctx:
            self.close()
            raise ModelLoadError(f"{path}: could not create a context of {cp.n_ctx} tokens",
                                 hint="lower num_ctx or num_parallel")
        try:
            self.loras.attach(self.ctx)
        except ModelLoadError:
            self.close()
            raise
        self.mem = C.llama_get_memory(self.ctx)
        self.abort_flag = AbortFlag(C)  # a cancel stops the decode in flight (abort.py); outlives the context
        self.abort_flag.install(C, self.ctx)
        # every row of a ubatch computed by the same kernels whatever the batch (engine/speculation.py): tinyBLAS
        # for one row too (or not at all), no tiled K-quant matmul, no repacked weights, nothing on a GPU
        self.row_invariant = (not one_row_products_differ() and not tiled_matmul_on() and not self.extra_bufts
                              and not self.gpu_offload)
        # a decode row's KV cells equal a prompt chunk's, so a finished state keeps the answer (evalorder rule 3):
        # rows computed alike, and no CPU flash attention (one query row takes its split-KV path, several rows its
        # tiled path: ggml-cpu ops.cpp, ggml_compute_forward_flash_attn_ext_f16)
        self.answer_reuse = self.row_invariant and self.flash_attn == "off"
        self.compute_identity = compute_identity(self, cfg)
        self.can_shift = bool(C.llama_memory_can_shift(self.mem))
        self.n_swa = C.llama_model_n_swa(self.model)
        # one KV stream per sequence (kv_unified off); plain KV caches save states any slot count can restore
        self.n_stream = self.n_parallel
        plain_kv = self.n_swa == 0 and not C.llama_model_is_recurrent(self.model) and not C.llama_model_is_hybrid(self.model)
        self.state_layout = seqstate.PORTABLE if plain_kv else f"streams-{self.n_stream}"
        # a state kept as KV blocks restores from the blocks where they lie (ollapy's patched build)
        self.restores_segments = bindings.state_set_segments_fn() is not None
        # per sequence restored with empty cells in front of its sliding window (backend/window.py): the first
        # position whose KV is real (a trim below it would attend to the empty cells)
        self._window_floor: dict[int, int] = {}
        self._batch = C.llama_batch_init(self.n_batch, 0, 1)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._logit_views: dict[int, np.ndarray] = {}
        self.bos = C.llama_vocab_bos(self.vocab)
        self.eos = C.llama_vocab_eos(self.vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        # fill-in-the-middle token ids (-1: none), as llama-server's /infill reads them
        self.fim_ids = tuple(int(f(self.vocab)) for f in (C.llama_vocab_fim_pre, C.llama_vocab_fim_suf,
                                                           C.llama_vocab_fim_mid, C.llama_vocab_fim_pad,
                                                           C.llama_vocab_fim_rep, C.llama_vocab_fim_sep))
        t_wait = time.perf_counter_ns()
        finish_imports()
        self.imports_wait_ns = time.perf_counter_ns() - t_wait  # not model loading: excluded from load_duration
        log.debug("loaded %s: n_ctx=%d (x%d slots) n_batch=%d threads=%d extra_bufts=%s can_shift=%s "
                  "(waited %.0f ms for imports)", path, self.num_ctx, self.n_parallel, self.n_batch, threads,
                  self.extra_bufts_reason, self.can_shift, self.imports_wait_ns / 1e6)

    # ---- metadata -------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """GGUF metadata value as text, or None when absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = C.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def chat_template(self) -> str | None:
        """The GGUF's default ``tokenizer.chat_template``, or None."""
        t = C.llama_model_chat_template(self.model, None)
        return t.decode("utf-8", "replace") if t else None

    def description(self) -> str:
        """llama.cpp's one-line model description (architecture, size, quantization)."""
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.model, buf, len(buf))
        return buf.value.decode()

    def model_size(self) -> int:
        """Total bytes of model tensors."""
        return C.llama_model_size(self.model)

    def token_text(self, token: int) -> str:
        """The vocabulary text of one token (e.g. ``<|im_end|>``)."""
        return (C.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    # ---- tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Tokenize text; returns token ids (BOS added when the model wants it and ``add_special``). A lone
        surrogate, which UTF-8 cannot encode, is read as U+FFFD (ollapy/surrogates.py)."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = replace_surrogates(text).encode("utf-8")
        n_max = len(data) + 8
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_piece(self, token: int, special: bool = False) -> bytes:
        """Raw bytes of one token (may be part of a UTF-8 character); control tokens give b'' unless ``special``.

        Thread-safe: each miss converts into its own buffer (llama_token_to_piece
        releases the GIL, so a shared buffer could be overwritten mid-read). An image's placeholder id (negative,
        ollapy.engine.media) gives ``b"<image>"`` with ``special``, else b''.
        """
        if token < 0:
            return b"<image>" if special else b""
        cache = self._pieces if not special else None
        if cache is not None:
            piece = cache.get(token)
            if piece is not None:
                return piece
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        piece = buf.raw[:n]
        if cache is not None:
            cache[token] = piece
        return piece

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|>, <end_of_turn>...)."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(C.llama_vocab_is_eog(self.vocab, token))
        return eog

    def logits_row(self, row: int) -> np.ndarray:
        """Logits of output row ``row`` of the last decode: a float32 view of shape ``(n_vocab,)``, valid until
        the next decode (writes go to llama.cpp's buffer). Views are cached by address: building one costs more
        than the argmax over it."""
        addr = _logits_address(self.ctx, row)
        if not addr:
            raise DecodeError(f"no logits for batch row {row}")
        view = self._logit_views.get(addr)
        if view is None:
            if len(self._logit_views) > 4096:
                self._logit_views.clear()
            view = self._logit_views[addr] = bindings.np.ctypeslib.as_array((ctypes.c_float * self.n_vocab).from_address(addr))
        return view

    # ---- decode ---------------------------------------------------------------------------
    def decode(self, tokens: array, pos: array, seqs: array, want_logits: array) -> None:
        """Decode one batch of ``len(tokens)`` (≤ n_batch) entries in a single ``llama_decode``.

        ``tokens``/``pos``/``seqs`` are ``array('i')``, ``want_logits`` an
        ``array('b')``. Raises DecodeError on a non-zero return (1 = no KV
        space, other = error), DecodeAborted when :attr:`abort_flag` stopped it; the KV of the batch's sequences
        may then hold part of the batch and must be trimmed by the caller.
        """
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        b.n_tokens = n
        ctypes.memmove(b.token, tokens.buffer_info()[0], 4 * n)
        ctypes.memmove(b.pos, pos.buffer_info()[0], 4 * n)
        ctypes.memmove(b.logits, want_logits.buffer_info()[0], n)
        n_seq, seq_id = b.n_seq_id, b.seq_id
        for i in range(n):
            n_seq[i] = 1
            seq_id[i][0] = seqs[i]
        rc = C.llama_decode(self.ctx, b)
        if rc == 2:  # abort_flag set: llama.cpp removed the failed ubatch's cells
            raise DecodeAborted("decode aborted: every request in the batch was cancelled")
        if rc != 0:
            what = "no free KV cache space" if rc == 1 else f"llama_decode returned {rc}"
            raise DecodeError(f"decode failed: {what}", hint="lower num_parallel or num_ctx, or retry")

    def set_threads(self, n: int) -> None:
        """Decode with ``n`` threads from the next ``llama_decode`` on (``llama_set_n_threads``; loop thread only)."""
        C.llama_set_n_threads(self.ctx, n, n)
        self.threads = n

    # ---- sequences ------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of ``seq`` (p1=-1: to the end). False when llama.cpp cannot do a partial removal."""
        if p0 <= 0 and p1 < 0:
            self._window_floor.pop(seq, None)
        return bool(C.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_clear(self, seq: int) -> None:
        """Remove every cell of ``seq``."""
        self._window_floor.pop(seq, None)
        C.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_cp(self, src: int, dst: int) -> None:
        """Copy all of ``src`` into ``dst`` (whole sequences only: partial copies abort without a unified KV)."""
        self.seq_clear(dst)
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        if src in self._window_floor:
            self._window_floor[dst] = self._window_floor[src]

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions [p0, p1) of ``seq`` by ``delta`` (context shift)."""
        if seq in self._window_floor:  # the empty cells moved too: no trim of this sequence may rely on its window
            self._window_floor[seq] = 1 << 30
        C.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def window_floor(self, seq: int) -> int:
        """The first position of ``seq``'s sliding-window cache that holds real KV (0: every position it holds):
        above ``seq_pos_min`` after a restore that put empty cells in front of the window (backend/window.py)."""
        return self._window_floor.get(seq, 0)

    def seq_pos_min(self, seq: int) -> int:
        """Smallest position held by ``seq`` (-1 when empty); above 0 once a sliding window dropped cells."""
        return C.llama_memory_seq_pos_min(self.mem, seq)

    def seq_pos_max(self, seq: int) -> int:
        """Largest position held by ``seq`` (-1 when empty)."""
        return C.llama_memory_seq_pos_max(self.mem, seq)

    def state_size(self, seq: int) -> int:
        """Bytes of ``seq``'s serialized KV state (``llama_state_seq_get_size``), without copying it."""
        return int(C.llama_state_seq_get_size(self.ctx, seq))

    def state_get(self, seq: int) -> bytearray:
        """Serialized KV state of ``seq`` as a bytearray (empty when it cannot be saved).

        llama.cpp's seq state format, rewritten to the 1-stream layout when
        ``state_layout`` is portable (:mod:`ollapy.engine.backend.seqstate`), so that a
        context with another slot count can restore it.
        """
        size = C.llama_state_seq_get_size(self.ctx, seq)
        out = bytearray(size)
        n = C.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(out), size, seq)
        if n != size:
            del out[n:]
        if self.state_layout == seqstate.PORTABLE:
            out = seqstate.to_portable(out, self.n_stream)
            if out is None:
                log.debug("state of seq %d did not parse as a single-stream state; not saved", seq)
                return bytearray()
        return out  # a bytearray: no extra copy of a state that can be tens of MB

    def state_set(self, seq: int, data, place_window: bool = True) -> bool:
        """Restore a state produced by :meth:`state_get` into ``seq``; False when llama.cpp refuses it.

        ``data``: a buffer, or the state as memory pieces (an object with uint64 arrays ``ptrs``/``sizes`` and a
        ``join()`` method: :class:`ollapy.cache.kvsegments.StateSegments`), read where the pieces lie when
        :attr:`restores_segments`, joined into one buffer first otherwise. A sliding-window cache's cells are
        placed as a cold run places them, modulo the attention's lanes (:mod:`ollapy.engine.backend.window`), so
        a state that ends anywhere restores bit-exact; ``place_window`` False leaves llama.cpp's own placement
        (for the tests that show why).
        """
        floor = 0
        if self.n_swa and place_window:
            if hasattr(data, "ptrs") and not self.restores_segments:
                data = data.join()
            try:
                data, floor = window.place_state(data, self.restores_segments)
            except window.WindowError as exc:
                log.debug("state for seq %d not restored: %s", seq, exc)
                self.seq_clear(seq)  # as llama.cpp leaves a sequence whose state it refused
                return False
        if not self._state_set(seq, data):
            return False
        if floor:
            self._window_floor[seq] = floor
        return True

    def _state_set(self, seq: int, data) -> bool:
        if hasattr(data, "ptrs"):
            if self.restores_segments:
                return self._state_set_segments(seq, data)
            data = data.join()
        if self.state_layout == seqstate.PORTABLE:
            data = seqstate.from_portable(data, self.n_stream)
            if data is None:
                return False
        self.seq_clear(seq)
        try:  # zero-copy view of a writable buffer (bytearray, copy-on-write mmap)
            buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        except TypeError:  # read-only bytes
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        n = C.llama_state_seq_set_data(self.ctx, buf, len(data), seq)
        if n == 0:
            self.seq_clear(seq)
            return False
        return True

    def _state_set_segments(self, seq: int, data) -> bool:
        ptrs, sizes, keep = data.ptrs, data.sizes, []
        if self.state_layout == seqstate.PORTABLE:
            conv = seqstate.from_portable_segments(ptrs, sizes, self.n_stream)
            if conv is None:
                return False
            ptrs, sizes, keep = conv
        assert ptrs.dtype == bindings.np.uint64 and sizes.dtype == bindings.np.uint64 and ptrs.shape == sizes.shape
        self.seq_clear(seq)
        n = bindings.state_set_segments_fn()(self.ctx, ptrs.ctypes.data, sizes.ctypes.data, len(ptrs), seq, 0)
        del keep
        if n == 0:
            self.seq_clear(seq)
            return False
        return True

    def kv_bytes_per_token(self) -> int:
        """Approximate KV bytes per token per sequence (from layer/head dims and the KV type)."""
        n_layer = C.llama_model_n_layer(self.model)
        n_embd = C.llama_model_n_embd(self.model)
        n_head = max(1, C.llama_model_n_head(self.model))
        n_head_kv = max(1, C.llama_model_n_head_kv(self.model))
        head_dim = n_embd // n_head
        per_elem = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}[self.cfg.kv_cache_type]
        return int(2 * n_layer * n_head_kv * head_dim * per_elem)

    def close(self) -> None:
        """Free the batch, context and model (idempotent). Only after the engine loop was joined."""
        if getattr(self, "_batch", None) is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            C.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "loras", None) is not None:
            self.loras.close()  # after the contexts that use them, before the model
        if getattr(self, "model", None):
            C.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
