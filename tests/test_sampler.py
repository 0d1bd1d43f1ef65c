"""Sampler semantics, A/B against llama.cpp's own sampler chain on the same logits (SmolLM2, real decode).

* prompt tokens enter the penalty window (llama.cpp's server and Ollama's runner accept every prompt token
  into the sampler before the first sample);
* ``repeat_last_n = -1`` means ``num_ctx``; negative presence/frequency penalties are accepted;
* with a grammar, ollapy samples with the chain first and resamples with the grammar only on rejection
  (llama.cpp's ``common_sampler_sample``); greedy, that picks exactly what a grammar-first chain picks.
"""
from __future__ import annotations

from array import array

import pytest

from ollapy.engine.backend import bindings as eb
from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.backend.templating import json_schema_grammar
from ollapy.engine.sampler import Sampler
from ollapy.options import Options

PROMPT = ("<|im_start|>user\nSay the word banana five times, then the word apple five times.<|im_end|>\n"
          "<|im_start|>assistant\n")
STEPS = 24


@pytest.fixture(scope="module")
def backend(smollm2_path):
    b = Backend(smollm2_path, ContextConfig(n_parallel=1, num_ctx=512))
    yield b
    b.close()


def _chain(b: Backend, *, penalties=None, grammar: str | None = None, prompt=()):
    """A reference llama.cpp chain: [grammar] [penalties(last_n, repeat, freq, presence)] greedy; prompt
    tokens accepted into it as llama.cpp's server does."""
    C = eb.C
    ch = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    if grammar:
        C.llama_sampler_chain_add(ch, C.llama_sampler_init_grammar(b.vocab, grammar.encode(), b"root"))
    if penalties:
        last_n, rp, fp, pp = penalties
        C.llama_sampler_chain_add(ch, C.llama_sampler_init_penalties(b.n_vocab, last_n, rp, fp, pp))
        for t in prompt:
            C.llama_sampler_accept(ch, t)
    C.llama_sampler_chain_add(ch, C.llama_sampler_init_greedy())
    return ch


def _run(b: Backend, ours: Sampler, refs: list) -> tuple[list[int], list[list[int]]]:
    """Decode PROMPT, then STEPS tokens chosen by ``ours``; every reference chain samples the same logits."""
    C = eb.C
    b.seq_clear(0)
    toks = b.tokenize(PROMPT)
    n = len(toks)
    b.decode(array("i", toks), array("i", range(n)), array("i", [0] * n), array("b", [0] * (n - 1) + [1]))
    row, pos = n - 1, n
    got, ref_got = [], [[] for _ in refs]
    for _ in range(STEPS):
        for i, r in enumerate(refs):  # llama_sampler_sample reads (never writes) the logits buffer
            ref_got[i].append(C.llama_sampler_sample(r, b.ctx, row))
        tok = ours.sample(b, row)
        got.append(tok)
        if b.is_eog(tok):
            break
        b.decode(array("i", [tok]), array("i", [pos]), array("i", [0]), array("b", [1]))
        row, pos = 0, pos + 1
    for r in refs:
        C.llama_sampler_free(r)
    ours.close()
    return got, [g[:len(got)] for g in ref_got]


def test_prompt_tokens_enter_the_repeat_penalty_window(backend):
    prompt = backend.tokenize(PROMPT)
    o = Options(temperature=0, repeat_penalty=1.5, repeat_last_n=64)
    with_prompt = _chain(backend, penalties=(64, 1.5, 0.0, 0.0), prompt=prompt[-64:])
    without = _chain(backend, penalties=(64, 1.5, 0.0, 0.0))
    got, (ref, ref_no_prompt) = _run(backend, Sampler(backend, o, None, prompt), [with_prompt, without])
    assert got == ref
    assert ref_no_prompt != ref  # the prompt's tokens changed the choice: the A/B can tell the two apart


def test_repeat_last_n_minus_one_means_num_ctx_and_negative_penalties(backend):
    prompt = backend.tokenize(PROMPT)
    o = Options(temperature=0, repeat_penalty=1.2, repeat_last_n=-1, presence_penalty=-0.5, frequency_penalty=0.3)
    ref = _chain(backend, penalties=(backend.num_ctx, 1.2, 0.3, -0.5), prompt=prompt)
    got, (want,) = _run(backend, Sampler(backend, o, None, prompt), [ref])
    assert got == want
    assert Options().merged({"presence_penalty": -2, "frequency_penalty": -1.5}).presence_penalty == -2


@pytest.mark.parametrize("schema", [None, '{"type": "object", "properties": {"fruit": {"type": "string"}}, '
                                          '"required": ["fruit"]}'])
def test_grammar_checked_after_sampling_picks_what_grammar_first_picks(backend, schema):
    gbnf = json_schema_grammar(schema)
    o = Options(temperature=0, repeat_penalty=1.0)
    got, (want,) = _run(backend, Sampler(backend, o, gbnf, backend.tokenize(PROMPT)), [_chain(backend, grammar=gbnf)])
    assert got == want
    assert backend.token_piece(got[0]).strip().startswith(b"{")  # the grammar did constrain the first token
