"""The runner interface: what the CLI, the runtime and the server hold for a loaded model.

:class:`ModelRunner` is a :class:`typing.Protocol`. Two classes implement it:
:class:`ollapy.engine.model.LoadedModel` (the model in this process) and
:class:`ollapy.runner.process.ProcessModel` (the model in a runner child, see
:mod:`ollapy.runner`); :func:`ollapy.runner.loader.open_model` picks one. Callers use
nothing else: nobody outside ``engine/`` reaches into a runner's ``.engine``,
``.cache`` or ``.backend`` (``tests/test_layering.py`` checks it).

Importing this module loads no llama.cpp (it is read by ``ollapy ps`` and by a
parent process that must never load ggml).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ollapy.chat.fim import FimTokens

if TYPE_CHECKING:
    import asyncio

    from ollapy.chat.fim import FimRequest
    from ollapy.chat.templates import Template
    from ollapy.engine.request import Prompt, Request
    from ollapy.options import Options

STALE_AFTER_S = 5.0  # a snapshot older than this is shown as stale (a runner refreshes its own every second)


@dataclass(frozen=True)
class ContextFacts:
    """Figures of a loaded model's context: context per slot (tokens), trained context, slots, vocabulary
    size, BOS/EOS ids (-1: none), whether the model adds BOS, and its fill-in-the-middle token ids."""

    num_ctx: int
    n_ctx_train: int
    n_parallel: int
    n_vocab: int
    bos: int
    eos: int
    add_bos: bool
    fim: FimTokens = FimTokens()


@dataclass(frozen=True)
class RunnerSnapshot:
    """A runner's figures as last refreshed, for ``/api/ps`` and ``/metrics`` (read without waiting on it).

    ``stats`` is the engine's (``slots``, ``slots_busy``, ``queue_depth``, ``steps``, ``requests_done``);
    ``cache`` the prompt cache's :class:`ollapy.cache.stats.CacheStats` (None: no prompt cache);
    ``taken_at`` the ``time.monotonic()`` at which this process got it.
    """

    stats: dict = field(default_factory=dict)
    cache: Any = None
    taken_at: float = field(default_factory=time.monotonic)

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the figures were taken."""
        return max(0.0, (time.monotonic() if now is None else now) - self.taken_at)

    def stale(self, now: float | None = None, limit_s: float = STALE_AFTER_S) -> bool:
        """True when the figures are older than ``limit_s`` (the runner did not refresh them: stopped or hung)."""
        return self.age_s(now) > limit_s


@runtime_checkable
class ModelRunner(Protocol):
    """One loaded model, as its callers use it. Every method may raise the :class:`~ollapy.errors.OllapyError`
    subclasses named on it, and RunnerError (HTTP 502) when a runner child stopped.

    Prompt building (:meth:`tokenize`, :meth:`render`, :meth:`chat_prompt`, :meth:`raw_prompt`,
    :meth:`fim_prompt`, :meth:`grammar_for`), generation (:meth:`submit`, :meth:`chat`: a :class:`~ollapy.engine.request.Request`
    to iterate, ``async for`` with ``loop=``, or ``cancel()``), :meth:`embed`, figures (:meth:`info`,
    :meth:`stats`, :meth:`cache_stats`, :meth:`snapshot`), model facts (the attributes and ``facts``) and
    :meth:`close` (also the context manager's exit).
    """

    name: str
    path: Path
    digest: str | None
    options: Options
    architecture: str
    template: Template
    facts: ContextFacts
    load_duration_ns: int
    unsaved_states: int

    @property
    def alive(self) -> bool:
        """True while the model can serve (false once closed, or once its runner child died)."""

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tool definitions."""

    @property
    def supports_thinking(self) -> bool:
        """Whether the chat template has a reasoning section."""

    @property
    def supports_insert(self) -> bool:
        """Whether the model completes code between a prefix and a suffix (Ollama's ``insert`` capability): its
        vocabulary has FIM tokens, or its template reads ``suffix`` (a registry Go template with ``.Suffix``)."""

    @property
    def embedding_only(self) -> bool:
        """True for an embedding model (no text generation)."""

    @property
    def cache_block(self) -> int | None:
        """Tokens per prompt-cache block (the shortest prefix it saves); None without a prompt cache."""

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the model's special-token rules, never two BOS tokens."""

    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text`` exactly as ``llama_tokenize`` gives them with these two switches."""

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes, special tokens rendered. Raises OptionError for an id outside the vocabulary."""

    def render(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list[dict] | None = None,
               think: bool | str | None = None) -> str:
        """Chat messages to prompt text with the model's template. Raises OptionError."""

    def chat_prompt(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
                    think: bool | str | None = None) -> Prompt:
        """Tokens, ``keep`` and cache save points of a chat. Raises OptionError."""

    def raw_prompt(self, text: str) -> Prompt:
        """A prompt used verbatim (Ollama's ``raw``)."""

    def fim_prompt(self, request: FimRequest, options: Options | None = None) -> Prompt:
        """A code-completion prompt (:mod:`ollapy.chat.fim`): the model's FIM tokens, else its template when it
        reads ``suffix``; its save point is the part the next keystroke keeps, and its finished state is not
        cached (``save_end`` False). Raises OptionError when the model supports no insert."""

    def grammar_for(self, fmt: Any) -> str | None:
        """GBNF for Ollama's ``format`` (None, ``"json"`` or a JSON schema dict). Raises OptionError."""

    def submit(self, prompt: Prompt, options: Options, *, fmt: Any = None, cache: bool = True,
               loop: asyncio.AbstractEventLoop | None = None, pin: bool = False, logprobs: int = -1,
               timeout: float | None = None) -> Request:
        """Queue a generation; returns its Request. ``timeout``: seconds to wait for a runner child to accept it
        (RunnerError past it). Raises BusyError (queue full), OptionError (bad ``format``)."""

    def chat(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
             think: bool | str | None = None, **kw: Any) -> Request:
        """:meth:`chat_prompt` then :meth:`submit` (keyword arguments as there)."""

    def embed(self, inputs: Any, *, truncate: bool = True, normalized: bool = True,
              dimensions: int | None = None) -> Any:
        """Embeddings of a list of texts or token-id lists: ``vectors`` float32 ``(len(inputs), dim)``,
        ``token_counts``, ``truncated``, ``duration_ns``, ``pooling``. Raises OptionError, ContextError."""

    def info(self) -> dict:
        """Model facts for ``show``/``ps``/``--verbose`` (architecture, sizes, template source, KV bytes...)."""

    def stats(self) -> dict:
        """The engine's figures now (``slots``, ``slots_busy``, ``queue_depth``, ``steps``, ``requests_done``)."""

    def cache_stats(self) -> Any:
        """The prompt cache's :class:`ollapy.cache.stats.CacheStats` now; None without a prompt cache."""

    def snapshot(self) -> RunnerSnapshot:
        """The last figures the runner refreshed; never waits on the runner (a stopped one: old ``taken_at``)."""

    def close(self, timeout: float = 120.0) -> int:
        """Stop serving and free the model (bounded prompt-cache drain); idempotent; returns states not saved."""

    def __enter__(self) -> ModelRunner:
        ...

    def __exit__(self, *exc: object) -> None:
        ...
