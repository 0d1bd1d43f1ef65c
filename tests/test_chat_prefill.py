"""A trailing assistant message is a prefill: the answer continues it (Ollama's /api/chat, llama.cpp's server).

The table renders message sequences with both test models' templates (SmolLM2's own ChatML template from
its GGUF, Gemma's built-in fallback) and states the expected prompt text; a real model then continues the
prefilled sentence through the live server, through the official ``ollama`` client."""
from __future__ import annotations

import pytest
from conftest import live_server

from ollapy.engine.model import LoadedModel
from ollapy.options import Options

U = {"role": "user", "content": "What is the capital of France?"}
S = {"role": "system", "content": "Answer briefly."}
A_DONE = {"role": "assistant", "content": "Paris."}
PREFILL = {"role": "assistant", "content": "The capital of France is"}


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def model(request, smollm2_path, gemma_path):
    path = smollm2_path if request.param == "smollm2" else gemma_path
    with LoadedModel(path, Options(num_ctx=512, num_parallel=1, temperature=0, num_predict=8)) as m:
        yield m


def _closed(m: LoadedModel, msgs: list[dict]) -> str:
    """The template's own rendering (no prefill rule): every turn closed, then the generation prompt."""
    from ollapy.engine.backend.templating import render_chat_template

    return render_chat_template(m.template.text, msgs, m.bos_text, m.eos_text, True)


@pytest.mark.parametrize("msgs, prefill", [
    ([U], None),
    ([S, U], None),
    ([U, PREFILL], PREFILL["content"]),
    ([S, U, PREFILL], PREFILL["content"]),
    ([S, U, A_DONE, U, PREFILL], PREFILL["content"]),
    ([S, U, A_DONE, U], None),
    ([U, {"role": "assistant", "content": ""}], None),  # nothing to continue: a new turn as the template says
    ([U, {"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
     None),
])
def test_render_table(model, msgs, prefill):
    text = model.render(msgs)
    if prefill is None:
        assert text == _closed(model, msgs)
    else:
        head = model.render(msgs[:-1])
        assert text == head + prefill and head == _closed(model, msgs[:-1])
        assert text != _closed(model, msgs)  # the template alone would close the turn and open a new one


def test_prefill_is_continued_not_restarted(smollm2_path, tmp_path):
    """Through `ollapy serve` and the official client: the reply continues 'The capital of France is'."""
    import ollama

    with live_server(tmp_path, "--allow-paths") as url:
        c = ollama.Client(host=url)
        r = c.chat(model=str(smollm2_path), messages=[U, PREFILL], options={"temperature": 0, "num_predict": 6})
        assert r.message.content.startswith(" Paris"), r.message.content
        plain = c.chat(model=str(smollm2_path), messages=[U], options={"temperature": 0, "num_predict": 6})
        assert r.prompt_eval_count > plain.prompt_eval_count  # the prefill's tokens are part of the prompt


def test_gemma_fallback_keeps_every_system_message():
    """Codex sends two developer (system) messages, and the generic tool format appends the tools to the first:
    Gemma's fallback template once kept only the last one, dropping Codex's instructions and every tool."""
    from ollapy.chat import generic_tools
    from ollapy.chat import templates as chat
    from ollapy.engine.backend.templating import render_chat_template

    tools = [{"type": "function", "function": {"name": "exec_command", "description": "run", "parameters": {}}}]
    msgs = generic_tools.generic_messages(
        [{"role": "system", "content": "You are a coding agent."}, {"role": "system", "content": "Skills: none."}, U],
        tools)
    text = render_chat_template(chat.GEMMA, msgs, "<bos>", "<eos>", True)
    assert text.startswith("<bos><start_of_turn>user\nYou are a coding agent.")
    assert '"exec_command"' in text and generic_tools.INSTRUCTION in text
    assert text.index("exec_command") < text.index("Skills: none.\n\n" + U["content"] + "<end_of_turn>")
