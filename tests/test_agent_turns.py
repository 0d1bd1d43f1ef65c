"""An agent's turns through ``/v1/messages`` (the official ``anthropic`` SDK, as Claude Code sends them): nothing
ollapy does moves content between the turns' prompts. ``system`` blocks stay where the client put them (joined at
the top, in order; a later ``system`` turn stays in its place, never hoisted: Ollama's issue #18431 broke Claude
Code's prefix cache that way), and ``cache_control`` is accepted and ignored, so each turn's prompt starts with the
whole previous one and the prompt cache serves it."""
from __future__ import annotations

import anthropic
import pytest
from conftest import live_api

GREEDY = {"extra_body": {"temperature": 0.0, "options": {"repeat_penalty": 1.0}}}
EPHEMERAL = {"type": "ephemeral"}
RULES = "You are a careful coding agent. " + " ".join(
    f"Rule {i}: keep answers short and name the file you change ({i})." for i in range(40))
SYSTEM = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=00000;"},
          {"type": "text", "text": RULES, "cache_control": EPHEMERAL}]


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    with live_api(tmp_path_factory.mktemp("turns"), smollm2_path, {"smol": {"parameters": {"num_ctx": 4096}}}) as api:
        api.ac = anthropic.Anthropic(base_url=api.url, api_key="none", max_retries=0)
        yield api


def _prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens


def test_system_blocks_stay_in_place_and_each_turn_reuses_the_last(api):
    ac = api.ac
    grid = 64  # the prompt cache's block (ollapy.cache.manager.BLOCK): a turn may re-evaluate up to one block
    messages = [{"role": "user", "content": [{"type": "text", "text": "List the files in src.",
                                              "cache_control": EPHEMERAL}]}]
    turns = []
    for question in ("Now open main.py.", "What does it import?"):
        r = ac.messages.create(model="smol", max_tokens=16, system=SYSTEM, messages=messages, **GREEDY)
        assert r.type == "message" and r.stop_reason in ("end_turn", "max_tokens")
        turns.append(r.usage)
        messages = messages + [{"role": "assistant", "content": [{"type": "text", "text": r.content[0].text}]},
                               {"role": "user", "content": [{"type": "text", "text": question,
                                                             "cache_control": EPHEMERAL}]}]
    # a later turn carries a system turn of its own (Claude Code's reminders): it stays where it is
    messages.insert(len(messages) - 1, {"role": "system", "content": "Reminder: the user prefers Python."})
    r = ac.messages.create(model="smol", max_tokens=16, system=SYSTEM, messages=messages, **GREEDY)
    turns.append(r.usage)
    for prev, cur in zip(turns, turns[1:]):
        # everything the previous turn's prompt held, but for the tail after its last grid point, came from the cache
        assert cur.cache_read_input_tokens >= _prompt_tokens(prev) - grid, turns
        assert _prompt_tokens(cur) > _prompt_tokens(prev)
    # count_tokens renders the same prompt; the two blocks are at the top in the client's order, never reordered
    # or merged by ollapy: in the other order they make another prompt (a cache miss from its top)
    count = ac.messages.count_tokens(model="smol", system=SYSTEM, messages=messages).input_tokens
    assert count == _prompt_tokens(r.usage)
    swapped = ac.messages.count_tokens(model="smol", system=SYSTEM[::-1], messages=messages).input_tokens
    assert abs(swapped - count) <= 2  # the same text in the other order
    again = ac.messages.create(model="smol", max_tokens=1, system=SYSTEM[::-1], messages=messages[:1], **GREEDY)
    assert again.usage.cache_read_input_tokens < 16
