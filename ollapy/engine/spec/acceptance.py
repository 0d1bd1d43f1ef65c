"""Verifying drafted tokens: the speculative-sampling acceptance rule, so that drafting never changes what a
request's sampler would have produced.

The rule (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 and Appendix A.1; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling", Algorithm 2). One ``llama_decode`` evaluates the slot's last token followed by ``k``
drafted tokens ``x_1..x_k``, which gives ``k + 1`` target distributions ``p_0..p_k`` (row ``i`` predicts
the token after ``x_i``; ``x_0`` is the last accepted token). For ``i = 1..k``: accept ``x_i`` with
probability ``min(1, p_{i-1}(x_i) / q_{i-1}(x_i))``, where ``q`` is the distribution the drafter sampled
``x_i`` from. On the first rejection emit one token drawn from the residual ``norm(max(0, p_{i-1} -
q_{i-1}))`` and stop. When all ``k`` are accepted emit a bonus token drawn from ``p_k``. Every emitted token
is then distributed exactly as plain sampling from the target would give it.

Special cases:

- **Point-mass draft** (n-gram lookup, or a greedy draft model): ``q(x) = 1`` for the proposed token, so
  ``x`` is accepted with probability ``p(x)`` and the residual is ``p`` with ``x`` removed, renormalised.
  That is the same as drawing ``y ~ p`` and accepting when ``y == x`` (else emitting ``y``): with
  ``x`` fixed, ``P(emit y) = p(y)`` both ways. So for point-mass drafts the engine verifies with the slot's
  own llama.cpp sampler chain, row after row, keeping penalties and grammar state exact
  (:func:`verify_by_sampling`): no probabilities need leave llama.cpp. The argument holds for any draft
  chosen independently of the target's random draws, so a sampling draft model may also be verified this
  way; the ``q``-aware rule accepts more of its tokens (its acceptance is ``min(1, p/q)``, not ``p``).
- **Temperature 0**: the target is a point mass on its argmax, so acceptance is "argmax == proposed"
  (:func:`verify_greedy`), and the output is token-identical to plain greedy decoding as long as a verified
  row's logits equal a single-token step's (the engine's exact-evaluation invariant).

All functions are pure apart from the random generator they are given.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one slot's draft.

    ``tokens``: the tokens to append to the slot, in order: the ``n_accepted`` accepted draft tokens, then one
    token from the target (the correction at the first rejection, or the bonus after a fully accepted
    draft), so ``len(tokens) == n_accepted + 1``. KV cells of rejected draft positions (from
    ``n_past + n_accepted + 1`` on, where row 0 is at ``n_past``) must be removed with ``seq_rm``.
    """

    tokens: list[int]
    n_accepted: int


def verify_greedy(target_argmax: Sequence[int], draft: Sequence[int]) -> Verdict:
    """Temperature-0 verification: accept draft tokens while they equal the target's argmax.

    ``target_argmax``: the target's choice for each of the ``len(draft) + 1`` rows (row ``i`` follows draft
    token ``i - 1``; row 0 follows the last accepted token). Raises ValueError on a length mismatch.
    """
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} target rows for {len(draft)} drafted tokens, got {len(target_argmax)}")
    n = 0
    while n < len(draft) and target_argmax[n] == draft[n]:
        n += 1
    return Verdict([int(t) for t in target_argmax[:n + 1]], n)


def verify_by_sampling(sample_row: Callable[[int], int], draft: Sequence[int]) -> Verdict:
    """Point-mass verification with the slot's own sampler: sample row ``i``; go on while it equals
    ``draft[i]``.

    ``sample_row(i)`` samples (and accepts into the sampler's state: penalties, grammar) one token from row
    ``i`` of the verification batch; it is called for rows 0, 1, ... in order and never past the first
    mismatch, so the sampler state sees exactly the tokens a plain decode would have fed it. Equivalent in
    distribution to :func:`speculative_accept` with ``q=None`` (see the module docstring); at temperature 0
    it is :func:`verify_greedy`.
    """
    out: list[int] = []
    for i in range(len(draft) + 1):
        tok = int(sample_row(i))
        out.append(tok)
        if i == len(draft) or tok != draft[i]:
            break
    return Verdict(out, len(out) - 1)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn from ``probs`` (non-negative, any positive sum) by inverse CDF."""
    cdf = np.cumsum(probs, dtype=np.float64)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


def speculative_accept(p: np.ndarray, draft: Sequence[int], q: np.ndarray | None,
                       rng: np.random.Generator) -> Verdict:
    """The speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

    ``p``: target probabilities, shape ``(len(draft) + 1, n_vocab)``, each row summing to 1 (after the
    request's temperature/top-k/top-p transforms). ``q``: the drafter's probabilities for the drafted rows,
    shape ``(len(draft), n_vocab)``, or None for a point-mass draft (``q(draft[i]) = 1``). ``rng``: the
    request's seeded generator. Returns a :class:`Verdict`. Raises ValueError on mismatched shapes or a
    drafted token the drafter gave probability 0.
    """
    k = len(draft)
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != k + 1:
        raise ValueError(f"p must have shape ({k + 1}, n_vocab), got {p.shape}")
    if q is not None:
        q = np.asarray(q, dtype=np.float64)
        if q.shape != (k, p.shape[1]):
            raise ValueError(f"q must have shape ({k}, {p.shape[1]}), got {q.shape}")
    out: list[int] = []
    for i, x in enumerate(draft):
        px = p[i, x]
        qx = 1.0 if q is None else q[i, x]
        if qx <= 0:
            raise ValueError(f"drafted token {x} at row {i} has draft probability 0")
        if rng.random() < min(1.0, px / qx):
            out.append(int(x))
            continue
        if q is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0:  # only when p == q (or p is a point mass on x): rejection had probability 0
            residual = p[i]
        out.append(_draw(residual, rng))
        return Verdict(out, i)
    out.append(_draw(p[k], rng))
    return Verdict(out, k)
