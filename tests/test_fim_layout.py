"""The FIM prompt layout (:mod:`ollapy.chat.fim`) on Qwen2.5-Coder's real tokenizer (vocabulary only, no weights):
where the typed text goes, the save point a keystroke keeps, and cuts that keep a growing prefix's first token."""
from __future__ import annotations

import pytest

from ollapy.chat.fim import FimRequest, FimTokens, fim_tokens, window_for


@pytest.fixture(scope="module")
def vocab(qwen_coder_path):
    from ollapy.engine.backend.bindings import finish_imports

    finish_imports()  # ollapy may be importing llama_cpp in its background thread: wait for it first
    from llama_cpp import Llama

    llm = Llama(str(qwen_coder_path), vocab_only=True, verbose=False)

    def tok(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False, special=False)

    fim = FimTokens(*(llm.tokenize(t.encode(), add_bos=False, special=True)[0] for t in (
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")))
    return tok, fim


BODY = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(120))  # ~1,900 tokens


def test_typed_text_after_the_middle_token_or_in_place(vocab):
    tok, ids = vocab
    pre, line, suf = "def area(r):\n", "    return ", "\nprint(area(1))\n"
    moved = fim_tokens(FimRequest(pre + line, suf, layout="moved-line"), ids, tok, num_ctx=4096)
    assert moved.tokens == [ids.pre, *tok(pre), ids.suf, *tok(suf), ids.mid, *tok(line)]
    assert moved.stable == moved.tokens.index(ids.mid) + 1  # everything through FIM_MID stays
    plain = fim_tokens(FimRequest(pre + line, suf), ids, tok, num_ctx=4096)  # auto: Continue's shape stays plain
    assert plain.tokens == [ids.pre, *tok(pre + line), ids.suf, *tok(suf), ids.mid]
    assert plain.tokens[:plain.stable] == [ids.pre, *tok(pre)]  # the prefix up to the line being typed
    infill = fim_tokens(FimRequest(pre, suf, typed=line, repo=True), ids, tok, num_ctx=4096)  # auto: plain, as
    # llama-server's format_prompt_infill: the typed text, tokenized apart, ends the prefix
    at = infill.tokens.index(ids.pre)
    assert infill.tokens[:1] == [ids.rep] and infill.tokens[-1] == ids.mid
    assert infill.tokens[at:] == [ids.pre, *tok(pre), *tok(line), ids.suf, *tok(suf), ids.mid]
    assert infill.tokens[:infill.stable] == infill.tokens[:at + 1 + len(tok(pre))]  # saved: up to the typed text
    after = fim_tokens(FimRequest(pre, suf, typed=line, repo=True, layout="moved-line"), ids, tok, num_ctx=4096)
    assert after.tokens[-len(tok(line)):] == tok(line) and after.tokens[after.stable - 1] == ids.mid


def test_a_growing_prefix_keeps_its_first_token_and_the_cut_follows_llama_server(vocab):
    tok, ids = vocab
    num_ctx = 1024
    share = 3 * (window_for(num_ctx) // 4)
    firsts, stables = set(), []
    for n in range(0, 40, 3):  # keystrokes on the last line
        lay = fim_tokens(FimRequest(BODY + "def g(x):\n    return x * " + "y" * n, "\n"), ids, tok, num_ctx=num_ctx)
        assert lay.truncated and lay.tokens[0] == ids.pre
        prefix = lay.tokens[1:lay.tokens.index(ids.suf)]
        assert share - share // 4 < len(prefix) <= share  # at most the last 3W/4 tokens; the cut moves in steps
        firsts.add(prefix[0])
        stables.append(lay.stable)
    assert len(firsts) == 1 and len(set(stables)) == 1  # every keystroke: the same prefix start, the same save point
    lay = fim_tokens(FimRequest("x = 1\n", BODY), ids, tok, num_ctx=num_ctx)
    suffix = lay.tokens[lay.tokens.index(ids.suf) + 1:-1]
    assert suffix == tok(BODY)[:window_for(num_ctx) // 4 - 2]  # the first W/4 - 2 suffix tokens


def test_repository_context_takes_what_the_window_leaves(vocab):
    tok, ids = vocab
    chunks = tuple((f"m{i}.py", f"def h{i}():\n    pass\n") for i in range(200))
    lay = fim_tokens(FimRequest("a = ", "\n", typed="", extra=chunks, repo=True), ids, tok, num_ctx=1024, room=16)
    assert lay.truncated and lay.tokens.index(ids.pre) == 1024 - window_for(1024) - 32  # its last tokens
    whole = fim_tokens(FimRequest("a = ", "\n", typed="", extra=chunks[:2], repo=True), ids, tok, num_ctx=1024)
    want = [ids.rep, *tok("myproject\n")]
    for name, text in chunks[:2]:
        want += [ids.sep, *tok(name + "\n"), *tok(text)]
    assert whole.tokens[:whole.tokens.index(ids.pre)] == want + [ids.sep, *tok("filename\n")]
    assert not whole.truncated
