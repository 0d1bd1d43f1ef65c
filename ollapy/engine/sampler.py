"""Per-request token sampling: llama.cpp's sampler chain, with a greedy fast path.

The chain is llama.cpp's own ``llama_sampler_chain``, in the order of llama.cpp's
common sampler (``common/sampling.cpp``, ``common/common.h``): logit bias,
penalties, DRY, then top_n_sigma, top_k, typical, top_p, min_p, XTC,
temperature, dist; greedy at temperature 0 (logit bias, penalties and DRY
still apply; the truncating and random samplers, XTC included, only shape a
random draw); with ``mirostat`` 1/2: logit bias, penalties, DRY, temperature,
Mirostat v1/v2; an optional GBNF grammar apart (below). Each sampler is added
only when its option turns it on. DRY is p-e-w's "Don't Repeat Yourself"
(text-generation-webui PR 5677, as ported to llama.cpp); XTC is "Exclude Top
Choices" (the same author, text-generation-webui PR 6335); top-n-sigma is Tang
et al. 2024, "Top-nσ: Not All Logits Are You Need".
Greedy requests without a grammar skip building the full candidate array:
the argmax of the raw logits is the chain's answer
unless the repeat penalty touched it, and that case is reproduced exactly in
float32 (:meth:`Sampler._penalized_argmax`). Presence/frequency penalties
always go through the chain. llama.cpp itself is reached through
:mod:`ollapy.engine.backend.bindings` (the llama.cpp boundary).

Two rules follow llama.cpp's common sampler (``common/sampling.cpp``) and its
server, which Ollama's runner mirrors:

* The prompt's tokens enter the penalty and DRY windows before the first sample
  (``common_sampler_accept(..., accept_grammar=false)`` for every prompt
  token), so ``repeat_penalty`` and DRY also discourage repeating the prompt.
* A grammar is not part of the chain. The chain samples first; the token is
  checked against the grammar alone, and only when the grammar rejects it are
  the logits reset and sampled again with the grammar applied first. Same
  distribution, and the grammar's full-vocabulary pass runs only on rejection.

One rule is ollapy's own: under a grammar (``format``, a forced tool call),
JSON's structure tokens (:func:`structure_tokens`: pieces made only of
``{ } [ ] : , "`` and blanks) never enter the penalty window, so the repeat,
presence and frequency penalties never apply to them. Otherwise the quotes and
commas of the prompt and of the answer so far make closing a string
ever less likely, and a small model at ``repeat_penalty`` 1.1 writes on inside
a JSON string until ``num_predict`` runs out (tests/test_quickstart_answer.py; figures: docs/benchmarks.md).
"""
from __future__ import annotations

import collections
import ctypes
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ollapy.engine.backend import bindings as _bindings
from ollapy.engine.request import TokenLogprob

if TYPE_CHECKING:
    import numpy as np

    from ollapy.engine.backend.context import Backend

C = _bindings.C


STRUCTURE_CHARS = frozenset('{}[]:,"' + " \t\r\n")
"""Characters of JSON's structure (and its blanks): a token made only of them is exempt from penalties under
a grammar."""
_structure_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def structure_tokens(backend: "Backend") -> frozenset[int]:
    """The ids of the model's tokens whose text is non-empty and made only of :data:`STRUCTURE_CHARS`
    (``"``, ``",``, ``{"``, ``\n``, ...). One pass over the vocabulary (``n_vocab`` pieces), cached per
    loaded model."""
    cached = _structure_cache.get(backend)
    if cached is None:
        out = set()
        for t in range(backend.n_vocab):
            piece = backend.token_piece(t)
            if piece and all(chr(b) in STRUCTURE_CHARS for b in piece):
                out.add(t)
        cached = _structure_cache[backend] = frozenset(out)
    return cached


class Sampler:
    """One llama.cpp sampler chain (see the module docstring for its order; an optional GBNF grammar apart).
    ``o.logit_bias`` must hold token ids only (:func:`resolve_logit_bias`). Free with :meth:`close`."""

    def __init__(self, backend: "Backend", o, grammar: str | None = None, prompt: Sequence[int] = ()) -> None:
        """``o``: the request's Options; ``grammar``: GBNF text (ValueError when llama.cpp rejects it);
        ``prompt``: the prompt's token ids, fed to the penalty window (see the module docstring)."""
        self._grammar = None
        if grammar:
            self._grammar = C.llama_sampler_init_grammar(backend.vocab, grammar.encode(), b"root")
            if not self._grammar:
                raise ValueError("invalid grammar")
            n = backend.n_vocab
            self._cand = _bindings.np.zeros(n, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
            self._ids = _bindings.np.arange(n, dtype=_bindings.np.int32)
            self._cur = C.llama_token_data_array()
            self._one = (C.llama_token_data * 1)()
            self._one_arr = C.llama_token_data_array()
        self._ptr = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        add = lambda s: C.llama_sampler_chain_add(self._ptr, s)  # noqa: E731
        biased = bool(o.logit_bias)
        if biased:  # first, as llama.cpp's common sampler adds it: every later sampler sees the biased logits
            add(_logit_bias_sampler(backend.n_vocab, o.logit_bias))
        if o.repeat_penalty != 1.0 or o.presence_penalty or o.frequency_penalty:
            last_n = backend.num_ctx if o.repeat_last_n == -1 else o.repeat_last_n
            add(C.llama_sampler_init_penalties(backend.n_vocab, last_n, o.repeat_penalty, o.frequency_penalty,
                                               o.presence_penalty))
        dry_last_n = backend.num_ctx if o.dry_penalty_last_n == -1 else o.dry_penalty_last_n
        dry = o.dry_multiplier > 0 and dry_last_n > 0
        if dry:
            breakers = [b.encode() for b in o.dry_sequence_breakers if b]
            arr = (ctypes.c_char_p * len(breakers))(*breakers)
            add(C.llama_sampler_init_dry(backend.vocab, o.dry_multiplier, o.dry_base, o.dry_allowed_length,
                                         dry_last_n, arr, len(breakers)))
        # greedy fast path: the argmax of the raw logits is the chain's answer unless the penalties touched it
        # (llama.cpp's penalties only lower the logits of recently generated tokens when repeat_penalty >= 1
        # and presence/frequency penalties >= 0), so most steps skip building the full candidate array; a logit
        # bias or DRY (which may lower any token's logit) always goes through the chain
        self._fast = (o.temperature <= 0 and not grammar and o.repeat_penalty >= 1.0
                      and o.presence_penalty >= 0 and o.frequency_penalty >= 0 and not biased and not dry)
        self._n_vocab = backend.n_vocab
        self._last_n = backend.num_ctx if o.repeat_last_n == -1 else max(0, o.repeat_last_n)
        self._penalized = o.repeat_penalty != 1.0 or bool(o.presence_penalty) or bool(o.frequency_penalty)
        # the prompt tokens the chain's history samplers (penalties, DRY) may look back on
        self._history_n = max(self._last_n if self._penalized else 0, dry_last_n if dry else 0)
        # repeat penalty alone is reproduced exactly in float32 below (llama_sampler_penalties: logit <= 0 ?
        # logit * penalty : logit / penalty); presence/frequency penalties always go through the chain
        self._repeat_only = not o.presence_penalty and not o.frequency_penalty
        # the chain samples on the fast path only for presence/frequency penalties: only then must it see the history
        self._chain_history = self._penalized and not self._repeat_only
        self._rp = _bindings.np.float32(o.repeat_penalty)
        # under a grammar, JSON's structure tokens never enter the penalty window (see the module docstring)
        self._exempt = structure_tokens(backend) if grammar and (self._penalized or dry) else frozenset()
        self._recent: collections.deque[int] = collections.deque(maxlen=max(1, self._last_n))
        self._counts: collections.Counter[int] = collections.Counter()
        self._accept_prompt(prompt)
        if o.temperature <= 0:
            add(C.llama_sampler_init_greedy())
            return
        seed = (o.seed if o.seed >= 0 else C.LLAMA_DEFAULT_SEED) & 0xFFFFFFFF
        if o.mirostat in (1, 2):
            # llama.cpp's common sampler (and so Ollama's runner): Mirostat replaces top_k/typical/top_p/min_p and
            # dist; temperature scales the logits first; Mirostat picks the token itself
            add(C.llama_sampler_init_temp(o.temperature))
            if o.mirostat == 1:
                add(C.llama_sampler_init_mirostat(backend.n_vocab, seed, o.mirostat_tau, o.mirostat_eta, 100))
            else:
                add(C.llama_sampler_init_mirostat_v2(seed, o.mirostat_tau, o.mirostat_eta))
            return
        # llama.cpp's default order (common/common.h: penalties, DRY, top_n_sigma, top_k, typical_p, top_p, min_p,
        # XTC, temperature), each only when it is on
        if o.top_n_sigma > 0:
            add(C.llama_sampler_init_top_n_sigma(o.top_n_sigma))
        if o.top_k > 0:
            add(C.llama_sampler_init_top_k(o.top_k))
        if o.typical_p < 1.0:
            add(C.llama_sampler_init_typical(o.typical_p, 1))
        if o.top_p < 1.0:
            add(C.llama_sampler_init_top_p(o.top_p, 1))
        if o.min_p > 0.0:
            add(C.llama_sampler_init_min_p(o.min_p, 1))
        if o.xtc_probability > 0 and o.xtc_threshold <= 0.5:
            add(C.llama_sampler_init_xtc(o.xtc_probability, o.xtc_threshold, 1, seed))
        add(C.llama_sampler_init_temp(o.temperature))
        add(C.llama_sampler_init_dist(seed))

    def _accept_prompt(self, prompt: Sequence[int]) -> None:
        """Put the prompt's tokens in the penalty and DRY windows (only the last ``repeat_last_n`` or
        ``dry_penalty_last_n`` can matter), as llama.cpp's server accepts every prompt token.

        Called before any sampler that draws random numbers is in the chain: of the samplers added so far only
        the penalties and DRY keep state from ``accept``."""
        if not self._history_n or not prompt:
            return
        tail = list(prompt)[-self._history_n:]
        if self._fast and self._penalized:
            for t in tail[-self._last_n:]:
                self._remember(t)
        for t in tail:  # the chain too, even where the fast path keeps the history itself (it may fall back)
            if t not in self._exempt:
                C.llama_sampler_accept(self._ptr, t)

    def sample(self, backend: "Backend", row: int) -> int:
        """Sample (and accept) a token from logits row ``row`` of the last decode."""
        if self._grammar is not None:
            return self._sample_with_grammar(backend, row)
        if self._fast:
            logits = backend.logits_row(row)
            tok = int(logits.argmax())
            if self._penalized and self._last_n and tok in self._counts:
                if not self._repeat_only:
                    return self._sample_chain(backend, row)
                tok = self._penalized_argmax(logits, tok)
            if self._chain_history:
                C.llama_sampler_accept(self._ptr, tok)
            if self._penalized:
                self._remember(tok)
            return tok
        return self._sample_chain(backend, row)

    def _penalized_argmax(self, logits: np.ndarray, tok: int) -> int:
        """The argmax after llama.cpp's repeat penalty, given the raw argmax ``tok`` (a recent token).

        The penalty only lowers the logits of recent tokens, so rather than
        penalizing all of them, penalize the current winner in place while it is
        a recent token not yet penalized, and take the argmax again; restore the
        buffer after. Ends with the same token, ties included (the first index of
        the maximum), as penalizing every recent token before one argmax, usually
        after 1-2 extra argmax passes. Penalty as in ``llama_sampler_penalties``:
        ``logit <= 0 ? logit * penalty : logit / penalty`` in float32.
        """
        rp = self._rp
        changed: list[tuple[int, np.float32]] = []
        try:
            while tok in self._counts and all(tok != t for t, _ in changed):
                raw = logits[tok]
                changed.append((tok, raw))
                logits[tok] = raw * rp if raw <= 0 else raw / rp
                tok = int(logits.argmax())
        finally:
            for t, raw in changed:
                logits[t] = raw
        return tok

    def _candidates(self, logits) -> ctypes.Structure:
        """A fresh ``llama_token_data_array`` over ``logits`` (samplers may sort or move its data)."""
        cand = self._cand
        cand["id"] = self._ids
        cand["logit"] = logits
        cand["p"] = 0.0
        cur = self._cur
        cur.data = ctypes.cast(cand.ctypes.data, C.llama_token_data_p)
        cur.size = len(cand)
        cur.selected = -1
        cur.sorted = False
        return cur

    def _sample_with_grammar(self, backend: "Backend", row: int) -> int:
        """llama.cpp's ``common_sampler_sample``: chain first, grammar check, resample only on rejection."""
        logits = backend.logits_row(row)
        cur = self._candidates(logits)
        C.llama_sampler_apply(self._ptr, ctypes.byref(cur))
        tok = int(cur.data[cur.selected].id)
        one = self._one
        one[0].id, one[0].logit, one[0].p = tok, 1.0, 0.0
        arr = self._one_arr
        arr.data = ctypes.cast(one, C.llama_token_data_p)
        arr.size, arr.selected, arr.sorted = 1, -1, False
        C.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        if one[0].logit == float("-inf"):  # rejected: the grammar first over every token, then the chain
            cur = self._candidates(logits)
            C.llama_sampler_apply(self._grammar, ctypes.byref(cur))
            C.llama_sampler_apply(self._ptr, ctypes.byref(cur))
            tok = int(cur.data[cur.selected].id)
        C.llama_sampler_accept(self._grammar, tok)
        if tok not in self._exempt:
            C.llama_sampler_accept(self._ptr, tok)
        return tok

    def _sample_chain(self, backend: "Backend", row: int) -> int:
        tok = C.llama_sampler_sample(self._ptr, backend.ctx, row)
        if self._fast:
            self._remember(tok)
        return tok

    def _remember(self, tok: int) -> None:
        if not self._last_n:
            return
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._recent.append(tok)
        self._counts[tok] += 1

    def close(self) -> None:
        """Free the chain (idempotent)."""
        if self._ptr:
            C.llama_sampler_free(self._ptr)
            self._ptr = None
        if self._grammar:
            C.llama_sampler_free(self._grammar)
            self._grammar = None


def _logit_bias_sampler(n_vocab: int, pairs: Sequence[tuple[int, float]]):
    """llama.cpp's ``llama_sampler_init_logit_bias`` over resolved ``(token id, bias)`` pairs (-inf bans)."""
    arr = (C.llama_logit_bias * len(pairs))()
    for i, (tok, bias) in enumerate(pairs):
        assert isinstance(tok, int) and 0 <= tok < n_vocab, (tok, n_vocab)  # resolve_logit_bias checked them
        arr[i].token, arr[i].bias = tok, bias
    return C.llama_sampler_init_logit_bias(n_vocab, len(pairs), arr)


def resolve_logit_bias(backend: "Backend", pairs: Sequence[tuple[int | str, float]]) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` pairs (:func:`ollapy.options.read_logit_bias`) as token ids: a text key gives every token
    of its tokenization (no BOS, special tokens not parsed), as llama.cpp's server reads one. Raises OptionError
    for a token id outside the model's vocabulary (``0 .. n_vocab - 1``)."""
    from ollapy.errors import OptionError

    out: list[tuple[int, float]] = []
    for key, bias in pairs:
        if isinstance(key, str):
            out.extend((t, bias) for t in backend.tokenize(key, add_special=False, parse_special=False))
        elif 0 <= key < backend.n_vocab:
            out.append((key, bias))
        else:
            raise OptionError(f"logit_bias token {key} is outside the vocabulary of this model "
                              f"(0 to {backend.n_vocab - 1})", hint="use token ids from /tokenize as keys")
    return tuple(out)


def token_logprob(backend: "Backend", row: int, tok: int, top: int) -> TokenLogprob:
    """``tok``'s log-probability in logits row ``row`` (log-softmax of the raw logits, float64 sums), with
    the ``top`` most likely tokens (most likely first). Costs one pass over the ``n_vocab`` logits."""
    np_ = _bindings.np
    logits = backend.logits_row(row)
    peak = float(logits.max())
    lse = peak + float(np_.log(np_.exp((logits - peak).astype(np_.float64)).sum()))

    def entry(t: int) -> tuple[str, float, list[int]]:
        raw = backend.token_piece(t)
        return raw.decode("utf-8", "replace"), float(logits[t]) - lse, list(raw)

    best: list[tuple[str, float, list[int]]] = []
    if top > 0:
        k = min(top, len(logits))
        idx = np_.argpartition(-logits, k - 1)[:k]
        best = [entry(int(t)) for t in idx[np_.argsort(-logits[idx], kind="stable")]]
    text, lp, raw = entry(tok)
    return TokenLogprob(text, lp, raw, best)
