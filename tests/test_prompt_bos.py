"""A chat template that writes ``{{ bos_token }}`` (Gemma 3's) gives one BOS, as llama.cpp's server does.

llama.cpp strips a rendered template's leading BOS text when the tokenizer adds BOS itself (``common/chat.cpp``,
"to avoid double BOS"). Tokenizing the text with it left in makes ``llama_tokenize`` add a second BOS and log
"the final prompt starts with 2 BOS tokens" on every request (seen in ``ollapy serve --verbose`` under Codex).
"""
from __future__ import annotations

import ctypes

import pytest

from ollapy.engine.model import LoadedModel
from ollapy.options import Options

OPTS = Options(num_ctx=512, num_parallel=1, temperature=0)
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another one."}]


@pytest.fixture()
def llama_log():
    """A function that starts keeping llama.cpp's log lines (ollapy routes them to nothing otherwise) and returns
    the list they go to. Call it after the model has loaded: llama-cpp-python's package import, which finishes
    while a model loads, installs its own callback."""
    from ollapy.engine.backend import bindings

    lines: list[str] = []

    @bindings.C.llama_log_callback
    def keep(level, text, user_data):  # pragma: no cover - C callback
        lines.append(text.decode(errors="replace"))

    def start() -> list[str]:
        bindings.C.llama_log_set(keep, ctypes.c_void_p(0))
        return lines

    try:
        yield start
    finally:
        bindings._silence_llama_log()


@pytest.mark.parametrize("model_fixture", ["gemma_path", "smollm2_path"])
def test_a_rendered_chat_prompt_has_one_bos_and_no_warning(request, model_fixture, llama_log):
    m = LoadedModel(request.getfixturevalue(model_fixture), OPTS)
    try:
        b = m.backend
        text = m.render(CHAT)
        log = llama_log()
        p = m.chat_prompt(CHAT)
        built = [ln for ln in log if "BOS" in ln]
        b.tokenize("<bos>x")  # the control: llama.cpp does warn when a text it adds BOS to starts with one
        assert not built and len([ln for ln in log if "BOS" in ln]) == int(b.add_bos), log
        # the reference: the rendered text read token for token, BOS included only where the template writes it
        written = b.tokenize(text, add_special=False, parse_special=True)
        if b.add_bos and not text.startswith(m.bos_text):  # the tokenizer's BOS, not the template's
            written = [b.bos] + written
        assert p.tokens == written
        assert p.tokens.count(b.bos) == (1 if b.add_bos else p.tokens.count(b.bos))
        if model_fixture == "gemma_path":  # Gemma's template writes <bos> and its tokenizer adds one
            assert b.add_bos and text.startswith(m.bos_text) and p.tokens[0] == b.bos != p.tokens[1]
    finally:
        m.close()
