"""Prompt cache with real models: restored greedy output equals cold output, bad files are misses, caps hold."""
from __future__ import annotations

import shutil

import pytest

from ollapy.cache import BoundCache, PromptCache
from ollapy.cache.tiers import disk_usage
from ollapy.engine.model import LoadedModel, Prompt
from ollapy.options import Options

SYSTEM = " ".join(f"Rule {i}: always answer politely and briefly, rule number {i}." for i in range(10))
QUESTIONS = ["What is the capital of France? Answer in one word.", "What is 2 plus 2? Answer with a number."]
OPTS = Options(num_ctx=1024, num_parallel=2, temperature=0, num_predict=10)


class _Ref:
    def __init__(self, path, name="m"):
        self.path, self.name, self.digest = path, name, None


def _clear(m: LoadedModel) -> None:
    for s in m.engine.slots:
        s.tokens = []
        m.backend.seq_clear(s.id)


def _bind(m: LoadedModel, root, **kw):
    cache = PromptCache(_Ref(m.path), OPTS, root=root, **kw).bind(m)
    m.engine.cache = cache
    return cache


def _sync(c) -> None:
    """Write RAM-only entries to disk and wait, as a CLI process's cache does when it is closed."""
    c.write_back_now()
    c.flush()


def _run(m: LoadedModel, prompt: Prompt, cache: bool = True, clear: bool = True):
    if clear:
        _clear(m)
    text, last = m.submit(prompt, OPTS, cache=cache).result()
    return text, last.metrics.prompt_cache_tokens


def _msgs(q, system=SYSTEM):
    return [{"role": "system", "content": system}, {"role": "user", "content": q}]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    m = LoadedModel(smollm2_path, OPTS)
    yield m
    m.close()


def _cold(m, prompt):
    return _run(m, prompt, cache=False)[0]


def test_ram_and_disk_hits_equal_cold(smol, tmp_path):
    c = _bind(smol, tmp_path)
    p0, p1 = (smol.chat_prompt(_msgs(q)) for q in QUESTIONS)
    _run(smol, p0)
    _sync(c)
    cold = _cold(smol, p1)
    text, reused = _run(smol, p1)
    assert reused >= p0.save_points[0] and text == cold
    assert c.stats.c["hits_ram"] == 1
    # a new cache object (empty RAM tier) on the same directory: a disk hit, as in a new process
    c2 = _bind(smol, tmp_path)
    text, reused = _run(smol, p1)
    assert reused >= p0.save_points[0] and text == cold
    assert c2.stats.c["hits_disk"] == 1


def test_trimming_a_longer_saved_state_equals_cold(smol, tmp_path):
    c = _bind(smol, tmp_path)
    long = smol.chat_prompt(_msgs(QUESTIONS[0]))
    _run(smol, long)
    _sync(c)
    for cut in (100, len(long.tokens) - 5):
        short = Prompt(long.tokens[:cut], 1, (), "")
        cold = _cold(smol, short)
        _bind(smol, tmp_path)  # disk tier only
        text, reused = _run(smol, short)
        assert reused == cut - 1 and text == cold, cut


def test_in_context_copy_equals_cold(smol, tmp_path):
    _bind(smol, tmp_path)
    p0, p1 = (smol.chat_prompt(_msgs(q)) for q in QUESTIONS)
    cold = _cold(smol, p1)
    _clear(smol)
    long_opts = OPTS.merged({"num_predict": 60})
    r0 = smol.submit(p0, long_opts, cache=False)  # occupies a slot while p1 arrives
    next(iter(r0))
    text, last = smol.submit(p1, OPTS, cache=False).result()
    r0.result()
    assert text == cold and last.metrics.prompt_cache_tokens > 0


def _stored_file(c):
    _sync(c)
    files = list(c.directory.glob("*.kv"))
    assert len(files) == 1
    return files[0]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "foreign", "kvtype"])
def test_bad_files_are_misses_and_deleted(smol, tmp_path, damage):
    c = _bind(smol, tmp_path)
    p = smol.chat_prompt(_msgs(QUESTIONS[0]))
    _run(smol, p)
    f = _stored_file(c)
    cold = _cold(smol, p)
    c2 = _bind(smol, tmp_path)
    target = f
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:-1000])
    elif damage == "flip":
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    elif damage == "empty":
        f.write_bytes(b"")
    else:  # a file from another model / another KV type placed in this model's directory
        good = PromptCache(_Ref(smol.path), OPTS, root=tmp_path / "other")
        salt = dict(c.salt, type_k="q8_0", type_v="q8_0") if damage == "kvtype" else c.salt
        other = BoundCache(good, smol.path, "f" * 64 if damage == "foreign" else c.model_sha256, salt, "x")
        _clear(smol)
        smol.engine.cache = other
        smol.submit(p, OPTS).result()
        src = _stored_file(other)
        f.unlink()
        target = c2.directory / src.name
        shutil.copy(src, target)
        smol.engine.cache = c2
    damaged = target.read_bytes()
    text, reused = _run(smol, p)
    assert text == cold and reused == 0
    if damage == "flip":  # a payload byte: caught by the checksum that runs during llama_state_seq_set_data
        assert c2.snapshot().corrupt == 1
    # the bad file was deleted; the request's own (good) state may have been written under the same name since
    _sync(c2)
    if target.exists():
        assert target.read_bytes() != damaged
        from ollapy.cache.fileformat import read_header

        read_header(target, c2.model_sha256, c2.salt)


def test_forced_hash_collision_never_serves_a_wrong_prefix(smol, tmp_path):
    c = _bind(smol, tmp_path, hash_fn=lambda parent, block: b"\0" * 16)
    p0 = smol.chat_prompt(_msgs(QUESTIONS[0]))
    p1 = smol.chat_prompt(_msgs(QUESTIONS[1], system="Be terse. " * 40))
    _run(smol, p0)
    _sync(c)
    cold = _cold(smol, p1)
    text, reused = _run(smol, p1)
    assert text == cold and reused < 16  # only the real common prefix (the template's first tokens) at most


def test_disk_and_ram_caps_hold(smol, tmp_path):
    one = 3_000_000
    c = _bind(smol, tmp_path, ram_bytes=2 * one, disk_bytes=3 * one)
    for i in range(6):
        _run(smol, smol.chat_prompt(_msgs(f"Question {i}: what is {i} plus {i}?", system=f"System {i}. " * 25)))
        assert c.ram.bytes <= 2 * one
    _sync(c)
    assert disk_usage(tmp_path)["disk_bytes"] <= 3 * one
    assert disk_usage(tmp_path)["disk_files"] >= 1


def test_pinned_entry_survives_the_cap(smol, tmp_path):
    c = _bind(smol, tmp_path, disk_bytes=4_000_000)
    pinned = smol.chat_prompt(_msgs("", system="Pinned system prompt. " * 30))
    _clear(smol)
    smol.submit(pinned, OPTS.merged({"num_predict": 0}), pin=True).result()
    _sync(c)
    for i in range(4):
        _run(smol, smol.chat_prompt(_msgs(f"Q{i}?", system=f"Other {i}. " * 30)))
    _sync(c)
    u = disk_usage(tmp_path)
    assert u["pinned_files"] == 1
    c2 = _bind(smol, tmp_path)
    text, reused = _run(smol, smol.chat_prompt(_msgs("Hello?", system="Pinned system prompt. " * 30)))
    assert reused > 0 and c2.stats.c["hits_disk"] == 1


def test_no_cache_request_bypasses(smol, tmp_path):
    c = _bind(smol, tmp_path)
    p = smol.chat_prompt(_msgs(QUESTIONS[0]))
    _run(smol, p, cache=False)
    _sync(c)
    assert not list(c.directory.glob("*.kv"))
    assert _run(smol, p, cache=False)[1] == 0


@pytest.fixture(scope="module")
def gemma(gemma_path):
    m = LoadedModel(gemma_path, Options(num_ctx=2048, temperature=0, num_predict=10))
    yield m
    m.close()


def test_gemma_sliding_window_restores_equal_cold_or_miss(gemma, tmp_path):
    """Gemma (sliding window 512), prompts longer than the window, restored from a longer saved state
    and trimmed: the output equals a cold run (fresh prefill, no reuse) or the restore is a miss.

    The prompt is a counting sequence, whose greedy continuation is robust: Gemma's Q4_K kernels are not
    batch-invariant, so a fragile prompt can change its greedy text with the prefill split alone."""
    opts = Options(num_ctx=2048, temperature=0, num_predict=12)
    c = PromptCache(_Ref(gemma.path, "g"), opts, root=tmp_path).bind(gemma)
    gemma.engine.cache = c
    base = gemma.raw_prompt(", ".join(str(i) for i in range(1, 330)) + ",")
    assert len(base.tokens) > 1000
    _clear(gemma)
    gemma.submit(base, opts).result()
    _sync(c)
    comma = gemma.tokenize(",")[-1]
    cuts = [i + 1 for i, t in enumerate(base.tokens) if t == comma and i > 0]
    hits = 0
    for cut in (cuts[40], cuts[200], cuts[-20]):  # inside the first window, past it, near the end
        toks = base.tokens[:cut]
        gemma.engine.cache = None
        _clear(gemma)
        cold, _ = gemma.submit(Prompt(toks, 1, (), ""), opts, cache=False).result()
        gemma.engine.cache = PromptCache(_Ref(gemma.path, "g"), opts, root=tmp_path).bind(gemma)
        _clear(gemma)
        text, last = gemma.submit(Prompt(toks, 1, (), ""), opts).result()
        _sync(gemma.engine.cache)  # as a CLI process would at exit: the next cut may use this state whole
        reused = last.metrics.prompt_cache_tokens
        assert reused < cut, cut
        hits += reused > 0
        assert text == cold, (cut, reused)
    # a saved sliding-window state is only restored whole (llama.cpp saves only in-window SWA cells),
    # as a strict prefix of the prompt: e.g. an earlier request's prompt plus its generated tokens
    assert hits >= 1
