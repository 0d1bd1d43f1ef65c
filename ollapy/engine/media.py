"""Images in prompts: decoding, limits, their place in the token sequence and in the prefix identity.

A prompt with images is still a list of token ids (:class:`~ollapy.engine.request.Prompt`), so the slot's KV
bookkeeping, the prefix planner and the prompt cache work unchanged: each image chunk of ``n`` embeddings takes
``n`` positions holding *placeholder ids* (negative int32 values, never a vocabulary id), derived from a hash of
the image's decoded RGB pixels, its size, the projector's identity and the position within the chunk
(:func:`placeholder_ids`). The same picture resent (a new base64 string, or PNG instead of JPEG with equal
pixels) gives the same ids, so it is a prefix hit; any other image differs from its first position on. This is
llama.cpp server's rule (it keys a cached image by a hash of its bitmap, ``server_tokens``) expressed in tokens.

:class:`MediaSpan` records where an image chunk sits; the engine decodes its embeddings in one piece, never cuts a
prompt chunk, a reused prefix (:func:`floor_outside`) or a context shift inside one, and drops cache save points
inside one (:func:`points_outside`). :class:`MediaPrompter` builds such prompts with a
:class:`~ollapy.engine.backend.media.Projector` and encodes a span's chunk when the engine reaches it (lazily: a
prefix served from a slot or the prompt cache is never encoded again).

Images are decoded with Pillow into RGB (first frame, EXIF orientation ignored), in the formats the APIs promise
and no others (:data:`FORMATS`: no EPS, so never Ghostscript; no plugin a client could pick by the file's first
bytes). Limits, each checked from the file's header before its pixels are decoded: :data:`MAX_IMAGES` per
request, :data:`MAX_IMAGE_BYTES` per encoded image, :data:`MAX_PIXELS` per decoded image, the request's decoded
pixels in all (``OLLAPY_REQUEST_IMAGE_PIXELS``: over it a 400) and the pixels all requests of the process hold at
once while their prompts are built (``OLLAPY_SERVER_IMAGE_PIXELS``, :data:`SERVER_PIXELS`: over it a 503, the
server's capacity). Issue 53: 16 solid 6,000 x 6,000 PNGs, 0.1 MB each on the wire, grew a server by 4 GB.
"""
from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import io
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ollapy.errors import BusyError, ImageError

#: the most images one request may carry
MAX_IMAGES = 16
#: the largest encoded image accepted, bytes
MAX_IMAGE_BYTES = 20 * 1024 * 1024
#: the most pixels a decoded image may have (width x height)
MAX_PIXELS = 40_000_000
#: image chunks kept tokenized between building a prompt and the engine reaching them
KEPT_CHUNKS = 64
#: the image formats decoded (Pillow format names): what docs/vision.md promises
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_FORMAT_HINT = "send a PNG, JPEG, WebP, GIF or BMP image"


class PixelBudget:
    """Decoded pixels held at once by the requests of this process, bounded by ``OLLAPY_SERVER_IMAGE_PIXELS``.

    :meth:`reserve` takes a request's pixels before its images are decoded and gives them back when its prompt is
    built (the decoded RGB is garbage then: libmtmd holds its own bitmaps). Thread-safe.
    """

    def __init__(self, capacity: int | None = None) -> None:
        """``capacity``: pixels; None reads ``OLLAPY_SERVER_IMAGE_PIXELS`` at each reservation."""
        self._capacity = capacity
        self.held = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """The bound, in pixels."""
        if self._capacity is not None:
            return self._capacity
        from ollapy import config

        return config.server_image_pixels()

    def reserve(self, pixels: int) -> PixelReservation:
        """Hold ``pixels`` until the returned reservation is released (a context manager). Raises BusyError
        (HTTP 503) when the process holds too many already."""
        cap = self.capacity
        with self._lock:
            if self.held + pixels > cap and self.held:
                raise BusyError(f"the server is decoding {self.held:,} image pixels; {pixels:,} more would pass its "
                                f"limit of {cap:,} (OLLAPY_SERVER_IMAGE_PIXELS)", hint="send the request again in a "
                                "moment")
            self.held += pixels
        return PixelReservation(self, pixels)

    def _release(self, pixels: int) -> None:
        with self._lock:
            self.held -= pixels
            assert self.held >= 0, self.held


class PixelReservation:
    """Pixels held in a :class:`PixelBudget` until :meth:`release` (idempotent) or the end of a ``with`` block."""

    def __init__(self, budget: PixelBudget | None, pixels: int) -> None:
        self._budget = budget
        self.pixels = pixels

    def release(self) -> None:
        """Give the pixels back."""
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._release(self.pixels)

    def __enter__(self) -> PixelReservation:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


#: the pixel budget of this process (a server's, a CLI's, a runner child's)
SERVER_PIXELS = PixelBudget()
NO_RESERVATION = PixelReservation(None, 0)


@dataclass(frozen=True)
class MediaSpan:
    """One image chunk in a prompt: positions ``[start, start + n_tokens)``, its chunk key, its attention kind."""

    start: int
    n_tokens: int
    key: str
    non_causal: bool = False

    @property
    def end(self) -> int:
        """One past the span's last position."""
        return self.start + self.n_tokens


@dataclass(frozen=True)
class DecodedImage:
    """An image decoded to RGB: ``width`` x ``height`` pixels, ``rgb`` 3 bytes a pixel row-major, ``digest``
    (hex) of its size and pixels."""

    width: int
    height: int
    rgb: bytes
    digest: str


def decode_base64_image(data: str, what: str = "image") -> bytes:
    """The bytes of a base64 image (a ``data:`` URI's payload too). Raises ImageError for bad base64."""
    if isinstance(data, str) and data.startswith("data:"):
        head, _, data = data.partition(",")
        if ";base64" not in head:
            raise ImageError(f"{what}: only base64 data: URIs are supported", hint="send data:image/png;base64,...")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ImageError(f"{what} is not valid base64", hint="send the image file's bytes base64-encoded") from None
    return raw


def refuse_remote(url: str, what: str = "image") -> None:
    """Raise ImageError for an ``http(s)`` image URL: images are sent inline; the server never fetches."""
    raise ImageError(f"{what}: remote image URLs ({url[:60]}) are not fetched",
                     hint="send the image inline as a base64 data: URI")


def _open(raw: bytes, what: str, decode: bool):
    """Pillow's image of ``raw`` in one of :data:`FORMATS`, its size checked; loaded and converted to RGB when
    ``decode``, else only its header read. Raises ImageError."""
    from PIL import Image, UnidentifiedImageError

    if not raw:
        raise ImageError(f"{what} is empty (0 bytes)", hint="send the image file's contents")
    if len(raw) > MAX_IMAGE_BYTES:
        raise ImageError(f"{what} is {len(raw):,} bytes, over the limit of {MAX_IMAGE_BYTES:,}",
                         hint="send a smaller image")
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow's own bomb check (an error past twice this) backs ours up
    try:
        with Image.open(io.BytesIO(raw), formats=FORMATS) as im:
            w, h = im.size
            if w * h > MAX_PIXELS:
                raise ImageError(f"{what} is {w}x{h} pixels, over the limit of {MAX_PIXELS:,} pixels",
                                 hint="send a smaller image")
            if not decode:
                return w, h
            im.load()
            return w, h, im.convert("RGB")
    except UnidentifiedImageError:
        raise ImageError(f"{what} is not an image in a format ollapy reads", hint=_FORMAT_HINT) from None
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(f"{what} has too many pixels, over the limit of {MAX_PIXELS:,} pixels",
                         hint="send a smaller image") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageError(f"{what} could not be decoded ({exc})", hint="the file is corrupt or truncated: send it "
                         "again") from None


def image_size(raw: bytes, what: str = "image") -> tuple[int, int]:
    """``(width, height)`` of image file bytes, from the header only (nothing decoded). Raises ImageError as
    :func:`decode_image` does for what its header shows (empty, too large, not a format of :data:`FORMATS`)."""
    return _open(raw, what, decode=False)


def check_request_pixels(sizes: Sequence[tuple[int, int]]) -> int:
    """The decoded pixels of a request's images of ``sizes``; raises ImageError (a 400) when they pass
    ``OLLAPY_REQUEST_IMAGE_PIXELS``."""
    from ollapy import config

    total = sum(w * h for w, h in sizes)
    limit = config.request_image_pixels()
    if total > limit:
        raise ImageError(f"the request's {len(sizes)} images are {total:,} pixels in all, over the limit of "
                         f"{limit:,} (OLLAPY_REQUEST_IMAGE_PIXELS)", hint="send fewer or smaller images")
    return total


def decode_image(raw: bytes, what: str = "image") -> DecodedImage:
    """Decode image file bytes (a format of :data:`FORMATS`) to RGB with Pillow. Raises ImageError (empty, too
    large, corrupt, truncated, unsupported format), with the limit's number where one was passed."""
    w, h, rgb = _open(raw, what, decode=True)
    data = rgb.tobytes()
    digest = hashlib.blake2b(f"{w}x{h}:".encode() + data, digest_size=16).hexdigest()
    return DecodedImage(w, h, data, digest)


def check_count(n: int) -> None:
    """Raise ImageError when a request carries more than :data:`MAX_IMAGES` images."""
    if n > MAX_IMAGES:
        raise ImageError(f"{n} images in one request, over the limit of {MAX_IMAGES}", hint="send fewer images")


def placeholder_ids(key: str, n: int) -> list[int]:
    """``n`` placeholder ids of chunk ``key``: negative int32 values (never a vocabulary id), one hash per position."""
    out = []
    base = key.encode()
    for i in range(n):
        v = int.from_bytes(hashlib.blake2b(base + i.to_bytes(4, "little"), digest_size=4).digest(), "little")
        out.append(-1 - (v & 0x7FFFFFFE))
    return out


def span_at(spans: Sequence[MediaSpan], pos: int) -> MediaSpan | None:
    """The span starting at ``pos``, or None."""
    for sp in spans:
        if sp.start == pos:
            return sp
    return None


def floor_outside(n: int, spans: Sequence[MediaSpan]) -> int:
    """``n`` lowered to the start of the span it would cut (a prefix of ``n`` positions never ends inside one)."""
    for sp in spans:
        if sp.start < n < sp.end:
            return sp.start
    return n


def clip_chunk_end(start: int, end: int, spans: Sequence[MediaSpan]) -> int:
    """The end of a text chunk ``[start, end)``: at the first span starting after ``start`` and before ``end``."""
    for sp in spans:
        if start < sp.start < end:
            end = sp.start
    return end


def points_outside(points: Sequence[int], spans: Sequence[MediaSpan]) -> tuple[int, ...]:
    """Save points that do not fall inside a span (a state ends before an image or after it)."""
    return tuple(p for p in points if floor_outside(p, spans) == p)


class MediaPrompter:
    """Builds image prompts for one loaded model and encodes their chunks when the engine reaches them.

    ``projector``: a :class:`~ollapy.engine.backend.media.Projector`. Chunks wait in a bounded map (the last
    :data:`KEPT_CHUNKS`), keyed by :attr:`MediaSpan.key`.
    """

    def __init__(self, projector) -> None:
        self.projector = projector
        self.marker = projector.marker
        self._chunks: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._lock = threading.Lock()

    def build(self, text: str, images: Sequence[DecodedImage]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """Tokens (with placeholder ids) and spans of ``text`` whose :attr:`marker` s stand for ``images`` in order.

        Raises ImageError when the markers and images disagree or the model's vocabulary lacks the projector's
        image tokens.
        """
        ident = self.projector.identity.hex()
        parts = self.projector.tokenize(text, [(im.width, im.height, im.rgb, im.digest) for im in images])
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        nth: dict[str, int] = collections.Counter()
        for part in parts:
            if isinstance(part, list):
                if any(t < 0 for t in part):
                    raise ImageError("this model's vocabulary lacks the projector's image tokens",
                                     hint="use the projector made for this model")
                tokens.extend(part)
                continue
            # chunks of one image (an overview and its slices) carry its digest (the bitmap id); key: pixels + nth
            key = f"{ident}:{part.image_id}:{nth[part.image_id]}:{part.n_tokens}"
            nth[part.image_id] += 1
            spans.append(MediaSpan(len(tokens), part.n_tokens, key, part.non_causal))
            tokens.extend(placeholder_ids(key, part.n_tokens))
            self._keep(key, part)
        if spans and spans[-1].end == len(tokens):  # the last prompt position must be a token (its logits row)
            tokens.extend(self.projector.backend.tokenize("\n", add_special=False, parse_special=False))
        return tokens, tuple(spans)

    def _keep(self, key: str, chunk) -> None:
        """Keep ``chunk`` under ``key``. A chunk already kept under the key stays (the key names its content: the
        same pixels, projector and slice) and ``chunk`` is freed; over :data:`KEPT_CHUNKS` the least recently
        used is given up. Giving up is :meth:`ImageChunk.free`: a chunk being encoded is freed after its encode."""
        drop = []
        with self._lock:
            if key in self._chunks:
                self._chunks.move_to_end(key)
                drop.append(chunk)
            else:
                self._chunks[key] = chunk
            while len(self._chunks) > KEPT_CHUNKS:
                drop.append(self._chunks.popitem(last=False)[1])
        for ch in drop:
            ch.free()

    def embed(self, span: MediaSpan):
        """The embeddings of ``span``'s chunk (``(n_tokens, n_embd)`` float32) and the ns it took to encode them.

        Raises BusyError (HTTP 503, a server capacity limit: the request may be sent again) when the chunk is no
        longer kept (more than :data:`KEPT_CHUNKS` image chunks were tokenized since), DecodeError when the
        projector fails. The projector holds a reference on the chunk while it encodes it.
        """
        with self._lock:  # a reference taken under the keeper's lock: the chunk cannot be freed under the encode
            chunk = self._chunks.get(span.key)
            if chunk is not None and chunk.retain():
                self._chunks.move_to_end(span.key)
            else:
                chunk = None
        if chunk is None:
            raise BusyError("an image of this request was dropped before it was encoded (too many images in "
                            "flight)", hint="send the request again in a moment")
        try:
            t0 = time.perf_counter_ns()
            embd = self.projector.encode(chunk)
            return embd, time.perf_counter_ns() - t0
        finally:
            chunk.release()

    def decode(self, embd, start: int, seq: int, span: MediaSpan) -> None:
        """Decode ``embd`` into ``seq`` from position ``start`` (loop thread)."""
        self.projector.decode(embd, start, seq, span.non_causal)

    def close(self) -> None:
        """Free the kept chunks and the projector (after the engine loop was joined)."""
        with self._lock:
            for chunk in self._chunks.values():
                chunk.free()
            self._chunks.clear()
        self.projector.close()
