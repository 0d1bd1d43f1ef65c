"""Draftless n-gram drafting ("prompt lookup"): guess the next tokens by copying from the slot's own history.

Algorithm. The history is the slot's prompt plus the tokens it has accepted so far. To draft, take the
longest suffix of the history of length ``n`` in ``[min_ngram, max_ngram]`` that also occurred earlier,
pick its MOST RECENT earlier occurrence, and propose the tokens that followed it, up to ``n_max`` of them.
When the continuation runs into the end of the history the copy goes on from its own output, as an LZ77
match with overlap does (source ``start + k`` beyond the history is the proposal's own token
``k - (len(history) - start)``), so a periodic history (a log whose lines share one template) drafts a full
``n_max`` tokens. A proposal shorter than ``n_min`` is dropped (``[]``): verifying one or two likely-wrong
tokens costs more than it gives.

Index. For every ``n`` one dict maps an n-gram (a tuple of token ids) to the position of the token that
followed its most recent occurrence. An n-gram enters the index only once its following token is known
(when that token is appended), so the history's current suffix, whose continuation is what we are
guessing, never matches itself. Appending a token costs ``max_ngram - min_ngram + 1`` dict reads and writes
(the n-gram's previous continuation is compared with the new one: :meth:`NgramDrafter.contexts` turns that
agreement into a per-token estimate for the draft policy); a proposal costs at most as many dict reads plus
``n_max`` list reads: O(1) per token, independent of the history's length. Memory: two dict entries per
distinct n-gram per ``n``.

Window. The history is the last :data:`NGRAM_WINDOW` tokens of the context, not all of it: a request's setup
(indexing its prompt, in Python, on the engine's loop thread, where it delays every slot's next step) and the
index's memory (about a kilobyte a token) stay bounded however long the prompt. While a request generates,
the history may grow to twice the window, then it is rebuilt from its last ``NGRAM_WINDOW`` tokens (amortised
O(1) a token). An earlier passage further back than the window is not found: llama.cpp's
``ngram-simple`` draft searches a bounded window too. The speculator empties the index when the request ends.

Sources (semantics read, no code copied):

- llama.cpp ``common/ngram-map.cpp``, ``common_ngram_simple_draft`` (llama-server ``--spec-type
  ngram-simple``): search the history backwards for the last ``size_n`` tokens, draft the ``size_m`` that
  followed the most recent match. Here: a hashed index instead of a backwards scan, and the longest of
  several n-gram sizes instead of one.
- llama.cpp ``common/ngram-cache.cpp`` and ``examples/lookup`` (``llama-lookup``): n-gram sizes 1..4 over
  the context, longest match preferred (there chosen by counts; here by recency).
- llama-cpp-python ``LlamaPromptLookupDecoding`` (after apoorvumang/prompt-lookup-decoding): try n-gram
  sizes from ``max_ngram_size`` down to 1 and copy ``num_pred_tokens`` after a match (there the first
  match in the text; here the most recent one, which follows the current topic of a long context).
- Ollama's option names: ``draft_num_predict`` is ``n_max``; ``draft_min`` is ``n_min``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

#: tokens of the context an n-gram drafter indexes (module docstring: Window)
NGRAM_WINDOW = 8192
#: kinds of context a proposed token follows (NgramDrafter.contexts)
NOVEL, ONCE, SEEN = 0, 1, 2
#: pseudo-counts with which a context's shorter suffix backs its estimate (NgramDrafter.contexts)
BACKING = 2.0


class Drafter(Protocol):
    """What the engine's step loop needs from a per-slot drafter (n-gram lookup or a draft model).

    The history a drafter sees is the slot's prompt plus its ACCEPTED tokens only: the loop calls
    :meth:`extend` with what verification kept, never with rejected draft tokens.
    """

    def reset(self, tokens: Sequence[int]) -> None:
        """Start over with ``tokens`` (a new request's prompt) as the whole history."""

    def extend(self, tokens: Iterable[int]) -> None:
        """Append accepted tokens to the history."""

    def propose(self, n_max: int, n_min: int = 1) -> list[int]:
        """Up to ``n_max`` guessed next tokens; ``[]`` when fewer than ``n_min`` can be guessed."""


class NgramDrafter:
    """Prompt-lookup drafter over one slot's history (see the module docstring for the algorithm).

    ``max_ngram`` >= ``min_ngram`` >= 1: the n-gram sizes tried, longest first. ``window``: the tokens of the
    context kept (the last ones; the history grows to twice that before it is cut back). Raises ValueError
    otherwise. Not thread-safe: one drafter per slot, used from the engine's loop thread.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, window: int = NGRAM_WINDOW) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if window < max_ngram + 1:
            raise ValueError(f"window must exceed max_ngram, got window={window}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window
        self._tokens: list[int] = []
        # _index[n - min_ngram]: n-gram -> position of the token that followed its most recent occurrence
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram - min_ngram + 1)]
        # _agree[n - min_ngram]: n-gram -> [continuations compared, equal to the previous one]: how
        # consistently it is followed by the same token (contexts())
        self._agree: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_ngram - min_ngram + 1)]

    @property
    def tokens(self) -> list[int]:
        """The history (a copy): prompt plus accepted tokens."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def reset(self, tokens: Sequence[int] = ()) -> None:
        """Forget everything (the memory is freed), then take the last :attr:`window` of ``tokens`` as the history.
        O(min(len(tokens), window))."""
        self._tokens = []
        self._index = [{} for _ in self._index]  # new dicts: clear() would keep a large table allocated
        self._agree = [{} for _ in self._agree]
        self.extend(tokens[-self.window:] if len(tokens) > self.window else tokens)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens of the history (a slot reusing a prefix for a new request).

        Rebuilds the index from the kept tokens: O(length). ValueError when ``length`` is negative.
        """
        if length < 0:
            raise ValueError(f"length must not be negative, got {length}")
        if length < len(self._tokens):
            self.reset(self._tokens[:length])

    def extend(self, tokens: Iterable[int]) -> None:
        """Append accepted tokens; each registers the n-grams that end just before it. O(max_ngram) each
        (amortised: past twice the window the history is rebuilt from its last :attr:`window` tokens)."""
        toks = self._tokens
        lo, hi = self.min_ngram, self.max_ngram
        index = self._index
        agree = self._agree
        for t in tokens:
            t = int(t)
            pos = len(toks)  # t's position: the n-grams ending at pos - 1 now have a known continuation
            for n in range(lo, min(hi, pos) + 1):
                g = tuple(toks[pos - n:pos])
                ix = index[n - lo]
                prev = ix.get(g)
                if prev is not None:
                    a = agree[n - lo].get(g)
                    if a is None:
                        a = agree[n - lo][g] = [0, 0]
                    a[0] += 1
                    a[1] += toks[prev] == t
                ix[g] = pos
            toks.append(t)
            if len(toks) >= 2 * self.window:
                self.reset(toks)  # keeps the last window (the loop's locals are rebound below)
                toks, index, agree = self._tokens, self._index, self._agree

    def contexts(self, proposal: Sequence[int]) -> list[tuple[int, float]]:
        """What the history says about each token of ``proposal`` (a :meth:`propose` result, in order), from its
        context: the tokens before it in the history followed by the proposal.

        Per token ``(kind, estimate)``. :data:`ONCE` when its ``max_ngram``-token context occurred exactly once
        before (a copy of an earlier passage; estimate 0: the caller's learned rate applies). Otherwise the
        longest context of ``max_ngram`` down to ``min_ngram`` tokens that recurred gives :data:`SEEN`, where
        ``compared`` counts the times a context recurred and ``agreed`` those when the same token followed as the
        time before: a context followed by a different token each time (the digits after "wind speed" in a log,
        or after a digit) gets a low estimate, one always followed alike a high one. The estimate is smoothed
        from the shortest context up: ``(agreed + 1) / (compared + 2)`` for ``min_ngram`` tokens, then for each
        longer one ``(agreed + BACKING * e) / (compared + BACKING)`` with ``e`` its suffix's estimate, so a
        context seen twice ("1 :" after "Line 1" and "Line 11") is judged mostly by its suffix (":" always
        followed by " the") rather than by 2 observations (hierarchical Dirichlet smoothing of n-gram models,
        MacKay and Peto 1995; PPM's escape to shorter contexts). :data:`NOVEL` (estimate 0) when no context
        recurred. The counting follows llama.cpp's ``common/ngram-cache.cpp`` (draft only continuations with
        enough support, backing off to shorter n-grams), here as agreement with the previous occurrence:
        O(max_ngram) per token.
        """
        hi, lo = self.max_ngram, self.min_ngram
        ctx = self._tokens[-hi:] + list(proposal)
        base = len(ctx) - len(proposal)
        out: list[tuple[int, float]] = []
        for j in range(len(proposal)):
            i = base + j
            est = -1.0  # the smoothed estimate of the longest recurring context so far (-1: none recurred)
            for n in range(lo, min(hi, i) + 1):  # a recurring n-gram's suffixes recurred too: shortest first
                a = self._agree[n - lo].get(tuple(ctx[i - n:i]))
                if a is None:
                    break
                est = (a[1] + 1.0) / (a[0] + 2.0) if est < 0 else (a[1] + BACKING * est) / (a[0] + BACKING)
            longest = tuple(ctx[i - hi:i]) if i >= hi else None
            if longest is not None and longest not in self._agree[hi - lo] and longest in self._index[hi - lo]:
                out.append((ONCE, 0.0))  # the whole context occurred once: a copy
            else:
                out.append((SEEN, est) if est >= 0 else (NOVEL, 0.0))
        return out

    def match(self) -> tuple[int, int] | None:
        """``(n, start)`` of the longest suffix n-gram with an earlier occurrence; ``start`` is the position of
        the token that followed that occurrence (the copy's source). None when no suffix recurs."""
        toks = self._tokens
        size = len(toks)
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            start = self._index[n - self.min_ngram].get(tuple(toks[size - n:]))
            if start is not None:
                return n, start
        return None

    def propose(self, n_max: int, n_min: int = 1) -> list[int]:
        """Up to ``n_max`` tokens copied from after the most recent earlier occurrence of the longest
        recurring suffix (overlapping copy past the end of the history, as in LZ77).

        Returns ``[]`` when ``n_max`` < 1, no suffix of ``min_ngram``..``max_ngram`` tokens recurs, or
        fewer than ``n_min`` tokens would be proposed.
        """
        if n_max < 1:
            return []
        found = self.match()
        if found is None:
            return []
        _, start = found
        toks = self._tokens
        avail = len(toks) - start  # >= 1: the index only holds occurrences with a known next token
        out = toks[start:start + min(avail, n_max)]
        while len(out) < n_max:  # the copy reaches its own output: repeat with period `avail`
            out.append(out[len(out) - avail])
        return out if len(out) >= n_min else []
