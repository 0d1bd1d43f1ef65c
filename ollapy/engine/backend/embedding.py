"""Embeddings with llama.cpp's own pooling, on a separate embedding context of the loaded model.

Pooling. The GGUF's ``{arch}.pooling_type`` (mean, cls or last) is used as
given. A model without one gets, in llama.cpp, ``LLAMA_POOLING_TYPE_NONE``
(llama-context.cpp: an unspecified context pooling falls back to the model's
hparams, and an unspecified hparam to NONE), i.e. one vector per token:
``llama-embedding`` then prints per-token vectors and ``llama-server`` refuses
``/v1/embeddings`` ("Pooling type 'none' is not OAI compatible"). Ollama's
llama runner (runner/llamarunner/runner.go) asks ``llama_get_embeddings_seq``
first and falls back to ``llama_get_embeddings_ith`` of the sequence's last
batch row: the hidden state of the last token. ollapy therefore uses
``LLAMA_POOLING_TYPE_LAST`` for causal (decoder) models without a pooling type,
computed by llama.cpp itself, which is Ollama's result and what decoder
embedding models (Qwen3-Embedding, e5-mistral) are trained for; a non-causal
(encoder, e.g. BERT) model without one gets MEAN (sentence-transformers'
default). RANK (rerankers) is refused.

Context. The generation context belongs to the engine loop thread, so an
:class:`Embedder` makes its OWN ``llama_context`` on the same ``llama_model``
(created on the first call, ``embeddings = true``, one unified KV buffer,
``n_seq_max`` = :data:`MAX_SEQS`). For LAST pooling ``n_batch = n_ubatch =
num_batch`` and an input longer than that is fed in chunks into its KV (causal
attention makes the last chunk's last token see the whole input); the other
poolings need a sequence inside one ubatch, so there ``n_batch = n_ubatch =
n_ctx`` = the input limit, ``min(num_ctx, n_ctx_train)``.

Batching. Inputs are packed in order into one ``llama_decode`` each, one
sequence id per input, until the next input would pass ``n_batch`` tokens or
``n_seq_max`` sequences (the rule of llama.cpp's ``llama-embedding``); the KV
is cleared before every decode (embeddings need no history).

Scheduling. Every ``llama_decode`` of the embedding context runs on one thread
the embedder owns (``ollapy-embed``, started on the first call, joined by
:meth:`Embedder.close`); a caller (the server: any of a model's worker threads)
waits for it. With llama.cpp built with OpenMP, each thread that runs a graph
gets its own OpenMP team (``n_threads - 1`` threads that live as long as it), so
decoding on the callers' threads held one team per worker thread (measured in a
30-minute soak: 8 more threads per model, up to 8 x (n_threads - 1)); one owned
thread bounds them to one team. Calls run one at a time, under the embedder's
own lock, while the engine loop keeps generating on its own context: the two
share only the read-only weights and the CPU, so a generation's tokens do not
change (greedy output is the same with or without embeddings running), only
both slow down while they overlap. :meth:`Embedder.close` takes the lock, so it
waits for a decode in flight; the model's ``close()`` calls it before the model
is freed.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import threading
import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ollapy.engine.backend import bindings
from ollapy.engine.backend.bindings import C
from ollapy.engine.backend.context import _FLASH, _KV_TYPES
from ollapy.errors import ContextError, DecodeError, OptionError
from ollapy.store.info import ENCODER_ARCHS  # architectures llama.cpp runs with non-causal attention (encoders)

if TYPE_CHECKING:
    import numpy as np

    from ollapy.engine.backend.context import Backend

log = logging.getLogger("ollapy.engine")

MAX_SEQS = 64  # sequences per decode (llama.cpp allows up to LLAMA_MAX_SEQ = 256)
POOLING_NAMES = {C.LLAMA_POOLING_TYPE_NONE: "none", C.LLAMA_POOLING_TYPE_MEAN: "mean",
                 C.LLAMA_POOLING_TYPE_CLS: "cls", C.LLAMA_POOLING_TYPE_LAST: "last",
                 C.LLAMA_POOLING_TYPE_RANK: "rank"}


def model_pooling(backend: Backend) -> tuple[int, bool, str]:
    """``(pooling_type, causal, source)`` for a loaded model; ``source`` is ``"gguf"`` or ``"default"``.

    Raises OptionError for rerankers (RANK pooling): their output is a score, not an embedding.
    """
    arch = backend.meta("general.architecture") or ""
    causal = arch not in ENCODER_ARCHS and (backend.meta(f"{arch}.attention.causal") or "true") not in ("false", "0")
    raw = backend.meta(f"{arch}.pooling_type")
    try:
        pooling = int(raw) if raw is not None else None
    except ValueError:
        pooling = None
    if pooling == C.LLAMA_POOLING_TYPE_RANK:
        raise OptionError(f"{arch} model is a reranker (pooling_type rank): it gives scores, not embeddings")
    if pooling in (C.LLAMA_POOLING_TYPE_MEAN, C.LLAMA_POOLING_TYPE_CLS, C.LLAMA_POOLING_TYPE_LAST):
        return pooling, causal, "gguf"
    return (C.LLAMA_POOLING_TYPE_LAST if causal else C.LLAMA_POOLING_TYPE_MEAN), causal, "default"


def is_embedding_model(backend: Backend) -> bool:
    """True for an embedding-only model, as Ollama decides it: the GGUF has ``{arch}.pooling_type``, or the
    architecture is an encoder (non-causal attention) such as BERT."""
    arch = backend.meta("general.architecture") or ""
    if backend.meta(f"{arch}.pooling_type") is not None:
        return True
    return arch in ENCODER_ARCHS or (backend.meta(f"{arch}.attention.causal") or "true") in ("false", "0")


@dataclass(frozen=True)
class Embeddings:
    """The result of one :meth:`Embedder.embed` call.

    ``vectors``: float32 array of shape ``(n_inputs, dim)`` in input order
    (L2-normalised when asked; ``dim`` is the model's output width or the
    requested ``dimensions``). ``token_counts``: tokens evaluated per input
    (after truncation); ``truncated``: which inputs were cut to the limit;
    ``duration_ns``: wall time of tokenizing and decoding; ``pooling``: the
    pooling used (``mean``, ``cls``, ``last``).
    """

    vectors: np.ndarray
    token_counts: tuple[int, ...]
    truncated: tuple[bool, ...]
    duration_ns: int
    pooling: str

    @property
    def prompt_tokens(self) -> int:
        """Tokens evaluated over all inputs."""
        return sum(self.token_counts)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows of ``vectors`` (shape ``(n, d)``) scaled to unit L2 norm (an all-zero row stays zero), as Ollama's
    ``normalize``: float32 out. Raises DecodeError on NaN or infinite values."""
    np = bindings.np
    v = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(v).all():
        raise DecodeError("embedding contains NaN or Inf values")
    norms = np.sqrt(np.einsum("ij,ij->i", v.astype(np.float64), v.astype(np.float64)))
    return (v / np.maximum(norms, 1e-12)[:, None]).astype(np.float32)


def shape_vectors(vectors: np.ndarray, *, normalized: bool = True, dimensions: int | None = None) -> np.ndarray:
    """Ollama's post-processing of pooled vectors ``(n, d)``: L2-normalise, then, when ``0 < dimensions < d``,
    keep the first ``dimensions`` values and normalise again (Matryoshka truncation). ``normalized=False``
    returns the raw vectors (``dimensions`` then only cuts). Raises OptionError for ``dimensions`` < 1."""
    if dimensions is not None and dimensions < 1:
        raise OptionError(f"dimensions must be at least 1, got {dimensions}")
    out = normalize(vectors) if normalized else vectors
    if dimensions is not None and dimensions < out.shape[1]:
        out = out[:, :dimensions]
        out = normalize(out) if normalized else out.copy()
    return out


class Embedder:
    """The embedding context of one loaded model (see the module docstring); thread-safe.

    ``num_ctx`` caps each input (with ``n_ctx_train``); ``num_batch`` sets the
    tokens per decode for LAST pooling. Raises ModelLoadError-free errors only:
    OptionError/ContextError (400) for bad inputs, DecodeError (500) when
    llama.cpp fails.
    """

    def __init__(self, backend: Backend, *, num_ctx: int, num_batch: int, max_seqs: int = MAX_SEQS) -> None:
        self.backend = backend
        self.pooling, self.causal, self.pooling_source = model_pooling(backend)
        self.limit = max(1, min(num_ctx, backend.n_ctx_train or num_ctx))
        if self.pooling == C.LLAMA_POOLING_TYPE_LAST:
            self.n_batch = max(1, num_batch)
        else:
            self.n_batch = max(num_batch, self.limit)
        self.n_ctx = max(self.n_batch, self.limit)
        self.max_seqs = max(1, min(max_seqs, 256))
        self.dim = C.llama_model_n_embd_out(backend.model) if hasattr(C, "llama_model_n_embd_out") \
            else C.llama_model_n_embd(backend.model)
        self._lock = threading.Lock()
        # the one thread every decode of this context runs on (its OpenMP team's owner; see the module docstring)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ollapy-embed")
        self._ctx = None
        self._batch = None
        self._closed = False

    @property
    def pooling_name(self) -> str:
        """``mean``, ``cls`` or ``last``."""
        return POOLING_NAMES.get(self.pooling, str(self.pooling))

    # ---- inputs -------------------------------------------------------------------------------
    def prepare(self, inputs: Sequence[str | Sequence[int]], truncate: bool = True) -> tuple[list[list[int]], list[bool]]:
        """Token lists for ``inputs`` (text is tokenized with the model's special tokens, as llama-embedding does;
        token arrays are used as given) and which were truncated.

        Raises OptionError for an empty input list, an input with no tokens, or a token id outside the
        vocabulary; ContextError when ``truncate`` is false and an input has more tokens than the limit
        (``min(num_ctx, n_ctx_train)``). Truncation keeps the start (and a final EOS/SEP the tokenizer adds).
        """
        if len(inputs) == 0:
            raise OptionError("input is empty: give at least one text to embed")
        b = self.backend
        out: list[list[int]] = []
        cut: list[bool] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                toks = b.tokenize(item, add_special=True, parse_special=True)
                auto_end = bool(toks) and (C.llama_vocab_get_add_eos(b.vocab) or C.llama_vocab_get_add_sep(b.vocab))
            else:
                toks = list(item)
                bad = next((t for t in toks if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < b.n_vocab), None)
                if bad is not None:
                    raise OptionError(f"input[{i}]: token id {bad!r} is not in the model's vocabulary (0..{b.n_vocab - 1})")
                auto_end = False
            if not toks:
                raise OptionError(f"input[{i}] is empty: it has no tokens to embed")
            truncated = len(toks) > self.limit
            if truncated:
                if not truncate:
                    raise ContextError(f"input[{i}] has {len(toks)} tokens, more than the context length of "
                                       f"{self.limit} tokens", hint="shorten it, raise num_ctx, or allow truncate")
                toks = toks[: self.limit - 1] + toks[-1:] if auto_end else toks[: self.limit]
            out.append(toks)
            cut.append(truncated)
        return out, cut

    # ---- embedding ----------------------------------------------------------------------------
    def embed(self, inputs: Sequence[str | Sequence[int]], *, truncate: bool = True, normalized: bool = True,
              dimensions: int | None = None) -> Embeddings:
        """Embed ``inputs`` (texts or token-id lists) in as few decodes as fit; see :class:`Embeddings`.

        Errors as :meth:`prepare` and :func:`shape_vectors`; DecodeError when llama.cpp fails or the
        embedder was closed (the model is being unloaded).
        """
        t0 = time.perf_counter_ns()
        if dimensions is not None and dimensions < 1:
            raise OptionError(f"dimensions must be at least 1, got {dimensions}")
        seqs, cut = self.prepare(inputs, truncate)
        raw = self.embed_tokens(seqs)
        vectors = shape_vectors(raw, normalized=normalized, dimensions=dimensions)
        return Embeddings(vectors, tuple(len(s) for s in seqs), tuple(cut), time.perf_counter_ns() - t0,
                          self.pooling_name)

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Raw pooled vectors, float32 of shape ``(len(seqs), dim)``, for token lists already checked by
        :meth:`prepare` (each at most the limit), computed on the embedder's own thread. Raises DecodeError
        (also when the embedder is closed)."""
        try:
            future = self._worker.submit(self._embed_tokens, seqs)
        except RuntimeError:  # the worker was shut down: closed
            raise DecodeError("the model is being unloaded", hint="retry the request") from None
        return future.result()

    def _embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`embed_tokens` on the embedder's thread."""
        np = bindings.np
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        with self._lock:
            if self._closed:
                raise DecodeError("the model is being unloaded", hint="retry the request")
            self._ensure_context()
            i = 0
            while i < len(seqs):
                if len(seqs[i]) > self.n_batch:  # LAST pooling only: chunks of one sequence, its KV kept between
                    self._clear()
                    toks = seqs[i]
                    for start in range(0, len(toks), self.n_batch):
                        self._decode([toks[start:start + self.n_batch]], first_pos=start)
                    out[i] = self._pooled(0)
                    i += 1
                    continue
                group: list[Sequence[int]] = []
                used = 0
                while i + len(group) < len(seqs) and len(group) < self.max_seqs \
                        and used + len(seqs[i + len(group)]) <= self.n_batch:
                    used += len(seqs[i + len(group)])
                    group.append(seqs[i + len(group)])
                self._clear()
                self._decode(group)
                for k in range(len(group)):
                    out[i + k] = self._pooled(k)
                i += len(group)
        return out

    def _ensure_context(self) -> None:
        if self._ctx is not None:
            return
        b = self.backend
        cp = C.llama_context_default_params()
        cp.embeddings = True
        cp.pooling_type = self.pooling
        cp.n_ctx = self.n_ctx
        cp.n_batch = self.n_batch
        cp.n_ubatch = self.n_batch
        cp.n_seq_max = self.max_seqs
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = b.threads
        cp.type_k = cp.type_v = _KV_TYPES[b.cfg.kv_cache_type]
        cp.flash_attn_type = _FLASH[b.flash_attn]
        cp.swa_full = True
        cp.no_perf = True
        ctx = C.llama_init_from_model(b.model, cp)
        if not ctx:
            raise DecodeError(f"could not create an embedding context of {self.n_ctx} tokens",
                              hint="lower num_ctx or num_batch")
        try:
            b.loras.attach(ctx)  # a LoRA model embeds with its adapters, as it generates
        except Exception:
            C.llama_free(ctx)
            raise
        self._ctx = ctx
        self._mem = C.llama_get_memory(ctx)
        self._batch = C.llama_batch_init(self.n_batch, 0, 1)
        log.debug("embedding context for %s: pooling=%s (%s) n_ctx=%d n_batch=n_ubatch=%d n_seq_max=%d",
                  b.path.name, self.pooling_name, self.pooling_source, self.n_ctx, self.n_batch, self.max_seqs)

    def _clear(self) -> None:
        if self._mem:  # encoder-only models have no memory
            C.llama_memory_clear(self._mem, True)

    def _decode(self, group: Sequence[Sequence[int]], first_pos: int = 0) -> None:
        """One ``llama_decode`` of ``group`` (sequence k = group[k]); every token is an output (llama.cpp
        outputs all tokens of an embeddings context anyway)."""
        toks = array("i")
        pos = array("i")
        for seq in group:
            toks.extend(seq)
            pos.extend(range(first_pos, first_pos + len(seq)))
        n = len(toks)
        b = self._batch
        b.n_tokens = n
        ctypes.memmove(b.token, toks.buffer_info()[0], 4 * n)
        ctypes.memmove(b.pos, pos.buffer_info()[0], 4 * n)
        ctypes.memset(b.logits, 1, n)
        n_seq, seq_id = b.n_seq_id, b.seq_id
        row = 0
        for k, seq in enumerate(group):
            for _ in range(len(seq)):
                n_seq[row] = 1
                seq_id[row][0] = k
                row += 1
        rc = C.llama_decode(self._ctx, b)
        if rc != 0:
            raise DecodeError(f"embedding decode failed: llama_decode returned {rc}",
                              hint="lower num_batch or shorten the inputs")

    def _pooled(self, seq: int) -> np.ndarray:
        ptr = C.llama_get_embeddings_seq(self._ctx, seq)
        if not ptr:
            raise DecodeError(f"llama.cpp returned no pooled embedding for sequence {seq}")
        return bindings.np.ctypeslib.as_array(ptr, shape=(self.dim,))

    def close(self) -> None:
        """Free the embedding context (waits for a decode in flight) and join the embedder's thread (its OpenMP
        team goes with it); idempotent. Call before the model is freed, never from the embedder's thread."""
        with self._lock:
            self._closed = True
            if self._batch is not None:
                C.llama_batch_free(self._batch)
                self._batch = None
            if self._ctx:
                C.llama_free(self._ctx)
                self._ctx = None
        self._worker.shutdown(wait=True)  # calls still queued find it closed (DecodeError) before it stops
