"""The speculative-sampling acceptance rule (ollapy.engine.spec.acceptance): exact cases, and the statistical test
that drafting leaves the output distribution unchanged (chi-square on an 8-token vocabulary)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ollapy.engine.spec.acceptance import Verdict, speculative_accept, verify_by_sampling, verify_greedy

V = 8          # vocabulary slice
LENGTH = 3     # tokens generated per sample
N = 20000      # samples per configuration
K = 3          # drafted tokens per verification
START = 0      # the prompt's last token


def _chain(seed: int, alpha: float) -> np.ndarray:
    """A V x V Markov transition matrix: row t is the next-token distribution after token t."""
    return np.random.default_rng(seed).dirichlet([alpha] * V, size=V)


# half of each row's mass on one token, as a language model's next-token distribution often is
TARGET = 0.5 * np.eye(V)[np.random.default_rng(3).integers(0, V, size=V)] + 0.5 * _chain(1, 2.0)
DRAFT = 0.6 * TARGET + 0.4 * _chain(2, 2.0)  # a smaller model's guess: close to the target, not equal


def _exact_sequence_probs() -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(LENGTH):
        out = {seq + (t,): pr * TARGET[seq[-1] if seq else START, t] for seq, pr in out.items() for t in range(V)}
    return out


def _plain(rng: np.random.Generator) -> tuple[int, ...]:
    seq, prev = [], START
    for _ in range(LENGTH):
        prev = int(rng.choice(V, p=TARGET[prev]))
        seq.append(prev)
    return tuple(seq)


def _drafted(rng: np.random.Generator, mode: str) -> tuple[tuple[int, ...], list[int]]:
    """One sample generated with drafting, and the accepted count of each verification. ``mode``: "point" (a
    deterministic guess: the draft chain's argmax, as an n-gram lookup proposes), "dist" (drafts sampled
    from the draft chain, verified with its q), "dist-as-point" (drafts sampled from the draft chain,
    verified as point masses: also exact, see spec_sampling), or "wrong-q" (drafts sampled from the draft
    chain but verified with the TARGET's rows as q, so every draft is accepted: WRONG, the control)."""
    seq, accepted = [], []
    while len(seq) < LENGTH:
        prev = seq[-1] if seq else START
        draft, q = [], []
        for _ in range(K):
            row = DRAFT[draft[-1] if draft else prev]
            draft.append(int(np.argmax(row)) if mode == "point" else int(rng.choice(V, p=row)))
            q.append(row)
        p = np.stack([TARGET[t] for t in [prev, *draft]])  # row i follows draft[i - 1]
        q_rows = {"dist": np.stack(q), "wrong-q": p[:K]}.get(mode)
        verdict = speculative_accept(p, draft, q_rows, rng)
        seq.extend(verdict.tokens)
        accepted.append(verdict.n_accepted)
    return tuple(seq[:LENGTH]), accepted


def _counts(samples: list[tuple[int, ...]], cells: list[tuple[int, ...]], pos: slice) -> np.ndarray:
    index = {c: i for i, c in enumerate(cells)}
    out = np.zeros(len(cells))
    for s in samples:
        out[index[s[pos]]] += 1
    return out


def _fit_pvalues(samples: list[tuple[int, ...]]) -> dict[str, float]:
    """Chi-square goodness of fit against the exact target distribution: the joint of the first two tokens
    (64 cells) and the marginal of the third (8 cells)."""
    exact = _exact_sequence_probs()
    pairs = [(a, b) for a in range(V) for b in range(V)]
    pair_p = np.array([sum(pr for s, pr in exact.items() if s[:2] == c) for c in pairs])
    third_p = np.array([sum(pr for s, pr in exact.items() if s[2] == t) for t in range(V)])
    n = len(samples)
    return {"pair": _chisquare(_counts(samples, pairs, slice(0, 2)), pair_p * n),
            "third": _chisquare(_counts(samples, [(t,) for t in range(V)], slice(2, 3)), third_p * n)}


def _chisquare(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of the chi-square test, cells expected below 5 pooled into one (the test's usual validity rule)."""
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return stats.chisquare(observed, expected).pvalue


@pytest.fixture(scope="module")
def plain_samples() -> list[tuple[int, ...]]:
    rng = np.random.default_rng(100)
    return [_plain(rng) for _ in range(N)]


def test_the_plain_sampler_fits_the_exact_distribution(plain_samples):
    assert min(_fit_pvalues(plain_samples).values()) > 1e-3


@pytest.mark.parametrize("mode", ["point", "dist", "dist-as-point"])
def test_drafting_leaves_the_distribution_unchanged(mode, plain_samples):
    rng = np.random.default_rng(200)
    runs = [_drafted(rng, mode) for _ in range(N)]
    samples = [s for s, _ in runs]
    verdicts = [n for _, ns in runs for n in ns]
    # every outcome occurs often: rejection at each row (residual draws) and full acceptance (bonus draws)
    assert all(verdicts.count(n) > 300 for n in range(K + 1))
    assert min(_fit_pvalues(samples).values()) > 1e-3
    # with and without drafting: a two-sample chi-square on the joint of the first two tokens
    pairs = [(a, b) for a in range(V) for b in range(V)]
    table = np.stack([_counts(plain_samples, pairs, slice(0, 2)), _counts(samples, pairs, slice(0, 2))])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-3


def test_the_chi_square_test_catches_a_wrong_rule():
    """Control: drafts verified against the wrong q (so all accepted: the output follows the draft chain) are
    rejected by the same test. Without this, a passing statistical test could be one that cannot fail."""
    rng = np.random.default_rng(300)
    samples = [_drafted(rng, "wrong-q")[0] for _ in range(N)]
    assert min(_fit_pvalues(samples).values()) < 1e-6


def test_point_mass_acceptance_is_p_and_the_residual_excludes_the_draft():
    p = np.array([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    rng = np.random.default_rng(7)
    runs = [speculative_accept(p, [1], None, rng) for _ in range(20000)]
    rate = sum(v.n_accepted for v in runs) / len(runs)
    assert abs(rate - 0.3) < 0.015
    rejected = [v.tokens[0] for v in runs if v.n_accepted == 0]
    assert set(rejected) == {0, 2}  # never the rejected token, never a zero-probability one
    assert abs(rejected.count(0) / len(rejected) - 0.5 / 0.7) < 0.02
    assert all(len(v.tokens) == v.n_accepted + 1 for v in runs)


def test_a_certain_draft_is_always_accepted_and_a_bonus_token_follows():
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert speculative_accept(p, [1, 2], None, np.random.default_rng(0)) == Verdict([1, 2, 0], 2)
    q = np.array([[0.0, 1.0, 0.0], [0.0, 0.5, 0.5]])
    assert speculative_accept(p, [1, 2], q, np.random.default_rng(0)) == Verdict([1, 2, 0], 2)


def test_shapes_and_impossible_drafts_are_refused():
    p = np.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="p must have shape"):
        speculative_accept(p, [1, 2], None, np.random.default_rng(0))
    with pytest.raises(ValueError, match="q must have shape"):
        speculative_accept(p, [1], np.full((2, 4), 0.25), np.random.default_rng(0))
    with pytest.raises(ValueError, match="draft probability 0"):
        speculative_accept(p, [1], np.array([[1.0, 0.0, 0.0, 0.0]]), np.random.default_rng(0))


def test_greedy_accepts_while_the_argmax_agrees():
    assert verify_greedy([5, 6, 9, 4], [5, 6, 7]) == Verdict([5, 6, 9], 2)
    assert verify_greedy([5, 6, 7, 4], [5, 6, 7]) == Verdict([5, 6, 7, 4], 3)
    assert verify_greedy([1], []) == Verdict([1], 0)
    assert verify_greedy([2, 3], [1]) == Verdict([2], 0)
    with pytest.raises(ValueError, match="target rows"):
        verify_greedy([1, 2], [1, 2])


def test_verify_by_sampling_stops_at_the_first_mismatch_and_never_samples_past_it():
    picks = {0: 5, 1: 6, 2: 8, 3: 1}
    asked: list[int] = []

    def sample_row(i: int) -> int:
        asked.append(i)
        return picks[i]

    assert verify_by_sampling(sample_row, [5, 6, 7]) == Verdict([5, 6, 8], 2)
    assert asked == [0, 1, 2]
    asked.clear()
    assert verify_by_sampling(sample_row, [5, 6, 8]) == Verdict([5, 6, 8, 1], 3)
    assert asked == [0, 1, 2, 3]


def test_verify_by_sampling_keeps_the_target_distribution():
    """Sample-and-compare against a point-mass draft gives each sequence the target's probability."""
    rng = np.random.default_rng(400)
    samples = []
    for _ in range(N):
        seq: list[int] = []
        while len(seq) < LENGTH:
            prev = seq[-1] if seq else START
            draft = [int(np.argmax(DRAFT[prev]))]
            for _ in range(K - 1):
                draft.append(int(np.argmax(DRAFT[draft[-1]])))
            rows = [prev, *draft]
            seq.extend(verify_by_sampling(lambda i, rows=rows: int(rng.choice(V, p=TARGET[rows[i]])), draft).tokens)
        samples.append(tuple(seq[:LENGTH]))
    assert min(_fit_pvalues(samples).values()) > 1e-3
