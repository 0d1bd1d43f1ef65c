"""A draft model for speculative decoding: scripts/make_draft_gguf.py cuts SmolLM2 into a shallow GGUF that
llama.cpp loads through ollapy's backend, and the vocabulary check accepts it and refuses Gemma's."""
from __future__ import annotations

import hashlib
from array import array
from pathlib import Path

import numpy as np
import pytest
from conftest import DRAFT_LAYERS, _draft_module
from gguf import GGUFReader

from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.backend.vocab import check_draft_vocab, vocab_mismatch
from ollapy.errors import ModelLoadError

PROMPT = "The capital of France is"
CFG = ContextConfig(num_ctx=256, num_batch=64)


def _greedy(backend: Backend, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy continuation of PROMPT: ``n`` token ids and the logits each was chosen from (copies)."""
    toks = backend.tokenize(PROMPT)
    k = len(toks)
    backend.seq_clear(0)
    backend.decode(array("i", toks), array("i", range(k)), array("i", [0] * k), array("b", [0] * (k - 1) + [1]))
    out, rows = [], []
    for i in range(n):
        row = backend.logits_row(k - 1 if i == 0 else 0).copy()
        rows.append(row)
        out.append(int(np.argmax(row)))
        backend.decode(array("i", [out[-1]]), array("i", [k + i]), array("i", [0]), array("b", [1]))
    return out, rows


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_cut_keeps_embeddings_output_and_the_first_blocks(smollm2_path, smollm2_draft_path):
    src, cut = GGUFReader(smollm2_path), GGUFReader(smollm2_draft_path)
    assert cut.fields["llama.block_count"].contents() == DRAFT_LAYERS
    assert cut.fields["general.name"].contents().endswith(f"(draft: first {DRAFT_LAYERS} of 30 blocks)")
    names = [t.name for t in cut.tensors]
    expected = [t.name for t in src.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < DRAFT_LAYERS]
    assert names == expected and len(names) == 2 + 9 * DRAFT_LAYERS  # token_embd, output_norm (tied output)
    by_name = {t.name: t for t in src.tensors}
    for t in cut.tensors:
        assert t.tensor_type == by_name[t.name].tensor_type and bytes(t.data) == bytes(by_name[t.name].data)
    assert cut.fields["tokenizer.ggml.tokens"].contents() == src.fields["tokenizer.ggml.tokens"].contents()


def test_the_cut_is_deterministic(smollm2_path, smollm2_draft_path, tmp_path):
    again = _draft_module().make_draft_gguf(smollm2_path, tmp_path / "again.gguf", DRAFT_LAYERS)
    assert _sha(again) == _sha(smollm2_draft_path)
    assert not (tmp_path / "again.gguf.tmp").exists()
    with pytest.raises(ValueError, match="between 1 and 30"):
        _draft_module().make_draft_gguf(smollm2_path, tmp_path / "x.gguf", 31)


def test_keeping_every_block_gives_the_same_model_bit_for_bit(smollm2_path, tmp_path):
    """The cut rewrites metadata and copies tensors: with all 30 blocks kept, llama.cpp computes the very same
    logits as from the original file."""
    whole = _draft_module().make_draft_gguf(smollm2_path, tmp_path / "whole.gguf", 30)
    with Backend(smollm2_path, CFG) as a, Backend(whole, CFG) as b:
        toks_a, rows_a = _greedy(a, 6)
        toks_b, rows_b = _greedy(b, 6)
    assert toks_a == toks_b and a.n_vocab == b.n_vocab == 49152
    assert all(np.array_equal(x, y) for x, y in zip(rows_a, rows_b))


def test_the_draft_loads_decodes_and_shares_the_vocabulary(smollm2_path, smollm2_draft_path):
    with Backend(smollm2_path, CFG) as target, Backend(smollm2_draft_path, CFG) as draft:
        assert draft.n_vocab == target.n_vocab == 49152
        assert [draft.token_text(i) for i in (0, 1, 2, 17, 49151)] == [target.token_text(i) for i in (0, 1, 2, 17, 49151)]
        assert draft.tokenize(PROMPT) == target.tokenize(PROMPT)
        assert vocab_mismatch(target, draft) is None
        check_draft_vocab(target, draft, "smollm2", "smollm2-draft")  # no error
        toks, rows = _greedy(draft, 8)
        assert len(toks) == 8 and all(0 <= t < draft.n_vocab for t in toks)
        assert all(np.isfinite(r).all() for r in rows)
        # a shallower network: not the target's prediction
        target_toks, target_rows = _greedy(target, 1)
        assert not np.array_equal(rows[0], target_rows[0])


def test_a_draft_with_another_vocabulary_is_refused_in_one_line(smollm2_path, gemma_path):
    with Backend(smollm2_path, CFG) as smol, Backend(gemma_path, CFG) as gemma:
        assert vocab_mismatch(smol, gemma) == "tokenizer type 1 vs 2"
        with pytest.raises(ModelLoadError) as err:
            check_draft_vocab(smol, gemma, "smollm2:135m", "gemma3:270m")
    assert str(err.value) == ("draft model gemma3:270m does not share the vocabulary of smollm2:135m (tokenizer type "
                              "1 vs 2) (a draft model must come from the same model family and tokenizer as the model)")
    assert "\n" not in str(err.value)
