"""Writing a GGUF file atomically with the official ``gguf`` library: the tail the test-file makers share.

``scripts/make_test_lora.py``, ``scripts/make_test_vlm.py`` and ``scripts/make_f16_gguf.py`` fill a
``gguf.GGUFWriter`` and use :func:`gguf_file` to write it: ``OUT.tmp`` first, renamed to ``OUT`` only when every
part is written, so a reader never sees half a file and a failure leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def gguf_file(out: Path, arch: str, **writer_args) -> Iterator["gguf.GGUFWriter"]:  # noqa: F821
    """A ``gguf.GGUFWriter`` for architecture ``arch`` on ``OUT.tmp``: the caller adds keys and tensors in the
    ``with`` body; a clean exit writes header, key-value data and tensors and renames the file to ``out``; an
    exception removes ``OUT.tmp`` and propagates. ``writer_args`` go to ``GGUFWriter`` (e.g. ``endianess``)."""
    import gguf

    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch, **writer_args)
    try:
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
