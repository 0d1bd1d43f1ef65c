#!/usr/bin/env python3
"""Make a draft model for speculative decoding out of a GGUF model: its first blocks, optionally a trimmed vocabulary.

    python scripts/make_draft_gguf.py SRC.gguf DST.gguf --layers 4
    python scripts/make_draft_gguf.py SRC.gguf DST.gguf --layers 16 --vocab 32768

No second SmolLM2 (or Gemma 3) ships in a package here, and speculative decoding with a draft model needs
one whose tokenizer matches the target's. Two cuts, combinable:

- **Blocks.** ``--layers K`` keeps blocks ``0..K-1`` (per-layer metadata arrays, one entry per block, keep their
  first K entries). Teacher-forced on task (a) of scripts/bench_spec.py, the agreement with the full model
  falls as fewer leading blocks are kept (figures per K: docs/benchmarks.md, "Speculative decoding"). Skipping
  middle blocks instead (each kind of attention block kept in place) agreed on almost no tokens: this model was
  not trained to skip layers (LayerSkip, Elhoushi et al. 2024, is), so there is no such option here.
- **Vocabulary** (FR-Spec, Zhao et al. 2025, "Frequency-Ranked Speculative Sampling"). With a large vocabulary
  the output layer dominates a small model's step (Gemma 3 270M: 178 of 246 MB, 262,144 tokens), and no block
  cut makes it cheaper. ``--vocab N`` keeps N tokens: the byte tokens, the control and user-defined tokens that
  are not ``<unusedK>`` placeholders, then the normal tokens ranked by :func:`rank_tokens` (a corpus, by default
  the running Python's standard library and pydoc topics, and the ``wordfreq`` package's English word
  frequencies). The token embedding rows (also the output layer where it is tied) and the tokenizer arrays are
  cut to those tokens, in the target's id order, and ``ollapy.draft.token_ids`` (int32, one per draft token)
  records each one's id in the target's vocabulary. ollapy checks that every kept token's text equals the
  target's text at that id (ollapy.store.draft_vocab), feeds the draft the mapped ids and maps its argmax back.
  A token outside the subset is fed as the most frequent kept token (``ollapy.draft.fallback_id``; compared with
  ``<unk>`` in docs/benchmarks.md, "A trimmed-vocabulary draft model"). The target verifies every drafted token,
  so the answer is unchanged. llama.cpp's own tools refuse such a draft (its vocabulary differs in size).

The tokenizer metadata is otherwise copied unchanged, ``{arch}.block_count`` becomes K, and ``general.name``
says what it is. Deterministic: the same input and options give the same bytes (metadata and tensors in the
source's order, no timestamps). Written to ``DST.tmp`` and renamed. Uses the official ``gguf`` library (reader
and writer).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import numpy as np

KEEP = ("token_embd.", "output_norm.", "output.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
#: metadata keys of a trimmed-vocabulary draft (see ollapy.store.draft_vocab): the target's id of each draft token,
#: and the draft id fed for a target token the draft lacks
TOKEN_IDS_KEY = "ollapy.draft.token_ids"
FALLBACK_KEY = "ollapy.draft.fallback_id"
_UNUSED = re.compile(rb"^<unused\d+>$")
_NORMAL = 1  # gguf.TokenType.NORMAL


def default_corpus() -> list[Path]:
    """The running Python's standard library sources (``*.py`` at its top level) and pydoc topics."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("pydoc_data/topics.py"))


def rank_tokens(src: Path, corpus: Sequence[Path], words: int = 100_000) -> collections.Counter:
    """Token frequencies (relative, summing to about 2) under ``src``'s tokenizer (llama.cpp's, loaded
    vocabulary-only): half from the text of ``corpus``, half from English word frequencies (the ``wordfreq``
    package's ``words`` most common English words, each tokenized after a space, lower case and capitalised 4:1,
    weighted by its frequency), so that everyday words the corpus lacks ("knots", "keeper") rank by their use."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ollapy.engine.backend.bindings import C, init_backend

    init_backend()
    mp = C.llama_model_default_params()
    mp.vocab_only = True
    model = C.llama_model_load_from_file(str(src).encode(), mp)
    if not model:
        raise ValueError(f"{src}: llama.cpp could not read its vocabulary")
    vocab = C.llama_model_get_vocab(model)

    def tokenize(data: bytes) -> list[int]:
        buf = (C.llama_token * (len(data) + 8))()
        n = C.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
        return list(buf[:max(n, 0)])

    try:
        text: collections.Counter = collections.Counter()
        for path in corpus:
            data = path.read_bytes()
            for start in range(0, len(data), 1 << 16):  # 64 KiB pieces
                text.update(tokenize(data[start:start + (1 << 16)]))
        total = sum(text.values()) or 1
        counts: collections.Counter = collections.Counter({t: n / total for t, n in text.items()})
        try:
            import wordfreq
        except ImportError:
            raise ValueError("--vocab ranks tokens by English word frequencies: pip install wordfreq") from None

        for word in wordfreq.top_n_list("en", words):
            f = wordfreq.word_frequency(word, "en")
            for form, share in ((word, 0.8), (word.capitalize(), 0.2)):
                for t in tokenize(b" " + form.encode()):
                    counts[t] += f * share
        return counts
    finally:
        C.llama_model_free(model)


def choose_vocab(tokens: list[bytes], types: Sequence[int], counts: collections.Counter, n: int) -> list[int]:
    """The target ids a trimmed vocabulary keeps, ascending: every non-normal token that is not an ``<unusedK>``
    placeholder, then normal tokens by corpus frequency (ties: lower id first, the tokenizer's rank)."""
    fixed = [i for i, t in enumerate(types) if t != _NORMAL and not _UNUSED.match(tokens[i])]
    if n < len(fixed) + 1:
        raise ValueError(f"--vocab must be above {len(fixed)} (the byte and control tokens), got {n}")
    normal = [i for i, t in enumerate(types) if t == _NORMAL]
    normal.sort(key=lambda i: (-counts.get(i, 0), i))
    return sorted(fixed + normal[: n - len(fixed)])


def make_draft_gguf(src: Path, dst: Path, n_layers: int, *, vocab: int | None = None,
                    corpus: Sequence[Path] | None = None, words: int = 100_000) -> Path:
    """Write a draft model of ``src`` to ``dst``: blocks ``0..n_layers-1``, the embeddings, final norm and output
    layer, and with ``vocab`` a trimmed vocabulary (see the module docstring; ``corpus`` and ``words`` as in
    :func:`rank_tokens`; ``vocab`` at or above the model's size keeps all tokens).

    Raises ValueError when ``n_layers`` is not in ``[1, block_count]``, ``src`` has no block count, or ``vocab``
    leaves no room for normal tokens. Returns ``dst``.
    """
    import gguf

    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ValueError(f"{src}: no such file")
    with open(src, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{src} is not a GGUF file")
    if dst.exists() and os.path.samefile(src, dst):  # the same path, a symlink or a hard link (a store's blob)
        raise ValueError(f"{dst} is the source model: write the draft to another file")
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise ValueError(f"{src}: no {count_key} in its metadata")
    n_total = int(reader.fields[count_key].contents())
    if not 1 <= n_layers <= n_total:
        raise ValueError(f"--layers must be between 1 and {n_total} for {src.name}, got {n_layers}")
    keep_ids: np.ndarray | None = None
    if vocab is not None:
        tokens = [t.encode() for t in reader.fields["tokenizer.ggml.tokens"].contents()]
        types = reader.fields["tokenizer.ggml.token_type"].contents()
        if vocab < len(tokens):
            counts = rank_tokens(src, corpus if corpus is not None else default_corpus(), words)
            keep_ids = np.array(choose_vocab(tokens, types, counts, vocab), dtype=np.int32)
            fallback = max((i for i, t in enumerate(types) if t == _NORMAL), key=lambda i: (counts.get(i, 0), -i))
    new_id = {int(t): i for i, t in enumerate(keep_ids)} if keep_ids is not None else {}
    what = [f"first {n_layers} of {n_total} blocks"] + ([f"{len(keep_ids)} tokens"] if keep_ids is not None else [])

    tmp = dst.with_name(dst.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer writes these itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == count_key:
            value = n_layers
        elif field.name == "general.name":
            value = f"{value} (draft: {', '.join(what)})"
        elif field.name.startswith(arch + ".") and vtype == gguf.GGUFValueType.ARRAY and len(value) == n_total:
            value = value[:n_layers]  # per-layer settings
        elif keep_ids is not None and field.name.startswith("tokenizer.ggml."):
            if vtype == gguf.GGUFValueType.ARRAY and field.name != "tokenizer.ggml.merges":
                value = [value[i] for i in keep_ids]
            elif field.name.endswith("_token_id"):
                if int(value) not in new_id:
                    raise ValueError(f"{field.name} {value} is not among the kept tokens")
                value = new_id[int(value)]
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    if keep_ids is not None:
        writer.add_array(TOKEN_IDS_KEY, [int(i) for i in keep_ids])
        writer.add_uint32(FALLBACK_KEY, new_id[fallback])
    for tensor in reader.tensors:
        m = _BLOCK.match(tensor.name)
        if m and int(m.group(1)) < n_layers:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=None, raw_dtype=tensor.tensor_type)
        elif tensor.name.startswith(KEEP):
            data = tensor.data
            if keep_ids is not None and tensor.name.startswith(("token_embd.", "output.")):
                data = np.ascontiguousarray(data[keep_ids])  # one row per token: raw quantized bytes per row
            writer.add_tensor(tensor.name, data, raw_shape=None, raw_dtype=tensor.tensor_type)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, dst)
    return dst


def describe(draft: Path) -> str:
    """What a draft file keeps, from its ``general.name`` (e.g. ``first 16 of 18 blocks, 32768 tokens``)."""
    import gguf

    name = str(gguf.GGUFReader(draft).fields["general.name"].contents())
    kept = name[name.rfind("(draft: ") + 8:-1] if name.endswith(")") and "(draft: " in name else name
    return kept if "tokens" in kept else f"{kept}, the whole vocabulary"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the target model's GGUF")
    ap.add_argument("dst", type=Path, help="where to write the draft GGUF")
    ap.add_argument("--layers", type=int, default=4, help="keep the first K blocks (default 4)")
    ap.add_argument("--vocab", type=int, help="trim the vocabulary to N tokens (FR-Spec), mapped to the target's ids")
    ap.add_argument("--corpus", type=Path, nargs="+", help="text files whose token frequencies rank the vocabulary")
    args = ap.parse_args(argv)
    try:
        out = make_draft_gguf(args.src, args.dst, args.layers, vocab=args.vocab, corpus=args.corpus)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: {out.stat().st_size} bytes, a draft of {args.src.name}: {describe(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
