"""Draftless n-gram drafting (ollapy.engine.spec.ngram): exact proposals, and properties against a brute-force
reference over random histories (hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollapy.engine.spec.ngram import Drafter, NgramDrafter


def reference_propose(history: list[int], max_ngram: int, min_ngram: int, n_max: int, n_min: int) -> list[int]:
    """The algorithm of the module docstring, by brute force: scan backwards for the longest recurring suffix."""
    size = len(history)
    if n_max < 1:
        return []
    for n in range(min(max_ngram, size), min_ngram - 1, -1):
        suffix = history[size - n:]
        for end in range(size - 1, n - 1, -1):  # an occurrence ending at end-1 with a next token at `end`
            if history[end - n:end] == suffix:
                ext = list(history)
                for k in range(n_max):
                    ext.append(ext[end + k])
                out = ext[size:]
                return out if len(out) >= n_min else []
    return []


def test_copies_what_followed_the_most_recent_match():
    d = NgramDrafter(max_ngram=3, min_ngram=1)
    # "1 2 3 9 | 1 2 3 7 8 | 5 1 2 3": suffix (1, 2, 3) last followed by 7 8 5 1
    d.extend([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3])
    assert d.match() == (3, 7)
    assert d.propose(4) == [7, 8, 5, 1]
    assert d.propose(2) == [7, 8]


def test_prefers_the_longest_ngram_over_a_more_recent_shorter_one():
    d = NgramDrafter(max_ngram=2, min_ngram=1)
    d.extend([4, 5, 6, 7, 5, 8, 4, 5])  # (4, 5) followed by 6 at position 2; 5 alone most recently by 8
    assert d.propose(2) == [6, 7]
    one = NgramDrafter(max_ngram=1, min_ngram=1)
    one.extend([4, 5, 6, 7, 5, 8, 4, 5])
    assert one.propose(2) == [8, 4]


def test_a_periodic_history_drafts_past_its_end():
    d = NgramDrafter(max_ngram=3)
    d.extend([10, 11, 12, 10, 11])  # (10, 11) was followed by 12 10 11, then the copy repeats its own output
    assert d.propose(7) == [12, 10, 11, 12, 10, 11, 12]
    run = NgramDrafter(max_ngram=2)
    run.extend([3, 3])
    assert run.propose(4) == [3, 3, 3, 3]


def test_no_match_or_too_short_proposes_nothing():
    d = NgramDrafter(max_ngram=3, min_ngram=2)
    d.extend([1, 2, 3, 4, 5, 3])  # only the 1-gram (3) recurs, below min_ngram
    assert d.match() is None and d.propose(4) == []
    d.extend([4])  # (3, 4) recurs
    assert d.propose(4) == [5, 3, 4, 5]
    assert d.propose(1, n_min=2) == [] and d.propose(0) == []
    assert NgramDrafter().propose(4) == []


def test_reset_and_truncate_forget_what_is_gone():
    d = NgramDrafter(max_ngram=2)
    d.extend([1, 2, 3, 1, 2])
    assert d.propose(1) == [3]
    d.truncate(3)
    assert d.tokens == [1, 2, 3] and d.propose(2) == []
    d.extend([1, 2])
    assert d.propose(1) == [3]
    d.reset([7, 8, 7])
    assert len(d) == 3 and d.propose(3) == [8, 7, 8]
    with pytest.raises(ValueError):
        d.truncate(-1)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=1, min_ngram=2)


def test_is_a_drafter():
    d: Drafter = NgramDrafter()
    d.reset([1, 2, 1])
    assert d.propose(1) == [2]


histories = st.lists(st.integers(0, 4), max_size=60)  # a tiny alphabet: many repeats, many overlaps


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 4), st.integers(0, 3), st.integers(0, 8), st.integers(1, 4))
def test_matches_the_brute_force_reference(history, max_ngram, extra, n_max, n_min):
    min_ngram = max(1, max_ngram - extra)
    d = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    d.extend(history)
    assert d.propose(n_max, n_min) == reference_propose(history, max_ngram, min_ngram, n_max, n_min)


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 8))
def test_a_proposal_continues_an_earlier_occurrence_of_the_suffix(history, n_max):
    d = NgramDrafter(max_ngram=3)
    d.extend(history)
    out = d.propose(n_max)
    if not out:
        return
    assert len(out) == n_max
    n, start = d.match()
    ext = history + out
    # the n tokens before `start` are the history's suffix, and the proposal copies on from `start`
    assert history[start - n:start] == history[len(history) - n:] and start < len(history)
    assert all(ext[start + k] == out[k] for k in range(n_max))
    # its first token followed the same n-gram somewhere in the history
    assert out[0] == history[start]


@settings(max_examples=200, deadline=None)
@given(histories, st.lists(st.integers(0, 4), max_size=20))
def test_extending_in_pieces_equals_extending_at_once(a, b):
    whole, pieces = NgramDrafter(), NgramDrafter()
    whole.extend(a + b)
    pieces.extend(a)
    pieces.propose(4)
    for t in b:
        pieces.extend([t])
    assert pieces.tokens == whole.tokens
    assert pieces.propose(5) == whole.propose(5)
    pieces.truncate(len(a))
    fresh = NgramDrafter()
    fresh.extend(a)
    assert pieces.propose(5) == fresh.propose(5)


def test_contexts_back_a_template_and_doubt_what_follows_a_number():
    """A log whose lines share a template with one varying number: the template's tokens are followed alike
    each time (SEEN, high), the token after the number varies (SEEN, low), a copied passage is ONCE."""
    from ollapy.engine.spec.ngram import NOVEL, ONCE, SEEN
    line = lambda n: [1, 2, 3, 100 + n, 4, 5, 6, 9]  # "Line: wind speed N knots and wave\n" (N varies)
    history = [t for n in (7, 3, 9, 1, 8, 2) for t in line(n)]
    d = NgramDrafter(max_ngram=4)
    d.reset(history + [1, 2])
    ctx = d.contexts([3, 100 + 5, 4, 5])  # template, the number (unpredictable), template again
    assert [k for k, _ in ctx] == [SEEN, SEEN, NOVEL, SEEN]
    template, number = ctx[0][1], ctx[1][1]
    assert template > 0.8 and number < 0.2  # "speed" was always followed by a number, never the same one
    assert ctx[3][1] > 0.8  # after "N knots" (N new): backs off to "knots" -> "and", always alike
    d.reset([50, 51, 52, 53, 54, 55, 56, 57, 58, 59] + [50, 51, 52, 53])
    assert [k for k, _ in d.contexts([54, 55, 56])] == [ONCE, ONCE, ONCE]  # a copy of an earlier passage
    assert d.contexts([]) == []


def test_a_context_seen_rarely_is_backed_by_its_shorter_suffix():
    """After "Line 11:" the 2-gram "1 :" recurred once, the 1-gram ":" at every line, always followed by " the": the
    estimate of the rare context is pulled toward its suffix's (BACKING pseudo-counts), not left at Laplace's 2/3;
    where the suffix varies, the rare context stays doubtful."""
    from ollapy.engine.spec.ngram import BACKING, SEEN
    colon, the, sp = 1, 2, 3
    history = []
    for n in range(1, 21):  # "Line N: the ..." with digits as tokens 100+d
        history += [90, sp, *[100 + int(c) for c in str(n)], colon, the, 91, 92, 9]
    d = NgramDrafter(max_ngram=4)
    d.reset(history + [90, sp, 102, 101])  # "Line 21" (new number)
    kind, est = d.contexts([colon, the])[1]  # " the" after "2 1 :" -> backs off to "1 :" (seen after 1 and 11)
    one_gram = (19 + 1) / (19 + 2)  # ":" recurred 19 times, always followed by " the"
    two_gram = (1 + BACKING * one_gram) / (1 + BACKING)  # "1 :": compared once (line 11 after line 1), agreed
    assert kind == SEEN and est == pytest.approx(two_gram) and est > 0.95 > 2 / 3
    kind, est = d.contexts([colon, the, 91, 92, 9, 90, sp, 101, 105])[-1]  # the digit after "Line 1": varies
    assert kind == SEEN and est < 0.2
