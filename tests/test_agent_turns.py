"""An agent's turns through ``/v1/messages`` (the official ``anthropic`` SDK, as Claude Code sends them): nothing
ollapy does moves content between the turns' prompts. ``system`` blocks stay where the client put them (joined at
the top, in order; a later ``system`` turn stays in its place, never hoisted: Ollama's issue #18431 broke Claude
Code's prefix cache that way), and ``cache_control`` is accepted and ignored, so each turn's prompt starts with the
whole previous one and the prompt cache serves it."""
from __future__ import annotations

import json

import anthropic
import pytest
from conftest import live_api, run_cli

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


WEATHER = [{"name": "get_weather", "description": "The weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def gemma_api(tmp_path_factory, gemma_path):
    # Gemma 3 base has no chat template: tools go through llama.cpp's generic format (a grammar-held JSON answer)
    with live_api(tmp_path_factory.mktemp("turns-gemma"), gemma_path, {"g": {"parameters": {"num_ctx": 2048}}}) as api:
        api.ac = anthropic.Anthropic(base_url=api.url, api_key="none", max_retries=0)
        yield api


def test_a_tool_call_comes_back_as_the_model_wrote_it_and_its_answer_is_reused(gemma_api):
    """The grammar leaves the model its own spacing, so the call sent back (a ``tool_use`` block) is written into
    the next prompt as the model wrote it, not as new JSON: the next turn's prompt cache reaches past the
    previous prompt into the answer (on a row-invariant build, where answers are reused)."""
    ac = gemma_api.ac
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = ac.messages.create(model="g", max_tokens=64, tools=WEATHER, tool_choice={"type": "any"},
                               messages=messages, **GREEDY)
    assert first.stop_reason == "tool_use" and first.content[-1].type == "tool_use", first
    call = first.content[-1]
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "-3 C"}]}]
    second = ac.messages.create(model="g", max_tokens=8, tools=WEATHER, messages=messages, **GREEDY)
    prev = _prompt_tokens(first.usage)
    reused = second.usage.cache_read_input_tokens
    assert reused >= prev - 64, (first.usage, second.usage)  # the whole previous prompt, as always
    info = run_cli("info", "--json")
    if json.loads(info.stdout)["answer_reuse"].startswith("yes"):
        # all of the answer but its last tokens (the turn's end is written by the template, not generated)
        assert reused >= prev + first.usage.output_tokens - 4, (first.usage, second.usage)
