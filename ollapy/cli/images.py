"""Images for ``ollapy run``: ``--image FILE`` and image paths written in the prompt, as ``ollama run`` finds them.

:func:`extract_image_paths` finds words of the prompt that name an existing image file (``.png``, ``.jpg``,
``.jpeg``, ``.webp``, ``.gif``, ``.bmp``; plain, ``~``-prefixed, quoted, or with ``\\ `` escaped spaces), takes
them out of the text and returns them; a word that names no file stays text. :func:`read_image` reads a file as
the base64 string Ollama's ``images`` field carries (what a server and the in-process model both take).
"""
from __future__ import annotations

import base64
import re
from pathlib import Path

from ollapy.errors import ImageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
_EXT = r"\.(?:png|jpe?g|webp|gif|bmp)"
_PATH = re.compile(rf"""'([^'\n]+{_EXT})'|"([^"\n]+{_EXT})"|((?:[^\s'"\\]|\\ )+{_EXT})(?=$|[\s,;:!?)])""",
                   re.IGNORECASE)


def extract_image_paths(text: str) -> tuple[str, list[Path]]:
    """``text`` without the image file paths it names (existing files only), and those paths in order."""
    paths: list[Path] = []

    def take(m: re.Match) -> str:
        raw = next(g for g in m.groups() if g)
        p = Path(raw.replace("\\ ", " ")).expanduser()
        if not p.is_file():
            return m.group(0)
        paths.append(p)
        return ""

    out = _PATH.sub(take, text)
    if paths:
        out = re.sub(r"[ \t]{2,}", " ", out).strip()
    return out, paths


def read_image(path: Path) -> str:
    """The file's bytes, base64-encoded. Raises ImageError when it cannot be read."""
    try:
        return base64.b64encode(Path(path).read_bytes()).decode()
    except OSError as exc:
        raise ImageError(f"{path}: cannot read the image ({exc.strerror or exc})", hint="check the path") from None
