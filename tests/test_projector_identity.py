"""A vision projector's identity (what an image's prefix identity in the prompt cache names it by) is its content
digest: two projectors that differ anywhere get different identities (issue 53, finding 8: it was the size plus
the first MiB, so projectors differing after that shared image states)."""
from __future__ import annotations

import hashlib
import os

from ollapy.engine.backend.media import projector_identity


def test_identity_is_the_content_digest(tmp_path):
    head = os.urandom(3 << 20)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(head)
    b.write_bytes(head[:-1] + bytes([head[-1] ^ 1]))  # same size, same first MiB, one byte apart at the end
    assert projector_identity(a) != projector_identity(b)
    assert projector_identity(a) == hashlib.sha256(head).digest()[:16]
    blobs = tmp_path / "blobs"  # a store blob: the digest in its name, checked when stored, is used unread
    blobs.mkdir()
    blob = blobs / f"sha256-{hashlib.sha256(head).hexdigest()}"
    os.symlink(a, blob)
    assert projector_identity(blob) == projector_identity(a)
