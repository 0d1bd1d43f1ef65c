"""Do two loaded models share a vocabulary? The load-time check before a draft model may draft for a target.

A drafted token id is verified by the target as the same id, so the two tokenizers must agree id for id.
The rule is llama.cpp's ``common_speculative_are_compatible`` (``common/speculative.cpp``), read through
llama.cpp's vocabulary API:

- the same tokenizer type (``llama_vocab_type``: SPM, BPE, WPM, ...);
- the same BOS handling (whether BOS is added, and its id when it is), and the same for EOS;
- vocabulary sizes within 128 of each other (padding rows some converters add);
- the same text for every token id from 5 (llama.cpp's ``SPEC_VOCAB_CHECK_START_TOKEN_ID``: the first ids
  are special tokens whose spelling differs between otherwise identical conversions) up to the smaller size.

A mismatch raises :class:`~ollapy.errors.DraftMismatch` with one line naming both models and the first
difference. The same rule is applied to the two GGUF headers before anything loads
(:func:`ollapy.store.draft_vocab.header_vocab_mismatch`), so that a server does not unload a model for a draft
that cannot serve it; this check stays as the authority on what llama.cpp loaded (its defaults for keys a header
leaves out). The engine must also never let a draft token at or beyond the target's ``n_vocab`` reach a
verification batch (only possible when the sizes differ).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ollapy.engine.backend.bindings import C
from ollapy.errors import DraftMismatch
from ollapy.store.draft_vocab import CHECK_START_TOKEN_ID, MAX_VOCAB_SIZE_DIFFERENCE, mapped_vocab_mismatch

#: largest vocabulary-size difference allowed (llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE)
MAX_SIZE_DIFFERENCE = MAX_VOCAB_SIZE_DIFFERENCE


class VocabHolder(Protocol):
    """What the check needs of a loaded model: its ``llama_vocab`` pointer and its size (a
    :class:`~.context.Backend` has both)."""

    vocab: object
    n_vocab: int


def vocab_mismatch(target: VocabHolder, draft: VocabHolder, token_ids: Sequence[int] | None = None) -> str | None:
    """The first difference between the two vocabularies, in words, or None when a draft may serve.

    ``token_ids``: a trimmed-vocabulary draft's map (the target id of each draft token,
    :func:`ollapy.store.draft_vocab.read_token_map`); then its rule is
    :func:`ollapy.store.draft_vocab.mapped_vocab_mismatch`'s, with BOS/EOS compared through the map."""
    tv, dv = target.vocab, draft.vocab
    if token_ids is not None:
        return _mapped_mismatch(target, draft, token_ids)
    t_type, d_type = C.llama_vocab_type(tv), C.llama_vocab_type(dv)
    if t_type != d_type:
        names = {C.LLAMA_VOCAB_TYPE_SPM: "SentencePiece (SPM)", C.LLAMA_VOCAB_TYPE_BPE: "byte-level BPE",
                 C.LLAMA_VOCAB_TYPE_WPM: "WordPiece (WPM)", C.LLAMA_VOCAB_TYPE_UGM: "Unigram (UGM)",
                 C.LLAMA_VOCAB_TYPE_RWKV: "RWKV"}
        return f"tokenizer {names.get(d_type, f'type {d_type}')} vs {names.get(t_type, f'type {t_type}')}"
    for what, add, tok in (("BOS", C.llama_vocab_get_add_bos, C.llama_vocab_bos),
                           ("EOS", C.llama_vocab_get_add_eos, C.llama_vocab_eos)):
        t_add, d_add = bool(add(tv)), bool(add(dv))
        if t_add != d_add or (t_add and tok(tv) != tok(dv)):
            return f"{what} token {tok(dv) if d_add else 'not added'} vs {tok(tv) if t_add else 'not added'}"
    if abs(target.n_vocab - draft.n_vocab) > MAX_SIZE_DIFFERENCE:
        return f"{draft.n_vocab} tokens vs {target.n_vocab}"
    for i in range(CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        t_text, d_text = C.llama_vocab_get_text(tv, i), C.llama_vocab_get_text(dv, i)
        if t_text != d_text:
            return f"token {i} is {_show(d_text)} vs {_show(t_text)}"
    return None


def _mapped_mismatch(target: VocabHolder, draft: VocabHolder, ids: Sequence[int]) -> str | None:
    tv, dv = target.vocab, draft.vocab
    if C.llama_vocab_type(tv) != C.llama_vocab_type(dv):
        return vocab_mismatch(target, draft)  # the type's words
    why = mapped_vocab_mismatch(ids, draft.n_vocab, target.n_vocab, None)
    if why is not None:
        return why
    for what, add, tok in (("BOS", C.llama_vocab_get_add_bos, C.llama_vocab_bos),
                           ("EOS", C.llama_vocab_get_add_eos, C.llama_vocab_eos)):
        t_add, d_add = bool(add(tv)), bool(add(dv))
        d_tok = ids[tok(dv)] if 0 <= tok(dv) < len(ids) else -1
        if t_add != d_add or (t_add and tok(tv) != d_tok):
            return f"{what} token {d_tok if d_add else 'not added'} vs {tok(tv) if t_add else 'not added'}"
    return mapped_vocab_mismatch(ids, draft.n_vocab, target.n_vocab,
                                 lambda i: (C.llama_vocab_get_text(dv, i), C.llama_vocab_get_text(tv, ids[i])))


def check_draft_vocab(target: VocabHolder, draft: VocabHolder, target_name: str, draft_name: str,
                      token_ids: Sequence[int] | None = None) -> None:
    """Raise DraftMismatch (one line naming both models) unless ``draft`` may draft for ``target`` (through
    ``token_ids``, a trimmed-vocabulary draft's map, when given).

    Cost: one ctypes call per token id of the target's vocabulary (``n_vocab`` calls), once per load.
    """
    why = vocab_mismatch(target, draft, token_ids)
    if why is not None:
        raise DraftMismatch(draft_name, target_name, why)


def _show(text: bytes | None) -> str:
    return repr((text or b"").decode("utf-8", "replace"))
