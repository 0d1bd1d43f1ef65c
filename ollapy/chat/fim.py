"""Fill-in-the-middle (FIM) prompts: the token layout of a code-completion request, from the model's own tokens.

The layout is llama-server's ``format_prompt_infill`` (llama.cpp ``tools/server/server-common.cpp``), the
repository-level pattern of Qwen2.5-Coder (Hui et al., "Qwen2.5-Coder Technical Report", arXiv:2409.12186)::

    [FIM_REP]myproject\\n                      repository context (``/infill``'s input_extra), when the
    [FIM_SEP]filename0\\n extra chunk 0          vocabulary has the tokens; otherwise each chunk follows
    ...                                         a plain-text "--- snippet ---" separator
    [FIM_SEP]filename\\n
    [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]     the file around the cursor

Where the text typed on the current line goes is the layout (:data:`LAYOUTS`, the ``fim_layout`` option):

* ``plain``: where it stands in the file, at the end of the prefix (llama-server puts ``/infill``'s ``prompt``
  there; Continue's ``/api/generate`` sends it as the end of ``prompt``). Every keystroke changes the prompt
  before the suffix, so the suffix is prefilled again each time.
* ``moved-line``: after ``FIM_MID`` (llama.vscode's idea of a cheap keystroke): everything before it is the same
  from one keystroke to the next, a cached prefix; only the typed text is prefilled. For a request that sends
  the whole prefix (Continue's shape), the prefix's unfinished last line is moved there. It changes completions
  (the typed text tokenizes on its own), so it is measured, not assumed (``scripts/bench_fim.py``).
* ``auto`` (the default): ``plain`` for every route. Chosen by the data: on the 40 cases of
  ``scripts/fim_cases.py`` (``scripts/compare_fim_layouts.py``, greedy) ``plain`` gave the right first line 26/40
  (Qwen2.5-Coder-0.5B) and 37/40 (1.5B), ``moved-line`` 7/40 and 8/40, never better: the typed text tokenized on
  its own after ``FIM_MID`` ends where the model rarely saw a middle go on. ``moved-line`` stays an option for
  a client that trades answers for a one-token keystroke.

Cuts follow llama-server with a fixed window ``W`` instead of ``n_batch`` (ollapy prefills in chunks, so a
prompt need not fit one batch): at most ``3W/4`` prefix tokens (the last ones) and ``W/4 - 2`` suffix tokens
(the first ones; less the typed text where it stays in the prefix), and the repository context takes what is
left of the context after ``W`` and twice the answer's room (its last tokens). The prefix's cut moves in steps of
a quarter of its share (so it keeps between ``3W/16`` fewer and ``3W/4`` tokens), so that a prefix that grows by
a keystroke keeps the same first token: a cached prefix, where a cut that followed every token would shift the
whole prompt.

Everything here is pure: text and a tokenizer in, token ids out (:func:`fim_tokens`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

LAYOUTS = ("auto", "plain", "moved-line")
"""The ``fim_layout`` option's values (see the module docstring)."""
FIM_WINDOW = 2048
"""Tokens of prefix and suffix together at most (llama-server cuts to its ``n_batch``, 2048 by default); a
model's window is also at most half its context (:func:`window_for`)."""
REPO_NAME = "myproject\n"  # llama-server's fixed repository name and current file name (its TODOs)
FILE_NAME = "filename\n"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # llama-server's separator of chunks for a vocabulary without FIM_SEP


class FimError(ValueError):
    """A FIM request this model or layout cannot lay out (no FIM tokens, an unknown ``fim_layout``): the caller's
    mistake, unlike any other ValueError raised while laying one out."""


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids, as llama.cpp's ``llama_vocab_fim_pre/suf/mid/pad/rep/sep`` give them
    (-1: the vocabulary has none)."""

    pre: int = -1
    suf: int = -1
    mid: int = -1
    pad: int = -1
    rep: int = -1
    sep: int = -1

    @property
    def usable(self) -> bool:
        """Whether FIM prompts can be built: prefix, suffix and middle tokens all exist (llama-server's check)."""
        return min(self.pre, self.suf, self.mid) >= 0

    def missing(self) -> str:
        """llama-server's words for the missing tokens ("prefix token is missing. ..."), empty when usable."""
        names = (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
        return " ".join(f"{n} token is missing." for n, t in names if t < 0)


@dataclass(frozen=True)
class FimRequest:
    """The text of one completion request.

    ``prefix`` and ``suffix``: the file before and after the cursor. ``typed``: the text typed so far on the
    current line when the client sends it apart (``/infill``'s ``prompt``), None when it is the end of
    ``prefix`` (Continue's shape). ``extra``: repository context chunks as ``(filename, text)``. ``repo``: put the
    repository header (``FIM_REP`` ... ``FIM_SEP filename``) in front even without chunks, as ``/infill`` does;
    the Ollama and OpenAI routes send none, as Ollama's templates do. ``layout``: one of :data:`LAYOUTS`.
    """

    prefix: str
    suffix: str
    typed: str | None = None
    extra: tuple[tuple[str, str], ...] = ()
    repo: bool = False
    layout: str = "auto"


@dataclass(frozen=True)
class FimLayout:
    """A FIM prompt: ``tokens``; ``stable`` the length of its part that the next keystroke keeps (the prompt
    cache's save point: through ``FIM_MID`` when the typed text follows it, else the prefix up to the current
    line); ``truncated`` when prefix, suffix or repository context was cut."""

    tokens: list[int]
    stable: int
    truncated: bool


def window_for(num_ctx: int) -> int:
    """The prefix-and-suffix window of a context of ``num_ctx`` tokens: :data:`FIM_WINDOW`, at most half of it."""
    return max(8, min(FIM_WINDOW, num_ctx // 2))


def types_after_middle(req: FimRequest) -> bool:
    """Whether the typed text goes after ``FIM_MID`` for this request (see :data:`LAYOUTS`)."""
    if req.layout not in LAYOUTS:
        raise FimError(f"unknown FIM layout {req.layout!r}")
    return req.layout == "moved-line"  # auto is plain (see the module docstring)


def split_current_line(prefix: str) -> tuple[str, str]:
    """``prefix`` as (everything through its last newline, the unfinished line after it)."""
    cut = prefix.rfind("\n") + 1
    return prefix[:cut], prefix[cut:]


def repo_context(ids: FimTokens, chunks: Sequence[tuple[str, str]], tokenize: Callable[[str], list[int]],
                 header: bool) -> list[int]:
    """The repository context in front of ``FIM_PRE``: llama-server's ``[FIM_REP]myproject\\n``, each chunk as
    ``[FIM_SEP]filename\\n`` and its text, then ``[FIM_SEP]filename\\n`` for the current file (a vocabulary without
    FIM_REP/FIM_SEP gets the chunks after a plain-text separator). Empty without chunks unless ``header``."""
    if not chunks and not header:
        return []
    out: list[int] = []
    if ids.rep >= 0:
        out += [ids.rep, *tokenize(REPO_NAME)]
    for name, text in chunks:
        if ids.sep >= 0:
            out += [ids.sep, *tokenize(name + "\n")]
        else:
            out += tokenize(CHUNK_SEPARATOR)
        out += tokenize(text)
    if ids.sep >= 0:
        out += [ids.sep, *tokenize(FILE_NAME)]
    return out


def _cut_front(tokens: list[int], take: int) -> list[int]:
    """The last ``take`` tokens or up to ``take // 4 - 1`` fewer: the cut moves in steps of ``take // 4``, so
    that ``tokens`` growing at its end keeps the same first token until the next step."""
    if len(tokens) <= take:
        return tokens
    step = max(1, take // 4)
    drop = -(-(len(tokens) - take) // step) * step
    return tokens[drop:]


def fim_tokens(req: FimRequest, ids: FimTokens, tokenize: Callable[[str], list[int]], *, num_ctx: int,
               room: int = 0, bos: int | None = None, tokenize_typed: Callable[[str], list[int]] | None = None
               ) -> FimLayout:
    """The prompt of ``req`` in model tokens (see the module docstring for the layout and the cuts).

    ``tokenize``: text to ids without special tokens (llama-server's ``parse_special`` false for prefix, suffix
    and chunks); ``tokenize_typed``: the same for the typed text (``/infill`` reads special tokens in its
    ``prompt``, as llama-server does; default ``tokenize``). ``num_ctx``: the slot's context in tokens;
    ``room``: tokens kept for the answer (``num_predict``, 0 when unset); ``bos``: a BOS id to put first, or None.
    Raises FimError when the vocabulary has no FIM tokens or the layout is unknown.
    """
    if not ids.usable:
        raise FimError("the vocabulary has no FIM tokens: " + ids.missing())
    after_mid = types_after_middle(req)
    prefix, typed_text = req.prefix, req.typed or ""
    head = None
    if req.typed is None and after_mid:
        prefix, typed_text = split_current_line(prefix)
    elif req.typed is None:
        head = split_current_line(prefix)[0]
    typed = (tokenize_typed or tokenize)(typed_text) if typed_text else []
    window = window_for(num_ctx)
    pre_all, suf_all = tokenize(prefix), tokenize(req.suffix)
    pre = _cut_front(pre_all, 3 * (window // 4))
    suf = suf_all[:max(0, window // 4 - 2 - (0 if after_mid else len(typed)))]
    extra_all = repo_context(ids, req.extra, tokenize, req.repo)
    n_extra = min(len(extra_all), max(0, num_ctx - window - 2 * max(0, room)))
    extra = extra_all[len(extra_all) - n_extra:]
    start = ([bos] if bos is not None else []) + extra + [ids.pre]
    if after_mid:
        tokens = start + pre + [ids.suf] + suf + [ids.mid]
        stable = len(tokens)
        tokens += typed
    else:
        tokens = start + pre + typed + [ids.suf] + suf + [ids.mid]
        if head is None:  # /infill's prompt in the prefix: the prefix (lines above the cursor) is what stays
            stable = len(start) + len(pre)
        else:  # the whole prefix sent: what stays is the prefix up to the current line, as tokenized in it
            kept = _common(tokenize(head), pre_all) - (len(pre_all) - len(pre))
            stable = len(start) + max(0, kept)
    truncated = len(pre) < len(pre_all) or len(suf) < len(suf_all) or n_extra < len(extra_all)
    assert 0 < stable <= len(tokens)
    return FimLayout(tokens, stable, truncated)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
