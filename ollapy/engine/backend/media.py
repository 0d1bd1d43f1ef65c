"""The libmtmd boundary: a vision projector (mmproj GGUF), image tokenizing, encoding and decoding embeddings.

One of the modules of ``ollapy/engine`` that touch ``llama_cpp`` (its ``mtmd_cpp`` bindings and ``lib/libmtmd.so``).
:class:`Projector` loads a projector against a loaded text model (``mtmd_init_from_file``), splits a prompt text
with media markers plus RGB bitmaps into text and image chunks (``mtmd_tokenize``), encodes an image chunk into
embeddings (``mtmd_encode_chunk``; ``(n_tokens, n_embd)`` float32) and decodes embeddings into one sequence of the
text model's context (``llama_decode`` of an embedding batch, with non-causal attention where the projector asks
for it, as llama.cpp's ``mtmd_helper_decode_image_chunk`` does). Image chunks are owned copies
(:class:`ImageChunk`), freed with :meth:`ImageChunk.free` (also on garbage collection).

Design from llama.cpp's ``tools/mtmd`` (mtmd.h, mtmd-helper.cpp) and its server (an image enters the prompt cache
by a hash of its bitmap; a prompt is never cut inside an image). Models that need M-RoPE positions (Qwen2-VL
family) are refused at load: their image positions are not one per token.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ollapy.engine.backend import bindings
from ollapy.engine.backend.bindings import C
from ollapy.errors import BusyError, DecodeError, ModelLoadError, UsageError

log = logging.getLogger("ollapy.engine")
_IDENTITY_BYTES = 1 << 20


def _mtmd():
    from llama_cpp import mtmd_cpp

    return mtmd_cpp


_BLOB_NAME = re.compile(r"sha256-([0-9a-f]{64})")


def projector_identity(path: Path) -> bytes:
    """16 bytes naming a projector file's whole content: its sha256 (the first 16 bytes).

    A store blob (``blobs/sha256-<hex>``: named by the digest checked when it was pulled, uploaded or linked, also
    through a symlink to it) gives it without reading the file; any other file is hashed once, in 1 MiB reads. Two
    projectors that differ anywhere never share image states in the prompt cache."""
    m = _BLOB_NAME.fullmatch(path.name)
    if m is not None and path.parent.name == "blobs":
        return bytes.fromhex(m.group(1))[:16]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_IDENTITY_BYTES):
            h.update(block)
    return h.digest()[:16]


@dataclass
class ImageChunk:
    """An owned libmtmd image chunk: ``n_tokens`` embeddings (positions) of one image or image slice; ``image_id``
    the id its bitmap was given (:meth:`Projector.tokenize`).

    Reference counted: whoever keeps the chunk holds the first reference (given up with :meth:`free`), a user of
    the native handle takes one more for the time it uses it (:meth:`retain`, :meth:`release`); the libmtmd chunk
    is freed when the last reference is gone, so a chunk dropped by its keeper while the loop thread encodes it
    is freed after the encode, never under it (issue 53).
    """

    handle: int
    n_tokens: int
    non_causal: bool = False
    image_id: str = ""
    _free: object = field(repr=False, default=None)
    _refs: int = field(repr=False, default=1)
    _kept: bool = field(repr=False, default=True)
    _lock: threading.Lock = field(repr=False, default_factory=threading.Lock)

    def retain(self) -> bool:
        """Take a reference for a use of :attr:`handle`; False (none taken) when the chunk was already freed."""
        with self._lock:
            if not self.handle or self._refs <= 0:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        """Give up a reference taken with :meth:`retain`; the last one frees the libmtmd chunk."""
        with self._lock:
            assert self._refs > 0, "image chunk released more often than retained"
            self._refs -= 1
            handle = self.handle if self._refs == 0 else 0
            if handle:
                self.handle = 0
        if handle:
            self._free(handle)

    def free(self) -> None:
        """Give up the keeper's reference (idempotent): the chunk is freed now, or when its last user releases it."""
        with self._lock:
            if not self._kept:
                return
            self._kept = False
        self.release()

    def __del__(self) -> None:  # pragma: no cover - garbage collection (no user can hold a reference any more)
        try:
            if self.handle:
                self._free(self.handle)
                self.handle = 0
        except Exception:  # noqa: BLE001
            pass


class Projector:
    """A vision projector loaded for ``backend``'s text model.

    Raises ModelLoadError when the file is missing, not a projector libmtmd loads, of another width than the text
    model, or needs M-RoPE positions. Thread-safe: one tokenize or encode at a time (a lock).
    """

    def __init__(self, path: str | Path, backend, *, threads: int | None = None) -> None:
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such projector file", hint="pull the model again or fix the Modelfile")
        m = _mtmd()
        self._m = m
        if not bindings._debug():  # libmtmd and clip log on their own: silent like llama.cpp unless OLLAPY_DEBUG
            m.mtmd_log_set(bindings._discard_log, ctypes.c_void_p(0))
            m.mtmd_helper_log_set(bindings._discard_log, ctypes.c_void_p(0))
        self.path = path
        self.backend = backend
        params = m.mtmd_context_params_default()
        params.use_gpu = bool(getattr(backend, "gpu_offload", False))
        params.print_timings = False
        params.n_threads = threads or backend.threads
        params.warmup = False
        self.ctx = m.mtmd_init_from_file(str(path).encode(), backend.model, params)
        if not self.ctx:
            raise ModelLoadError(f"{path}: libmtmd could not load this projector (not an mmproj GGUF, or its width "
                                 f"differs from the text model's)",
                                 hint="use the projector made for this model, or set OLLAPY_DEBUG=1 for llama.cpp's log")
        if not m.mtmd_support_vision(self.ctx):
            self.close()
            raise ModelLoadError(f"{path}: this projector has no vision encoder", hint="use a vision projector")
        if m.mtmd_decode_use_mrope(self.ctx):
            self.close()
            raise ModelLoadError(f"{path}: this projector needs M-RoPE positions (Qwen2-VL family), which ollapy "
                                 f"does not support yet", hint="use a Gemma 3, SmolVLM, LLaVA or similar vision model")
        self.marker = m.mtmd_default_marker().decode()
        self.identity = projector_identity(path)
        self.n_embd = C.llama_model_n_embd(backend.model)
        self._lock = threading.Lock()
        self._batch = None
        self._batch_n = 0

    # ---- tokenizing ---------------------------------------------------------------------------
    def tokenize(self, text: str, images: list[tuple[int, int, bytes, str]]) -> list[list[int] | ImageChunk]:
        """Split ``text`` (with one :attr:`marker` per image) into text token lists and image chunks, in order.

        ``images``: ``(width, height, rgb_bytes, id)`` per marker (RGB, 3 bytes a pixel, row-major; ``id`` names
        the image's pixels). Special tokens are parsed and BOS added as the text model wants. Raises UsageError
        when the markers and images disagree, DecodeError when libmtmd fails otherwise.
        """
        m = self._m
        bitmaps = []
        try:
            for nx, ny, rgb, ident in images:
                buf = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
                bmp = m.mtmd_bitmap_init(nx, ny, buf)
                if not bmp:
                    raise DecodeError(f"libmtmd could not take a {nx}x{ny} image")
                m.mtmd_bitmap_set_id(bmp, ident.encode())
                bitmaps.append(bmp)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            raw = text.encode()
            inp = m.mtmd_input_text(raw, len(raw), True, True)
            chunks = m.mtmd_input_chunks_init()
            try:
                with self._lock:
                    rc = m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
                if rc == 1:
                    raise UsageError(f"the prompt has {text.count(self.marker)} image markers for {len(images)} images",
                                     hint=f"do not write {self.marker} in the prompt text")
                if rc != 0:
                    raise DecodeError(f"libmtmd could not tokenize the prompt (error {rc})",
                                      hint="check the images, or set OLLAPY_DEBUG=1 for llama.cpp's log")
                return self._read_chunks(chunks)
            finally:
                m.mtmd_input_chunks_free(chunks)
        finally:
            for bmp in bitmaps:
                m.mtmd_bitmap_free(bmp)

    def _read_chunks(self, chunks) -> list[list[int] | ImageChunk]:
        m = self._m
        out: list[list[int] | ImageChunk] = []
        for i in range(m.mtmd_input_chunks_size(chunks)):
            ch = m.mtmd_input_chunks_get(chunks, i)
            kind = m.mtmd_input_chunk_get_type(ch)
            if kind == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ptr = m.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(n))
                out.append([ptr[j] for j in range(n.value)])
            elif kind == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                n_tok = m.mtmd_input_chunk_get_n_tokens(ch)
                causal = not m.mtmd_decode_use_non_causal(self.ctx, ch)
                ident = (m.mtmd_input_chunk_get_id(ch) or b"").decode()
                out.append(ImageChunk(m.mtmd_input_chunk_copy(ch), n_tok, not causal, ident, m.mtmd_input_chunk_free))
            else:
                raise UsageError("only images are supported as media", hint="send images, not audio or video")
        return out

    # ---- encoding and decoding ----------------------------------------------------------------
    def encode(self, chunk: ImageChunk):
        """The projector's embeddings of ``chunk``: float32 ``(n_tokens, n_embd)`` (a copy).

        Holds a reference on ``chunk`` (:meth:`ImageChunk.retain`) while libmtmd reads it. Raises BusyError when the
        chunk was already freed (its keeper dropped it: a capacity limit, the request may be sent again),
        DecodeError when the projector fails.
        """
        m = self._m
        np = bindings.np
        if not chunk.retain():
            raise BusyError("an image of this request was dropped before it was encoded (too many images in flight)",
                            hint="send the request again in a moment")
        try:
            with self._lock:
                rc = m.mtmd_encode_chunk(self.ctx, chunk.handle)
                if rc != 0:
                    raise DecodeError(f"the projector could not encode an image (error {rc})",
                                      hint="retry the request")
                ptr = m.mtmd_get_output_embd(self.ctx)
                n = chunk.n_tokens * self.n_embd
                out = np.ctypeslib.as_array(ptr, shape=(n,)).copy()
        finally:
            chunk.release()
        return out.reshape(chunk.n_tokens, self.n_embd)

    def decode(self, embd, start: int, seq: int, non_causal: bool = False) -> None:
        """Decode embeddings ``embd`` (``(n, n_embd)`` float32) at positions ``start..start+n-1`` of ``seq``.

        ``non_causal`` chunks (Gemma 3's, :attr:`ImageChunk.non_causal`) decode the image in one ubatch with causal
        attention off. Loop thread only.
        Raises DecodeError (the sequence may then hold part of the image: the caller trims it).
        """
        b = self.backend
        n = int(embd.shape[0])
        step = n if non_causal else b.n_ubatch
        if non_causal and n > b.n_ubatch:
            raise DecodeError(f"an image of {n} tokens does not fit one batch of {b.n_ubatch}",
                              hint="raise num_batch")
        if self._batch is None or self._batch_n < step:
            if self._batch is not None:
                C.llama_batch_free(self._batch)
            self._batch = C.llama_batch_init(step, self.n_embd, 1)
            self._batch_n = step
        bt = self._batch
        data = embd.astype("float32", copy=False)
        if non_causal:
            C.llama_set_causal_attn(b.ctx, False)
        try:
            for i0 in range(0, n, step):
                k = min(step, n - i0)
                bt.n_tokens = k
                rows = data[i0:i0 + k]
                ctypes.memmove(bt.embd, rows.ctypes.data, rows.nbytes)
                for j in range(k):
                    bt.pos[j] = start + i0 + j
                    bt.n_seq_id[j] = 1
                    bt.seq_id[j][0] = seq
                    bt.logits[j] = 0
                rc = C.llama_decode(b.ctx, bt)
                if rc != 0:
                    what = "no free KV cache space" if rc == 1 else f"llama_decode returned {rc}"
                    raise DecodeError(f"image decode failed: {what}", hint="lower num_parallel or raise num_ctx")
        finally:
            if non_causal:
                C.llama_set_causal_attn(b.ctx, True)

    def close(self) -> None:
        """Free the projector and its batch (idempotent; after the engine loop was joined)."""
        if getattr(self, "_batch", None) is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            self._m.mtmd_free(self.ctx)
            self.ctx = None
