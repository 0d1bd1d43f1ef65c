"""The smallest GGUF file ollapy's store accepts as a model: a v3 header, ``general.architecture``, no tensors.

For store and server tests that create models without loading them (``ollapy create`` reads the header and refuses
a file that is not a model GGUF). :func:`tiny_gguf` gives its bytes; ``arch="clip"`` makes a projector's header.
"""
from __future__ import annotations

import struct

GGUF_TYPE_STRING = 8


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def tiny_gguf(arch: str = "llama", pad: int = 0) -> bytes:
    """A GGUF v3 file of one key (``general.architecture`` = ``arch``) and no tensors, ``pad`` zero bytes after it."""
    kv = _string("general.architecture") + struct.pack("<I", GGUF_TYPE_STRING) + _string(arch)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv + bytes(pad)
