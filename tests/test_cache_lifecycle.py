"""Prompt-cache rules on the real model: what reaches disk, what is never deleted, what a shift leaves reusable."""
from __future__ import annotations

from ollapy.cache import PromptCache
from ollapy.cache.manager import WRITE_BACK_NEWEST
from ollapy.cache.tiers import iter_state_files
from ollapy.engine.model import LoadedModel
from ollapy.options import Options
from ollapy.runner.loader import PathRef

RULES = " ".join(f"Rule {i}: answer the question politely, in one short sentence, and never invent facts."
                 for i in range(150))  # ~3,000 tokens with the chat template


def _msgs(system: str, q: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": q}]


def _model(path, root, num_ctx, write_back=True, n_parallel=1):
    opts = Options(num_ctx=num_ctx, num_parallel=n_parallel, temperature=0, num_predict=4)
    cache = PromptCache(PathRef(name="smol", path=path), opts, root=root, write_back=write_back)
    return LoadedModel(path, opts, cache=cache), opts


def _files(root):
    return sorted(p.name for p, *_ in iter_state_files(root))


def test_a_state_too_long_for_this_num_ctx_is_skipped_never_deleted(smollm2_path, tmp_path):
    with _model(smollm2_path, tmp_path, 4096)[0] as big:
        p = big.chat_prompt(_msgs(RULES, "What is 2 plus 2?"))
        assert 2600 < len(p.tokens) < 4000
        first = big.submit(p, big.options).result()[1]
        assert first.metrics.prefix_source == "none"
    saved = _files(tmp_path)
    assert saved
    small, opts = _model(smollm2_path, tmp_path, 2048)
    with small:
        c = small.cache
        # asked without the num_ctx bound, each saved state is found, and llama.cpp refuses it (set_data returns 0):
        # it is skipped from then on in this process, and kept on disk for processes with a larger num_ctx
        refused = 0
        while (hit := c.lookup(p.tokens)) is not None:
            assert len(hit.tokens) > 2048
            assert not small.backend.state_set(0, hit.load())
            c.record_refused(hit)
            refused += 1
        assert refused == len(saved) and c.snapshot().refused == refused
        small.backend.seq_clear(0)
        small.engine.slots[0].tokens = []
        text, last = small.submit(small.chat_prompt(_msgs(RULES, "What is 2 plus 2?"), opts), opts).result()
        assert last.metrics.truncated and last.metrics.prefix_source != "cache disk"
        assert c.snapshot().hits_disk == 0 and c.snapshot().corrupt == 0
    assert set(saved) <= set(_files(tmp_path))  # nothing this process could not use was deleted
    with _model(smollm2_path, tmp_path, 4096)[0] as again:
        last = again.submit(again.chat_prompt(_msgs(RULES, "What is 3 plus 3?")), again.options).result()[1]
        assert last.metrics.prefix_source == "cache disk"
        assert last.metrics.prompt_cache_tokens >= p.save_points[0]


def test_admission_one_off_tails_stay_in_ram_reused_ones_reach_disk(smollm2_path, tmp_path):
    system = " ".join(f"Policy {i}: be brief and factual." for i in range(40))
    m, opts = _model(smollm2_path, tmp_path, 2048, write_back=False, n_parallel=2)
    with m:
        c = m.cache
        per_request = []
        for i in range(4):  # one system prompt, unique one-off questions
            before = c.snapshot().bytes_written
            m.submit(m.chat_prompt(_msgs(system, f"Question {i}: name a colour.")), opts).result()
            c.flush()
            per_request.append(c.snapshot().bytes_written - before)
        assert per_request[0] > 0  # the system prompt's save point is written through
        assert per_request[1:] == [0, 0, 0]  # one-off tails stay in RAM
        snap = c.snapshot()
        assert snap.bytes_stored > snap.bytes_written and snap.files_written == 1
        # a conversation that continues: the earlier turn's tail is reused well past the system prompt -> disk
        history = _msgs(system, "Tell me a long story about a cat. " * 12)
        first, final = m.submit(m.chat_prompt(history), opts).result()
        c.flush()
        before = c.snapshot()
        follow = history + [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
        last = m.submit(m.chat_prompt(follow), opts).result()[1]
        c.flush()
        after = c.snapshot()
        assert last.metrics.prefix_source in ("slot", "cache ram")
        assert after.files_written > before.files_written
    # a new process (new cache object) hits the system prompt from disk
    with _model(smollm2_path, tmp_path, 2048, write_back=False)[0] as fresh:
        last = fresh.submit(fresh.chat_prompt(_msgs(system, "Question 9: name a fruit.")), fresh.options).result()[1]
        assert last.metrics.prefix_source == "cache disk"


def test_cli_cache_writes_back_its_tail_at_close(smollm2_path, tmp_path):
    m, opts = _model(smollm2_path, tmp_path, 2048, write_back=True)
    prompt = m.chat_prompt([{"role": "user", "content": "Summarise: " + "the cat sat on the mat. " * 30}])
    assert not prompt.save_points  # nothing is written through: only the close writes it
    with m:
        m.submit(prompt, opts).result()
        m.cache.flush()
        assert _files(tmp_path) == []
    assert len(_files(tmp_path)) == 1
    with _model(smollm2_path, tmp_path, 2048)[0] as again:
        last = again.submit(prompt, opts).result()[1]
        assert last.metrics.prefix_source == "cache disk"
        assert last.metrics.prompt_cache_tokens == len(prompt.tokens) - 1


def test_after_a_shift_only_the_kept_prefix_is_reused(smollm2_path, tmp_path):
    opts = Options(num_ctx=96, num_parallel=1, temperature=0, num_predict=150, repeat_penalty=1.0)
    with LoadedModel(smollm2_path, opts) as m:
        msgs = [{"role": "system", "content": "You are a counting machine."},
                {"role": "user", "content": "Count from 1 to 1000 with commas."}]
        prompt = m.chat_prompt(msgs)
        text, final = m.submit(prompt, opts).result()
        assert final.metrics.shifts >= 1
        slot = m.engine.slots[0]
        keep = m.engine.resolve_keep(prompt.keep, opts)
        # the slot keeps only the kept prefix: the shifted cells (and the decode-shaped ones) are trimmed
        assert slot.exact == keep == len(slot.tokens)
        # the same tokens again: only the kept prefix may come from the shifted slot, resumed on the chunk grid
        again = m.submit(type(prompt)(list(final.tokens), prompt.keep, (), ""), opts.merged({"num_predict": 8}))
        last = again.result()[1]
        from ollapy.engine.prefix.evalorder import canonical_reuse

        grid = (m.engine.reuse_align, m.engine.unshifted)  # the 4-grid, or none on an answer-reuse build (evalorder)
        assert last.metrics.prompt_cache_tokens == canonical_reuse(keep, len(final.tokens), *grid) > 0
        assert last.metrics.prefix_source == "slot"
        # and it generates what a cold run of those tokens generates
        m.backend.seq_clear(0)
        slot.tokens, slot.exact = [], 0
        cold = m.submit(type(prompt)(list(final.tokens), prompt.keep, (), ""), opts.merged({"num_predict": 8}))
        warm_text = again.output_tokens
        assert cold.result()[1].metrics.prompt_cache_tokens == 0
        assert cold.output_tokens == warm_text


def test_states_move_between_contexts_with_different_slot_counts(smollm2_path, tmp_path):
    """llama.cpp refuses a state saved with another number of KV streams; ollapy saves them in a 1-stream layout,
    so a 3-slot server's states restore in a 1-slot `ollapy run` and back, with the cold run's greedy output."""
    systems = [" ".join(f"House rule {j} of set {i}: be kind and brief." for j in range(14)) for i in range(3)]
    q = "Name one colour."
    wide, opts3 = _model(smollm2_path, tmp_path, 1024, n_parallel=3)
    with wide:
        reqs = [wide.submit(wide.chat_prompt(_msgs(s, q)), opts3) for s in systems]  # one per slot, at once
        for r in reqs:
            r.result()
    one, opts1 = _model(smollm2_path, tmp_path, 1024)
    reused = []
    with one:
        for s in systems:
            p = one.chat_prompt(_msgs(s, q))
            text, last = one.submit(p, opts1).result()
            assert last.metrics.prefix_source == "cache disk"
            reused.append((last.metrics.prompt_cache_tokens, p.keep, len(p.tokens)))
            one.engine.slots[0].tokens = []
            one.backend.seq_clear(0)
            cold, _ = one.submit(p, opts1, cache=False).result()
            assert text == cold
        # every system prompt was written through (at least it is restored); of the three one-off answers the
        # closing write-back cache wrote only the newest (WRITE_BACK_NEWEST), which restores all but one token
        assert all(n_reused >= keep > 1 for n_reused, keep, _ in reused), reused
        assert sum(n_reused == n - 1 for n_reused, _, n in reused) == WRITE_BACK_NEWEST, reused
        new_sys = "Brand new instructions: answer in exactly one word. " * 8
        one.submit(one.chat_prompt(_msgs(new_sys, q)), opts1).result()
    wide2, opts3 = _model(smollm2_path, tmp_path, 1024, n_parallel=3)
    with wide2:
        last = wide2.submit(wide2.chat_prompt(_msgs(new_sys, q)), opts3).result()[1]
        assert last.metrics.prefix_source == "cache disk"
