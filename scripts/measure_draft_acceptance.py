#!/usr/bin/env python3
"""Does ``repeat_penalty`` hold drafting back? Per-token acceptance of a draft model's proposals (issue 55).

For each code prompt of scripts/bench_spec_pair.py the target (default Qwen2.5-Coder-1.5B-Instruct) answers
through ollapy's engine at the model's default sampling (temperature 0.8, top_k 40, top_p 0.9, seed 1) twice:
with ``repeat_penalty`` 1.1 (the default) and 1.0. The draft model (default the 0.5B) then evaluates prompt +
answer in one batch, and at every answer position its greedy proposal is compared with the token the target
sampled there; that match rate is the per-token acceptance of a one-token draft (the quantity the drafting
policy estimates; Leviathan et al. 2023's alpha for a point-mass draft). Two proposals are compared:

- ``raw``: the draft's argmax of its raw logits (what ollapy's DraftModel proposes);
- ``penalized``: the argmax after llama.cpp's repeat penalty (``llama_sampler_penalties``: a logit l of a token
  among the last ``repeat_last_n`` tokens of prompt + answer becomes l / p when l > 0, else l * p) with the
  target's penalty, i.e. the draft mirrors the target's penalized distribution.

No timing is involved: the figures do not depend on the machine's load. Prints a table; informational (no
target), the evidence for or against changing how a draft is proposed under a penalty.

Usage: python scripts/measure_draft_acceptance.py [--target PATH] [--draft PATH] [--num-predict N] [--threads N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def generate(target: Path, prompts: list[str], penalties: list[float], n: int, threads: int) -> dict:
    """{(prompt index, penalty): (prompt tokens, answer tokens)} from ollapy's engine, seeded default sampling."""
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    out = {}
    with LoadedModel(target, Options(num_ctx=2048, num_thread=threads)) as m:
        for i, text in enumerate(prompts):
            p = m.chat_prompt([{"role": "user", "content": text}])
            for rp in penalties:
                opts = Options(num_ctx=2048, num_thread=threads, seed=1, repeat_penalty=rp, num_predict=n)
                toks: list[int] = []
                for c in m.submit(p, opts, cache=False):
                    if c.done:  # the last chunk carries the context: prompt and answer tokens
                        assert c.tokens[:len(p.tokens)] == list(p.tokens)
                        toks = c.tokens[len(p.tokens):]
                out[(i, rp)] = (list(p.tokens), toks)
                print(f"  prompt {i + 1}, repeat_penalty {rp}: {len(toks)} tokens", file=sys.stderr, flush=True)
    return out


def draft_logits(draft: Path, tokens: list[int], threads: int) -> np.ndarray:
    """The draft model's logits at every position of ``tokens`` (one batch), shape (len(tokens), n_vocab)."""
    from llama_cpp import llama_cpp as C

    from ollapy.engine.backend.bindings import choose_extra_bufts

    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = choose_extra_bufts("auto")[0]
    model = C.llama_model_load_from_file(str(draft).encode(), mp)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    cp = C.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(512, len(tokens))
    cp.n_threads = cp.n_threads_batch = threads
    ctx = C.llama_init_from_model(model, cp)
    batch = C.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
        batch.seq_id[i][0] = 0
    assert C.llama_decode(ctx, batch) == 0
    rows = np.array([np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                     for i in range(len(tokens))], dtype=np.float32)
    C.llama_batch_free(batch)
    C.llama_free(ctx)
    C.llama_model_free(model)
    return rows


def penalized_argmax(logits: np.ndarray, window: list[int], rp: float) -> int:
    """argmax after llama.cpp's repeat penalty over the distinct tokens of ``window``."""
    if rp == 1.0 or not window:
        return int(logits.argmax())
    lg = logits.copy()
    ids = np.unique(np.array(window))
    v = lg[ids]
    lg[ids] = np.where(v <= 0, v * rp, v / rp)
    return int(lg.argmax())


def main() -> int:
    import bench_spec_pair as q

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=q.TARGET)
    ap.add_argument("--draft", type=Path, default=q.DRAFT)
    ap.add_argument("--num-predict", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat-last-n", type=int, default=64, help="the target's repeat_last_n (ollapy's default)")
    args = ap.parse_args()
    penalties = [1.1, 1.0]
    got = generate(args.target, q.CODE_PROMPTS, penalties, args.num_predict, args.threads)
    print(f"target {args.target.name}, draft {args.draft.name}; default sampling, seed 1; "
          f"{args.num_predict} tokens per answer; repeat_last_n {args.repeat_last_n}")
    print(f"{'prompt':<8}{'repeat_penalty':>15}{'tokens':>8}{'raw draft':>11}{'penalized draft':>17}")
    totals = {rp: [0, 0, 0] for rp in penalties}
    for (i, rp), (prompt, answer) in got.items():
        seq = prompt + answer
        rows = draft_logits(args.draft, seq, args.threads)
        raw = pen = 0
        for j, tok in enumerate(answer):
            k = len(prompt) + j - 1  # the row whose logits predict answer[j]
            lg = rows[k]
            raw += int(lg.argmax()) == tok
            pen += penalized_argmax(lg, seq[max(0, k + 1 - args.repeat_last_n):k + 1], rp) == tok
        t = totals[rp]
        t[0], t[1], t[2] = t[0] + len(answer), t[1] + raw, t[2] + pen
        print(f"{i + 1:<8}{rp:>15}{len(answer):>8}{raw / max(1, len(answer)):>11.1%}{pen / max(1, len(answer)):>17.1%}")
    for rp, (n, raw, pen) in totals.items():
        print(f"{'all':<8}{rp:>15}{n:>8}{raw / max(1, n):>11.1%}{pen / max(1, n):>17.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
