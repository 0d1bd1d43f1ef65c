"""A draft model with a trimmed vocabulary (FR-Spec, Zhao et al. 2025): scripts/make_draft_gguf.py --vocab keeps the
most frequent tokens and records their ids in the target's vocabulary; ollapy checks the map against the target
(before loading and after), feeds the draft mapped ids, maps its drafts back, and the answers stay the target's."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import _draft_module, edited_gguf_copy, plain_greedy, run_cli
from gguf import GGUFReader

from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.backend.vocab import vocab_mismatch
from ollapy.engine.spec.draft_model import DraftModel
from ollapy.store.draft_vocab import FALLBACK_KEY, TOKEN_IDS_KEY, TokenMap, header_vocab_mismatch, read_token_map
from ollapy.store.info import read_gguf_header

N_TOKENS = 8192
CORPUS_TEXT = "Each slot of the engine keeps the tokenizer's tokens in a KV cache; a slot drafts. " * 20
CFG = ContextConfig(num_ctx=256, num_batch=64)
PROMPT = "The capital of France is"
COPY = ("Repeat this paragraph exactly: The lighthouse at Skerry Point was built in 1851 from granite quarried on the "
        "island itself. Its lamp burned colza oil until 1904, when a paraffin vapour burner replaced it.")


@pytest.fixture(scope="module")
def trimmed(smollm2_path, tmp_path_factory) -> Path:
    """All 30 blocks of SmolLM2, its 49,152 tokens trimmed to 8,192 (ranked on a short corpus, the paragraph the
    CLI test copies, and 3,000 English words, to keep the test fast): the same network, so its drafts are the
    target's wherever the target's choice is among the kept tokens."""
    out = tmp_path_factory.mktemp("trimmed")
    (out / "corpus.txt").write_text(CORPUS_TEXT)
    (out / "copy.txt").write_text(COPY)
    return _draft_module().make_draft_gguf(smollm2_path, out / "smollm2-8k.gguf", 30, vocab=N_TOKENS,
                                           corpus=[out / "corpus.txt", out / "copy.txt"], words=3000)


def test_the_trimmed_gguf_keeps_the_control_tokens_the_frequent_ones_and_their_rows(smollm2_path, trimmed, tmp_path):
    src, cut = GGUFReader(smollm2_path), GGUFReader(trimmed)
    ids = [int(i) for i in cut.fields[TOKEN_IDS_KEY].contents()]
    src_tokens, cut_tokens = src.fields["tokenizer.ggml.tokens"].contents(), cut.fields["tokenizer.ggml.tokens"].contents()
    assert len(ids) == len(cut_tokens) == N_TOKENS and ids == sorted(set(ids)) and ids[-1] < len(src_tokens)
    assert cut_tokens == [src_tokens[i] for i in ids]
    types = src.fields["tokenizer.ggml.token_type"].contents()
    assert {i for i, t in enumerate(types) if t != 1} <= set(ids)  # every control token of SmolLM2 is kept
    # a common word, words of the corpus outside the 3,000 most common English ones, the newline; a rare word not
    assert {"Ġthe", "Ġslot", "Ġtokenizer", "Ċ"} <= set(cut_tokens) and "Ġpenguin" not in cut_tokens
    assert cut.fields["llama.block_count"].contents() == 30
    assert cut.fields["general.name"].contents().endswith(f"(draft: first 30 of 30 blocks, {N_TOKENS} tokens)")
    src_embd = next(t for t in src.tensors if t.name == "token_embd.weight")
    cut_embd = next(t for t in cut.tensors if t.name == "token_embd.weight")
    assert cut_embd.tensor_type == src_embd.tensor_type and list(cut_embd.shape) == [576, N_TOKENS]
    assert np.array_equal(np.asarray(cut_embd.data), np.asarray(src_embd.data)[ids])  # quantized rows, as they were
    again = _draft_module().make_draft_gguf(smollm2_path, tmp_path / "again.gguf", 30, vocab=N_TOKENS,
                                            corpus=[trimmed.parent / "corpus.txt", trimmed.parent / "copy.txt"],
                                            words=3000)
    assert again.read_bytes() == trimmed.read_bytes()  # deterministic
    with pytest.raises(ValueError, match="--vocab must be above"):
        _draft_module().make_draft_gguf(smollm2_path, tmp_path / "x.gguf", 30, vocab=10, corpus=[], words=10)


def test_the_headers_and_the_loaded_models_accept_the_map_and_find_the_same_faults(smollm2_path, trimmed, tmp_path):
    """The header check (run before a server unloads anything) and the load-time check agree: the map is fine; a
    draft token whose text is not the target's at its mapped id, or a map of the wrong length, is refused in the
    same words by both."""
    keep = frozenset({"tokenizer.ggml.tokens", TOKEN_IDS_KEY})
    target_meta = read_gguf_header(smollm2_path, keep)[0]
    tmap = read_token_map(trimmed)
    assert isinstance(tmap, TokenMap) and len(tmap.ids) == N_TOKENS and read_token_map(smollm2_path) is None
    # a token the draft lacks goes in as its most frequent one (SmolLM2 has no <unk>: id 0 is <|endoftext|>)
    assert tmap.unknown == GGUFReader(trimmed).fields[FALLBACK_KEY].contents() != 0
    text = edited_gguf_copy(trimmed, tmp_path / "text.gguf", "tokenizer.ggml.tokens", index=1000)
    mapped = tmap.ids[1000]
    with Backend(smollm2_path, CFG) as target:
        target_text = target.token_text(mapped)
        edited = (b"#" + target_text.encode()[1:]).decode("utf-8", "replace")  # its first byte changed
        for draft, why in ((trimmed, None),
                           (text, f"token 1000 (mapped to {mapped}) is {edited!r} vs {target_text!r}")):
            assert header_vocab_mismatch(target_meta, read_gguf_header(draft, keep)[0]) == why
            with Backend(draft, CFG) as loaded:
                assert vocab_mismatch(target, loaded, read_token_map(draft).ids) == why
        with Backend(trimmed, CFG) as loaded:
            assert vocab_mismatch(target, loaded, tmap.ids[:-1]) == f"its token map has {N_TOKENS - 1} entries for " \
                                                                   f"{N_TOKENS} tokens"
            assert vocab_mismatch(target, loaded) == f"{N_TOKENS} tokens vs 49152"  # without its map: refused
    shorter = dict(read_gguf_header(trimmed, keep)[0], **{TOKEN_IDS_KEY: tmap.ids[:-1]})
    assert header_vocab_mismatch(target_meta, shorter) == f"its token map has {N_TOKENS - 1} entries for {N_TOKENS} tokens"


def test_a_trimmed_draft_proposes_the_targets_own_ids(smollm2_path, trimmed):
    """Full depth, trimmed head: where the target's greedy choice is a kept token, the draft proposes exactly it,
    in the target's ids (draft id 1000 is not target id 1000); a prompt token outside the subset is fed as the
    most frequent kept token."""
    tmap = read_token_map(trimmed)
    with Backend(smollm2_path, CFG) as target, Backend(trimmed, ContextConfig(num_ctx=256, num_batch=64)) as d:
        dm = DraftModel(d, target, "smollm2", "smollm2-8k", tmap)
        prompt = target.tokenize(PROMPT)
        want = plain_greedy(target, prompt, 6)
        assert set(prompt + want) <= set(tmap.ids)  # so that the comparison below is exact
        assert dm.propose({0: (prompt, 6)}) == {0: want}
        rare = target.tokenize("Zygomorphic quaggas")
        outside = [t for t in rare if t not in set(tmap.ids)]
        assert outside  # the prompt really holds tokens the draft lacks
        got = dm.propose({0: (rare, 4)})[0]
        assert len(got) == 4 and set(got) <= set(tmap.ids)


def test_ollapy_run_with_a_trimmed_draft_answers_as_plain_and_drafts(smollm2_path, trimmed):
    base = ["run", str(smollm2_path), "--verbose", "--no-cache", "-o", "temperature=0", "-o", "num_predict=48"]
    plain = run_cli(*base, COPY)
    # a full-depth draft costs nearly a target step: with measured prices no acceptance pays and nothing would be
    # verified, so the policy's row cost is pinned low (OLLAPY_DRAFT_ROW_COST) to exercise the trimmed pipeline
    drafted = run_cli(*base, "-o", f"draft={trimmed}", COPY, env={"OLLAPY_DRAFT_ROW_COST": "0.05"})
    assert plain.returncode == 0 == drafted.returncode, drafted.stderr.decode()
    assert drafted.stdout == plain.stdout and drafted.stdout.strip()
    line = [ln for ln in drafted.stderr.decode().splitlines() if ln.startswith("draft:")]
    assert len(line) == 1, drafted.stderr.decode()
    proposed, accepted = map(int, re.match(r"draft:\s+(\d+) proposed, (\d+) accepted", line[0]).groups())
    assert proposed > 0 and accepted > 0, line[0]


def test_a_draft_model_gets_flash_attention_on_a_cpu_where_its_heads_are_wide(smollm2_path, trimmed, gemma_path,
                                                                             tmp_path):
    """On for Gemma 3's heads of 256 (faster there), off for SmolLM2's 64 (a chat turn's tail 4.6x slower with it);
    the model itself keeps ollapy's choice, and an explicit flash_attn applies to both."""
    from ollapy.engine.model import LoadedModel, draft_flash_attn
    from ollapy.options import Options

    gemma_draft = _draft_module().make_draft_gguf(gemma_path, tmp_path / "gemma-2.gguf", 2)
    assert draft_flash_attn("auto", False, gemma_draft) == "on" and draft_flash_attn("auto", False, trimmed) == "off"
    assert draft_flash_attn("off", False, gemma_draft) == "off" and draft_flash_attn("auto", True, gemma_draft) == "auto"
    with LoadedModel(gemma_path, Options(num_ctx=256, draft=str(gemma_draft)), draft_path=gemma_draft) as m:
        assert m.backend.flash_attn == "off" and m.draft_backend.flash_attn == "on"
    with LoadedModel(smollm2_path, Options(num_ctx=256, draft=str(trimmed)), draft_path=trimmed) as m:
        assert m.backend.flash_attn == "off" and m.draft_backend.flash_attn == "off"
        assert m.engine.spec.draft_model.n_vocab == N_TOKENS
