"""Does a draft model's GGUF share its target's vocabulary? Decided from the two files' headers, before either loads.

The rule is llama.cpp's ``common_speculative_are_compatible`` (``common/speculative.cpp``), the one
:mod:`ollapy.engine.backend.vocab` applies to the loaded models, in the same order and words:

1. the same tokenizer type (``tokenizer.ggml.model``: ``llama`` is SentencePiece, ``gpt2`` byte-level BPE...);
2. the same BOS handling (``tokenizer.ggml.add_bos_token``, and ``tokenizer.ggml.bos_token_id`` when it is added),
   then the same for EOS. A key that only one header carries is left to the load-time check: llama.cpp's default
   for a missing key depends on the tokenizer and its pre-tokenizer;
3. vocabulary sizes within 128 of each other (llama.cpp's ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``);
4. the same text for every token id from 5 (``SPEC_VOCAB_CHECK_START_TOKEN_ID``) up to the smaller size.

A draft whose vocabulary was trimmed to its target's most frequent tokens (FR-Spec, Zhao et al. 2025; made by
``scripts/make_draft_gguf.py --vocab N``) carries ``ollapy.draft.token_ids``: the target's id of each of its
tokens. Its rule (:func:`mapped_vocab_mismatch`): the same tokenizer type and BOS/EOS handling, the BOS/EOS ids
mapped to the target's, a map with one increasing id below the target's size per draft token, and each draft
token's text equal to the target's text at its mapped id (all ids: the map makes the specials comparable too).

A server runs this before it unloads the model it serves for a draft that cannot serve it, and ``create`` runs
it before it writes a model whose ``DRAFT`` could never load. Cost: reading both token arrays, linear in the
vocabulary size.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ollapy.errors import DraftMismatch
from ollapy.store.info import ArraySummary, read_gguf_header

#: largest vocabulary-size difference between a draft model and its target (llama.cpp's
#: SPEC_VOCAB_MAX_SIZE_DIFFERENCE; also used by ollapy.engine.backend.vocab)
MAX_VOCAB_SIZE_DIFFERENCE = 128
#: first token id whose text is compared (llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID)
CHECK_START_TOKEN_ID = 5
# tokenizer.ggml.model -> llama.cpp's vocabulary type, as engine.backend.vocab names it
TOKENIZER_NAMES = {"llama": "SentencePiece (SPM)", "gpt2": "byte-level BPE", "bert": "WordPiece (WPM)",
                   "t5": "Unigram (UGM)", "rwkv": "RWKV"}
_TOKENS = "tokenizer.ggml.tokens"
#: metadata key of a trimmed-vocabulary draft: the target's token id of each draft token (int32 array)
TOKEN_IDS_KEY = "ollapy.draft.token_ids"


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


def mapped_vocab_mismatch(ids: Sequence[int], n_draft: int, n_target: int,
                          texts: Callable[[int], tuple[bytes | None, bytes | None]] | None) -> str | None:
    """The map part of a trimmed-vocabulary draft's rule: ``ids`` (one target id per draft token) must have
    ``n_draft`` entries, increasing, below ``n_target``; ``texts(i)`` gives (draft text of ``i``, target text of
    ``ids[i]``), compared for every ``i`` (None: not compared). Returns the first difference in words, or None."""
    if len(ids) != n_draft:
        return f"its token map has {len(ids)} entries for {n_draft} tokens"
    if n_draft and (ids[0] < 0 or ids[-1] >= n_target or any(a >= b for a, b in zip(ids, ids[1:]))):
        return f"its token map is not increasing ids below {n_target}"
    for i in range(n_draft if texts is not None else 0):
        d_text, t_text = texts(i)
        if d_text != t_text:
            return f"token {i} (mapped to {ids[i]}) is {_show(d_text or b'')} vs {_show(t_text or b'')}"
    return None


def header_vocab_mismatch(target: dict[str, Any], draft: dict[str, Any]) -> str | None:
    """The first difference between two GGUF headers' vocabularies (:func:`read_gguf_header`, with
    ``tokenizer.ggml.tokens`` and :data:`TOKEN_IDS_KEY` kept; a summarised array skips the text comparison), in
    :func:`ollapy.engine.backend.vocab.vocab_mismatch`'s words, or None. Milliseconds beyond the reading."""
    t_model, d_model = target.get("tokenizer.ggml.model"), draft.get("tokenizer.ggml.model")
    if t_model and d_model and t_model != d_model:
        return f"tokenizer {TOKENIZER_NAMES.get(d_model, d_model)} vs {TOKENIZER_NAMES.get(t_model, t_model)}"
    ids = draft.get(TOKEN_IDS_KEY)
    ids = ids if isinstance(ids, list) else None
    for what in ("bos", "eos"):
        t, d = _special(target, what), _special(draft, what)
        if t is None or d is None:
            continue
        (t_add, t_id), (d_add, d_id) = t, d
        if ids is not None and d_id is not None:
            d_id = ids[d_id] if 0 <= d_id < len(ids) else -1
        if t_add != d_add or (t_add and t_id is not None and d_id is not None and t_id != d_id):
            return f"{what.upper()} token {d_id if d_add else 'not added'} vs {t_id if t_add else 'not added'}"
    t_toks, d_toks = target.get(_TOKENS), draft.get(_TOKENS)
    t_n, d_n = _length(t_toks), _length(d_toks)
    if ids is not None and t_n is not None and d_n is not None:
        both = isinstance(t_toks, list) and isinstance(d_toks, list)
        return mapped_vocab_mismatch(ids, d_n, t_n, (lambda i: (d_toks[i], t_toks[ids[i]])) if both else None)
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
    keep = frozenset({_TOKENS, TOKEN_IDS_KEY})
    why = header_vocab_mismatch(read_gguf_header(target_path, keep)[0], read_gguf_header(draft_path, keep)[0])
    if why is not None:
        raise DraftMismatch(draft_name, target_name, why)


#: metadata key of a trimmed-vocabulary draft: the draft id fed for a target token outside its vocabulary
FALLBACK_KEY = "ollapy.draft.fallback_id"


@dataclass(frozen=True)
class TokenMap:
    """A trimmed-vocabulary draft's map: ``ids[i]`` is the target's id of draft token ``i``; ``unknown`` is the
    draft id fed for a target token outside the subset (:data:`FALLBACK_KEY`, the most frequent kept token)."""

    ids: list[int]
    unknown: int


def read_token_map(path: Path) -> TokenMap | None:
    """A trimmed-vocabulary draft's :class:`TokenMap` (from :data:`TOKEN_IDS_KEY` and :data:`FALLBACK_KEY`; without
    the latter its ``<unk>``, else id 0), or None for a draft of the target's own vocabulary. Raises
    ModelLoadError when the header is unreadable."""
    meta = read_gguf_header(path, frozenset({TOKEN_IDS_KEY}))[0]
    ids = meta.get(TOKEN_IDS_KEY)
    if not isinstance(ids, list):
        return None
    for key in (FALLBACK_KEY, "tokenizer.ggml.unknown_token_id"):
        got = meta.get(key)
        if isinstance(got, int) and 0 <= got < len(ids):
            return TokenMap([int(i) for i in ids], got)
    return TokenMap([int(i) for i in ids], 0)


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", "replace"))
