"""A client that sends its own ``num_ctx`` with every message (aider through litellm's ``ollama_chat/``: about
1.25 x its prompt + 8192) reloads the model at most once over a conversation, and the prompt cache survives the
reload. Through ``ollapy serve`` with the official ``ollama`` client."""
from __future__ import annotations

from conftest import live_api

from ollapy.options import Options
from ollapy.server.scheduler import fits_loaded, grown_context


def test_grown_context_rounds_up_to_a_power_of_two_within_the_trained_context():
    assert grown_context(8938, 32768) == 16384
    assert grown_context(16384, 32768) == 16384
    assert grown_context(16385, 32768) == 32768
    assert grown_context(40000, 32768) == 32768  # Ollama caps a request at the trained context
    assert grown_context(8938, 8192) == 8192
    assert grown_context(5000, 0) == 8192  # trained context unknown: no cap


def test_fits_loaded_compares_num_ctx_and_nothing_else():
    loaded = Options(num_ctx=16384)
    assert fits_loaded(loaded, Options(num_ctx=8938)) and fits_loaded(loaded, Options(num_ctx=16384))
    assert not fits_loaded(loaded, Options(num_ctx=16385))
    assert fits_loaded(loaded, Options(num_ctx=40000), trained=16384)  # beyond the trained context: capped
    assert not fits_loaded(loaded, Options(num_ctx=8192, num_batch=64))  # another load option: a reload


FACTS = ["The river Nile flows north through eleven countries before it reaches the Mediterranean Sea.",
         "Honey found in ancient Egyptian tombs was still edible after three thousand years.",
         "Octopuses have three hearts, and two of them stop beating while they swim.",
         "The Eiffel Tower grows about fifteen centimetres taller in summer as its iron expands.",
         "A day on Venus lasts longer than a year on Venus."]


def _aider_num_ctx(prompt_tokens: int, i: int) -> int:
    """num_ctx as aider sends it: about 1.25 x the prompt + 8192, and now and then its smaller estimate again
    (it asked 8938, then 9914, then 8938 in one session)."""
    return int(1.25 * prompt_tokens) + 8192 - (976 if i % 3 == 2 else 0)


def _cached_tokens(url: str) -> float:
    """The server's count of prompt tokens served by the prompt cache so far (``/metrics``): the official
    ``ollama`` client drops ollapy's ``prompt_cache_tokens`` field."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "ollapy_tokens_total" and s.labels.get("kind") == "cached")


def test_aider_like_num_ctx_reloads_at_most_once(tmp_path_factory, gemma_path):
    """Gemma 3 (trained context 32768) loaded at 4096; ten messages asking 8,900-9,900 tokens, up and down: one
    reload, to 16384, which holds the rest; the reloaded model reuses the system prompt the first one saved."""
    models = {"gemma": {"parameters": {"num_ctx": 4096, "temperature": 0, "num_predict": 8}}}
    with live_api(tmp_path_factory.mktemp("numctx"), gemma_path, models) as api:
        oc = api.oc
        system = {"role": "system", "content": "You are a helpful assistant who answers briefly. " * 30}
        first = oc.chat(model="gemma", messages=[system, {"role": "user", "content": "Say hi."}])  # loads at 4096
        assert first.load_duration > 0
        messages = [system]
        loads, asked = [], []
        prompt_tokens = first.prompt_eval_count
        for i in range(10):
            messages.append({"role": "user", "content": f"{FACTS[i % len(FACTS)]} Say it in other words. ({i})"})
            num_ctx = _aider_num_ctx(prompt_tokens, i)
            asked.append(num_ctx)
            before = _cached_tokens(api.url)
            r = oc.chat(model="gemma", messages=messages, options={"num_ctx": num_ctx})
            cached = _cached_tokens(api.url) - before
            loads.append(r.load_duration > 0)
            if loads[-1]:  # the request that reloaded: the system prompt came from the prompt cache
                assert cached >= 0.9 * first.prompt_eval_count - 16, "the prompt cache did not survive the reload"
            elif i > 0:
                assert cached > 0
            prompt_tokens = r.prompt_eval_count
            messages.append({"role": "assistant", "content": r.message.content})
        assert len(set(asked)) > 3 and min(asked) < max(asked)  # num_ctx varied, up and down
        assert sum(loads) == 1, f"reloads: {loads} for num_ctx {asked}"
        assert [m.context_length for m in oc.ps().models] == [16384]
