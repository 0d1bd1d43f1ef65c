"""A message's content parts, every API's shapes, read by one parser: pydantic models, never ``dict.get`` chains.

The shapes (each API's own wire names):

- text: OpenAI's ``{"type": "text", "text"}``, Responses' ``input_text``/``output_text`` (``summary_text`` and
  ``reasoning_text`` in reasoning items), an assistant's ``{"type": "refusal", "refusal"}``;
- images: OpenAI's ``{"type": "image_url", "image_url": {"url", "detail"?} | url}``, Responses'
  ``{"type": "input_image", "image_url": url}``, Anthropic's ``{"type": "image", "source": {"type": "base64",
  "media_type", "data"} | {"type": "url", "url"}}``;
- refused with a one-line 400 that says what to send instead: audio (``input_audio``), files (``file``,
  ``input_file``, ``document``) and any other type.

:func:`read_parts` checks a content list against these models, so a part of the wrong shape (``"source": "x"``,
a number for ``text``, a list for ``image_url``) is an :class:`~ollapy.errors.OptionError` naming the part and the
field, never an AttributeError that would be a 500. Image bytes are decoded by :mod:`ollapy.engine.media`
(``decode_base64_image``); a remote URL is refused (the server never fetches).
"""
from __future__ import annotations

import reprlib
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from ollapy.errors import ImageError, OptionError
from ollapy.server.bodies import Body, body_error

TEXT_TYPES = ("text", "input_text", "output_text", "summary_text", "reasoning_text")
IMAGE_TYPES = ("image_url", "input_image", "image")
REFUSED_TYPES = {"input_audio": "audio input is not supported", "audio": "audio input is not supported",
                 "file": "file parts are not supported", "input_file": "file parts are not supported",
                 "document": "document blocks are not supported"}


class TextPart(Body):
    """``{"type": "text" | "input_text" | "output_text" | ..., "text": str}``."""

    type: Literal["text", "input_text", "output_text", "summary_text", "reasoning_text"]
    text: str = ""


class RefusalPart(Body):
    """An assistant's earlier refusal: ``{"type": "refusal", "refusal": str}`` (read as its text)."""

    type: Literal["refusal"]
    refusal: str = ""

    @property
    def text(self) -> str:
        """The refusal's words."""
        return self.refusal


class ImageURL(Body):
    """OpenAI's ``image_url`` object: ``url`` (a ``data:`` URI) and ``detail`` (accepted, not used)."""

    url: str
    detail: str | None = None


class ImageURLPart(Body):
    """OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}`` (a bare URL string accepted too)."""

    type: Literal["image_url"]
    image_url: ImageURL | str


class InputImagePart(Body):
    """Responses' ``{"type": "input_image", "image_url": url, "detail"?}`` (``file_id`` is not supported)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class Base64Source(Body):
    """Anthropic's ``{"type": "base64", "media_type", "data"}`` image source."""

    type: Literal["base64"]
    media_type: str | None = None
    data: str


class URLSource(Body):
    """Anthropic's ``{"type": "url", "url"}`` image source (refused: the server never fetches)."""

    type: Literal["url"]
    url: str


ImageSource = Annotated[Base64Source | URLSource, Field(discriminator="type")]


class ImageBlockPart(Body):
    """Anthropic's ``{"type": "image", "source": {...}}``."""

    type: Literal["image"]
    source: ImageSource


Part = Annotated[TextPart | RefusalPart | ImageURLPart | InputImagePart | ImageBlockPart, Field(discriminator="type")]
_PART = TypeAdapter(Part)


def read_part(p: Any, where: str) -> TextPart | RefusalPart | ImageURLPart | InputImagePart | ImageBlockPart:
    """One content part as its model. Raises OptionError (400) naming ``where`` for a refused or unknown type or
    a part of the wrong shape."""
    if isinstance(p, str):  # a bare string in a list of parts: text, as Ollama's and llama.cpp's servers read it
        return TextPart(type="text", text=p)
    kind = p.get("type") if isinstance(p, dict) else None
    if isinstance(kind, str) and kind in REFUSED_TYPES:  # a list or object "type" is no type (nor hashable)
        raise OptionError(f"{where}: {REFUSED_TYPES[kind]}", hint="send text and image parts only")
    if not isinstance(p, dict) or not isinstance(kind, str) or kind not in (*TEXT_TYPES, "refusal", *IMAGE_TYPES):
        raise OptionError(f"{where}: unsupported content part type {reprlib.repr(kind)}",
                          hint="use text parts, or image_url / input_image / image parts for a vision model")
    try:
        return _PART.validate_python(p)
    except ValidationError as exc:
        msg = body_error(exc).message
        raise OptionError(f"{where}.{msg.split('.', 1)[1] if msg.startswith(kind + '.') else msg}",
                          hint="see the API's content part shapes") from None


def image_bytes(part: ImageURLPart | InputImagePart | ImageBlockPart, where: str) -> bytes:
    """The decoded bytes of an image part (a ``data:`` URI or a base64 source). Raises ImageError (400) for a
    remote URL (never fetched), a ``file_id``, or bytes that are not base64."""
    from ollapy.engine.media import decode_base64_image, refuse_remote

    if isinstance(part, ImageBlockPart):
        if isinstance(part.source, URLSource):
            refuse_remote(part.source.url)
        return decode_base64_image(part.source.data, where)
    url = part.image_url.url if isinstance(part.image_url, ImageURL) else part.image_url
    if not url:
        raise ImageError(f"{where}: an image part needs image_url" + (" (file_id is not supported)"
                                                                       if getattr(part, "file_id", None) else ""),
                         hint="send a base64 data: URI")
    if url.startswith(("http://", "https://")):
        refuse_remote(url)
    if not url.startswith("data:"):
        raise ImageError(f"{where}: image_url must be a data: URI", hint="send data:image/png;base64,...")
    return decode_base64_image(url, where)


def read_parts(content: list, where: str, images: bool = True) -> tuple[str, list[bytes]]:
    """A list of content parts as ``(text, image bytes)``: text parts joined in order, images decoded in order.

    With ``images`` false an image part is refused (a tool's output, say). Raises OptionError/ImageError (400)
    naming ``where.N`` for the first bad part."""
    texts: list[str] = []
    out: list[bytes] = []
    for i, p in enumerate(content):
        part = read_part(p, f"{where}.{i}")
        if isinstance(part, (TextPart, RefusalPart)):
            texts.append(part.text)
        elif not images:
            raise OptionError(f"{where}.{i}: image parts are not allowed here", hint="send text parts")
        else:
            out.append(image_bytes(part, f"{where}.{i}"))
    return "".join(texts), out
