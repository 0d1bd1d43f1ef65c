"""Does a draft model's GGUF share its target's vocabulary? Decided from the two files' headers, before either loads.

The rule is llama.cpp's ``common_speculative_are_compatible`` (``common/speculative.cpp``), the one
:mod:`ollapy.engine.backend.vocab` applies to the loaded models, in the same order and words:

1. the same tokenizer type (``tokenizer.ggml.model``: ``llama`` is SentencePiece, ``gpt2`` byte-level BPE...);
2. the same BOS handling (``tokenizer.ggml.add_bos_token``, and ``tokenizer.ggml.bos_token_id`` when it is added),
   then the same for EOS. A key that only one header carries is left to the load-time check: llama.cpp's default
   for a missing key depends on the tokenizer and its pre-tokenizer;
3. vocabulary sizes within 128 of each other (llama.cpp's ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``);
4. the same text for every token id from 5 (``SPEC_VOCAB_CHECK_START_TOKEN_ID``) up to the smaller size.

A server runs this before it unloads the model it serves for a draft that cannot serve it, and ``create`` runs
it before it writes a model whose ``DRAFT`` could never load. Cost: reading both token arrays, ~0.2 s for a
262k-token vocabulary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import DraftMismatch
from .info import ArraySummary, read_gguf_header

#: largest vocabulary-size difference between a draft model and its target (llama.cpp's
#: SPEC_VOCAB_MAX_SIZE_DIFFERENCE; also used by ollapy.engine.backend.vocab)
MAX_VOCAB_SIZE_DIFFERENCE = 128
#: first token id whose text is compared (llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID)
CHECK_START_TOKEN_ID = 5
# tokenizer.ggml.model -> llama.cpp's vocabulary type, as engine.backend.vocab names it
TOKENIZER_NAMES = {"llama": "SentencePiece (SPM)", "gpt2": "byte-level BPE", "bert": "WordPiece (WPM)",
                   "t5": "Unigram (UGM)", "rwkv": "RWKV"}
_TOKENS = "tokenizer.ggml.tokens"


def _length(tokens: Any) -> int | None:
    if isinstance(tokens, ArraySummary):
        return tokens.length
    return len(tokens) if isinstance(tokens, list) else None


def _special(meta: dict[str, Any], what: str) -> tuple[bool, int | None] | None:
    """(added, id) for ``bos``/``eos`` from a header, or None when the header leaves it to llama.cpp's default."""
    add = meta.get(f"tokenizer.ggml.add_{what}_token")
    if add is None:
        return None
    return bool(add), meta.get(f"tokenizer.ggml.{what}_token_id")


def header_vocab_mismatch(target: dict[str, Any], draft: dict[str, Any]) -> str | None:
    """The first difference between two GGUF headers' vocabularies (:func:`read_gguf_header`, with
    ``tokenizer.ggml.tokens`` kept for the texts; a summarised array skips the text comparison), in
    :func:`ollapy.engine.backend.vocab.vocab_mismatch`'s words, or None. Milliseconds beyond the reading."""
    t_model, d_model = target.get("tokenizer.ggml.model"), draft.get("tokenizer.ggml.model")
    if t_model and d_model and t_model != d_model:
        return f"tokenizer {TOKENIZER_NAMES.get(d_model, d_model)} vs {TOKENIZER_NAMES.get(t_model, t_model)}"
    for what in ("bos", "eos"):
        t, d = _special(target, what), _special(draft, what)
        if t is None or d is None:
            continue
        (t_add, t_id), (d_add, d_id) = t, d
        if t_add != d_add or (t_add and t_id is not None and d_id is not None and t_id != d_id):
            return f"{what.upper()} token {d_id if d_add else 'not added'} vs {t_id if t_add else 'not added'}"
    t_toks, d_toks = target.get(_TOKENS), draft.get(_TOKENS)
    t_n, d_n = _length(t_toks), _length(d_toks)
    if t_n is not None and d_n is not None and abs(t_n - d_n) > MAX_VOCAB_SIZE_DIFFERENCE:
        return f"{d_n} tokens vs {t_n}"
    if isinstance(t_toks, list) and isinstance(d_toks, list):
        n = min(len(t_toks), len(d_toks))
        if t_toks[CHECK_START_TOKEN_ID:n] != d_toks[CHECK_START_TOKEN_ID:n]:
            i = next(i for i in range(CHECK_START_TOKEN_ID, n) if t_toks[i] != d_toks[i])
            return f"token {i} is {_show(d_toks[i])} vs {_show(t_toks[i])}"
    return None


def check_draft_header(target_path: Path, draft_path: Path, target_name: str, draft_name: str) -> None:
    """Raise DraftMismatch (one line naming both models) when the two GGUF files' headers already show that
    ``draft_path`` cannot draft for ``target_path``; ModelLoadError when a header is unreadable."""
    keep = frozenset({_TOKENS})
    why = header_vocab_mismatch(read_gguf_header(target_path, keep)[0], read_gguf_header(draft_path, keep)[0])
    if why is not None:
        raise DraftMismatch(draft_name, target_name, why)


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", "replace"))
