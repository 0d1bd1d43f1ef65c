"""A draft model for speculative decoding: scripts/make_draft_gguf.py cuts SmolLM2 into a shallow GGUF that
llama.cpp loads through ollapy's backend, and the vocabulary check accepts it and refuses Gemma's."""
from __future__ import annotations

import hashlib
import os
import shutil
from array import array
from pathlib import Path

import numpy as np
import pytest
from conftest import DRAFT_LAYERS, _draft_module, edited_gguf_copy, plain_greedy
from gguf import GGUFReader

from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.backend.vocab import check_draft_vocab, vocab_mismatch
from ollapy.errors import DraftMismatch

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


def test_the_cut_never_writes_over_its_source(smollm2_path, tmp_path):
    """A fresh-user trial ran ``make_draft_gguf.py G G --layers 4`` and the model file became its own 4-block
    cut. The source is refused as the destination, also through a hard link (a store's blob) or a symlink."""
    src = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, src)
    hard, soft = tmp_path / "hard.gguf", tmp_path / "soft.gguf"
    os.link(src, hard)
    soft.symlink_to(src)
    size = src.stat().st_size
    for dst in (src, hard, soft):
        with pytest.raises(ValueError, match="is the source model: write the draft to another file"):
            _draft_module().make_draft_gguf(src, dst, 4)
    assert src.stat().st_size == size == smollm2_path.stat().st_size
    with pytest.raises(ValueError, match="no such file"):
        _draft_module().make_draft_gguf(tmp_path / "missing.gguf", tmp_path / "x.gguf", 4)
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        _draft_module().make_draft_gguf(tmp_path / "notes.txt", tmp_path / "x.gguf", 4)


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
        assert vocab_mismatch(smol, gemma) == "tokenizer SentencePiece (SPM) vs byte-level BPE"
        with pytest.raises(DraftMismatch) as err:
            check_draft_vocab(smol, gemma, "smollm2:135m", "gemma3:270m-pt")
    assert str(err.value) == ("draft model gemma3:270m-pt does not share the vocabulary of smollm2:135m (tokenizer "
                              "SentencePiece (SPM) vs byte-level BPE) (a draft model must come from the same model "
                              "family and tokenizer as the model)")
    assert "\n" not in str(err.value)


# ---- DraftModel: the draft context kept in step with the target's slots -------------------------------------
@pytest.fixture(scope="module")
def draft_pair(smollm2_path, smollm2_draft_path):
    from ollapy.engine.spec.draft_model import DraftModel

    cfg = ContextConfig(n_parallel=2, num_ctx=256, num_batch=64)
    with Backend(smollm2_path, ContextConfig(num_ctx=256, num_batch=64, n_parallel=2)) as target, \
            Backend(smollm2_draft_path, cfg) as draft, Backend(smollm2_draft_path, CFG) as reference:
        yield DraftModel(draft, target, "smollm2", "smollm2-draft"), reference


def test_drafts_are_the_draft_models_greedy_continuation(draft_pair):
    dm, ref = draft_pair
    prompt = ref.tokenize(PROMPT)
    other = ref.tokenize("Water boils at")
    got = dm.propose({0: (prompt, 4), 1: (other, 3)})
    assert got == {0: plain_greedy(ref, prompt, 4), 1: plain_greedy(ref, other, 3)}
    # each sequence holds its tokens and all but the last draft token
    assert dm.held(0) == prompt + got[0][:3] and dm.held(1) == other + got[1][:2]


def test_accepted_and_rejected_tokens_resync_with_only_the_new_tokens(draft_pair):
    dm, ref = draft_pair
    prompt = ref.tokenize(PROMPT)
    first = dm.propose({0: (prompt, 4)})[0]
    # the target accepted two draft tokens and then chose another token (a rejection)
    wrong = (first[2] + 1) % ref.n_vocab
    tokens = prompt + first[:2] + [wrong]
    synced = dm.stats.synced
    again = dm.propose({0: (tokens, 3)})[0]
    assert dm.stats.synced - synced == 1  # only the corrected token was evaluated: the accepted ones were held
    assert again == plain_greedy(ref, tokens, 3)


def test_a_new_prompt_sharing_a_prefix_keeps_the_prefix(draft_pair):
    """A slot that restores a cached prefix or starts a new request: just a different token list."""
    dm, ref = draft_pair
    a = ref.tokenize("The capital of France is Paris. The capital of Spain is")
    b = ref.tokenize("The capital of France is Paris. The capital of Italy is")
    dm.reset(1)
    dm.propose({1: (a, 2)})
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    synced = dm.stats.synced
    assert dm.propose({1: (b, 2)})[1] == plain_greedy(ref, b, 2)
    assert dm.stats.synced - synced == len(b) - shared


def test_a_mirrored_context_shift_needs_no_prefill(draft_pair):
    dm, ref = draft_pair
    prompt = ref.tokenize(PROMPT + " a city that has been the capital for many centuries and")
    dm.reset(0)
    dm.propose({0: (prompt, 2)})
    held = dm.held(0)
    dm.shift(0, n_keep=2, n_discard=4)
    assert dm.held(0) == held[:2] + held[6:]
    shifted = prompt[:2] + prompt[6:]
    synced = dm.stats.synced
    out = dm.propose({0: (shifted, 3)})[0]
    assert dm.stats.synced == synced + 1 and dm.stats.cleared == 0  # only the last token, for its logits
    assert len(out) == 3 and all(0 <= t < dm.n_vocab for t in out)


def test_drafts_stop_at_the_end_of_the_context(draft_pair):
    dm, ref = draft_pair
    long = (ref.tokenize(PROMPT) * 100)[:254]
    dm.reset(0)
    assert len(dm.propose({0: (long, 4)})[0]) == 2  # positions 254 and 255 are the last of num_ctx=256
    assert dm.propose({0: (long + [long[0], long[1]], 4)})[0] == []


def test_the_gguf_headers_decide_a_vocabulary_mismatch_as_the_loaded_models_do(smollm2_path, smollm2_draft_path,
                                                                                gemma_path, tmp_path):
    """store.draft_vocab's check, run before anything loads (so a server refuses a draft before it unloads
    anything), applies llama.cpp's whole rule: for a draft with another tokenizer, another BOS handling or one
    token's text changed, it finds the difference the load-time check finds, in the same words; a
    same-vocabulary cut passes. (A fresh-user trial found the BOS case passing a type-and-size-only check.)"""
    from ollapy.store.draft_vocab import check_draft_header, header_vocab_mismatch
    from ollapy.store.info import ArraySummary, read_gguf_header

    keep = frozenset({"tokenizer.ggml.tokens"})
    smol = read_gguf_header(smollm2_path, keep)[0]
    assert len(smol["tokenizer.ggml.tokens"]) == 49152 and smol["tokenizer.ggml.tokens"][1000] == b"()"
    assert str(read_gguf_header(smollm2_path)[0]["tokenizer.ggml.tokens"]) == "[array of 49152]"  # as `show` prints it
    bos = edited_gguf_copy(smollm2_draft_path, tmp_path / "bos.gguf", "tokenizer.ggml.add_bos_token",
                       value=0 if smol["tokenizer.ggml.add_bos_token"] else 1)
    text = edited_gguf_copy(smollm2_draft_path, tmp_path / "text.gguf", "tokenizer.ggml.tokens", index=1000)
    expected = {smollm2_draft_path: None, gemma_path: "tokenizer SentencePiece (SPM) vs byte-level BPE",
                bos: "BOS token 1 vs not added", text: "token 1000 is '#)' vs '()'"}
    with Backend(smollm2_path, CFG) as target:
        for draft, why in expected.items():
            assert header_vocab_mismatch(smol, read_gguf_header(draft, keep)[0]) == why, draft
            with Backend(draft, CFG) as loaded:
                assert vocab_mismatch(target, loaded) == why, draft
    with pytest.raises(DraftMismatch, match=r"^draft model d does not share the vocabulary of t \(token 1000 is"):
        check_draft_header(smollm2_path, text, "t", "d")
    check_draft_header(smollm2_path, smollm2_draft_path, "t", "d")
    # sizes: within 128 tokens of each other is one vocabulary (padding rows), as llama.cpp's rule
    wider = dict(smol, **{"tokenizer.ggml.tokens": ArraySummary(49152 + 129)})
    assert header_vocab_mismatch(smol, wider) == "49281 tokens vs 49152"
    assert header_vocab_mismatch(smol, dict(smol, **{"tokenizer.ggml.tokens": ArraySummary(49152 + 128)})) is None
