"""A loaded model: backend + engine + chat template, with prompt building.

:class:`LoadedModel` is the in-process :class:`~ollapy.engine.interface.ModelRunner` (what the CLI, the
runtime and the server hold when the model runs in this process). It loads the model (and a draft model or
a vision projector), submits prompts to the :class:`Engine`, embeds, reports its figures and closes. Its
prompt building (rendering chat messages with the model's template, tokenizing without duplicating BOS,
``num_keep`` and the cache save points) is :class:`~ollapy.engine.prompt_builder.PromptBuilder`'s, a base
of :class:`LoadedModel`.

Ownership and close order (:meth:`LoadedModel.close`, also the context
manager's exit): 1. stop the engine loop and join its thread; 2. close the
prompt cache (write back, drain its disk writer at normal priority, bounded);
3. free llama.cpp's context and model. When the join times out the context
is never freed (leaked and logged): freeing it under a running
``llama_decode`` crashes the process.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ollapy import config
from ollapy.chat import templates as chat
from ollapy.chat.fim import FimTokens
from ollapy.engine.backend import bindings
from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.engine import Engine
from ollapy.engine.heap import release_free_heap
from ollapy.engine.interface import ContextFacts, RunnerSnapshot
from ollapy.engine.prompt_builder import PromptBuilder
from ollapy.engine.request import Prompt, Request
from ollapy.engine.spec.draft_model import DraftModel
from ollapy.engine.spec.policy import StepCost
from ollapy.engine.spec.speculator import NGRAM, Speculator
from ollapy.engine.spec.step_costs import StepCostStore, file_identity, step_cost_key
from ollapy.options import Options, tensor_split_values
from ollapy.store.draft_vocab import read_token_map
from ollapy.store.info import read_gguf_header

if TYPE_CHECKING:
    import asyncio


log = logging.getLogger("ollapy.engine")


#: attention heads at least this wide get flash attention in a draft model's context on a CPU (draft_flash_attn)
DRAFT_FA_MIN_HEAD = 256


def draft_flash_attn(setting: str, gpu_offload: bool, draft_path: Path) -> str:
    """The ``flash_attn`` of a draft model's context: ``setting`` unless it is ``auto`` on a CPU, where it is
    ``on`` for heads of at least :data:`DRAFT_FA_MIN_HEAD` (``{arch}.attention.key_length``) and ``off`` below.

    llama.cpp's CPU flash-attention kernel pays off for wide heads (Gemma 3's 256) and costs for narrow ones
    (SmolLM2's 64), as engine/hardware.py found for the model itself (figures: docs/benchmarks.md).
    Raises ModelLoadError when the draft's header is unreadable."""
    if setting != "auto" or gpu_offload:
        return setting
    meta = read_gguf_header(draft_path)[0]
    arch = meta.get("general.architecture") or ""
    width = meta.get(f"{arch}.attention.key_length")
    if not isinstance(width, int):
        embd, heads = meta.get(f"{arch}.embedding_length"), meta.get(f"{arch}.attention.head_count")
        width = embd // heads if isinstance(embd, int) and isinstance(heads, int) and heads > 0 else 0
    return "on" if width >= DRAFT_FA_MIN_HEAD else "off"


class LoadedModel(PromptBuilder):
    """One model loaded for serving. Raises ModelLoadError from :class:`Backend` on bad files.

    Owns its backend, engine and bound prompt cache; a context manager whose
    exit calls :meth:`close`.
    """

    #: where the draft policy's measured step times are remembered (None: not remembered, e.g. a pinned cost)
    _step_costs: tuple[StepCostStore, str] | None = None

    def __init__(self, path: str | Path, options: Options | None = None, *, name: str | None = None,
                 template: str | None = None, cache=None, max_queue: int = 512, digest: str | None = None,
                 draft_path: str | Path | None = None, projector_path: str | Path | None = None) -> None:
        options = options or Options()
        t0 = time.perf_counter_ns()
        self.options = options
        self.path = Path(path)
        self.name = name or self.path.name
        self.digest = digest
        self.backend = Backend(path, ContextConfig(
            n_parallel=options.num_parallel, num_ctx=options.num_ctx, num_batch=options.num_batch,
            num_gpu=options.num_gpu, num_thread=options.num_thread, kv_cache_type=options.kv_cache_type,
            flash_attn=options.flash_attn, extra_bufts=options.extra_bufts,
            rpc=tuple(e for e in options.rpc.split(",") if e), tensor_split=tuple(tensor_split_values(options.tensor_split))))
        self.architecture = self.backend.meta("general.architecture") or "unknown"
        override = template if template and ("{%" in template or "messages" in template) else None
        self.template = chat.select_template(self.backend.chat_template(), self.architecture, override)
        bos = self.backend.bos
        self.bos_text = self.backend.token_text(bos) if bos >= 0 else ""
        eos = self.backend.eos
        self.eos_text = self.backend.token_text(eos) if eos >= 0 else ""
        if cache is not None and hasattr(cache, "bind"):
            cache = cache.bind(self)
        self.cache = cache
        b = self.backend
        self.facts = ContextFacts(num_ctx=b.num_ctx, n_ctx_train=b.n_ctx_train, n_parallel=b.n_parallel,
                                  n_vocab=b.n_vocab, bos=b.bos, eos=b.eos, add_bos=bool(b.add_bos),
                                  fim=FimTokens(*b.fim_ids))
        self.draft_backend: Backend | None = None
        speculator = self._load_draft(draft_path, options)
        row_cost = config.draft_row_cost()
        if row_cost is not None:  # OLLAPY_DRAFT_ROW_COST: the policy's step-cost line, pinned
            speculator.pin_cost(StepCost(1.0 - row_cost, row_cost))
        else:  # start from the step times an earlier process measured for this model on this machine
            store = StepCostStore(config.step_costs_dir())
            key = step_cost_key(self.path, self._step_cost_facts(draft_path))
            speculator.seed_steps(store.load(key))
            self._step_costs = (store, key)
        self.media = self._load_projector(projector_path)
        self.load_duration_ns = time.perf_counter_ns() - t0 - self.backend.imports_wait_ns
        self.engine = Engine(self.backend, max_queue=max_queue, cache=cache, load_duration_ns=self.load_duration_ns,
                             speculator=speculator, media=self.media)
        self.unsaved_states = 0
        self._closed = False
        self._prefix_tokens: collections.OrderedDict[str, tuple[int, ...]] = collections.OrderedDict()
        self._prefix_lock = threading.Lock()
        self._embedder = None  # ollapy.engine.backend.embedding.Embedder, made on the first embed()
        self._embedder_lock = threading.Lock()
        log.debug("template for %s: %s", self.name, self.template.source)

    def _step_cost_facts(self, draft_path: str | Path | None) -> dict[str, object]:
        """What a decode step's time depends on besides the model file (the key of step_costs.StepCostStore)."""
        b = self.backend
        return {"threads": b.threads, "slots": b.n_parallel, "num_ctx": b.num_ctx, "gpu": b.gpu_offload,
                "flash_attn": b.flash_attn, "extra_bufts": b.extra_bufts,
                "draft": file_identity(draft_path) if draft_path is not None else "",
                "build": f"{bindings.library_version()}+{','.join(sorted(bindings.build_patches()))}"}

    def _load_draft(self, draft_path: str | Path | None, options: Options) -> Speculator:
        """The engine's speculator, with a draft model's context when ``draft_path`` names one (the ``draft``
        option / Modelfile ``DRAFT``): the same slots and context length as the target. Raises
        ModelLoadError (one line naming both models) when the vocabularies differ; the target is freed then."""
        b = self.backend
        if draft_path is None:
            return Speculator(b.n_parallel, draft_name=NGRAM if options.draft == NGRAM else "",
                              row_invariant=b.row_invariant)
        try:
            fa = draft_flash_attn(options.flash_attn, b.gpu_offload, Path(draft_path))
            self.draft_backend = Backend(draft_path, ContextConfig(
                n_parallel=b.n_parallel, num_ctx=b.num_ctx, num_batch=options.num_batch, num_gpu=options.num_gpu,
                num_thread=options.num_thread, kv_cache_type=options.kv_cache_type, flash_attn=fa,
                extra_bufts=options.extra_bufts))
            dm = DraftModel(self.draft_backend, b, self.name, options.draft, read_token_map(Path(draft_path)))
        except BaseException:
            if self.draft_backend is not None:
                self.draft_backend.close()
            b.close()
            raise
        log.debug("draft model %s loaded for %s", options.draft, self.name)
        return Speculator(b.n_parallel, draft_model=dm, draft_name=options.draft, row_invariant=b.row_invariant)

    def _load_projector(self, projector_path: str | Path | None):
        """The :class:`~ollapy.engine.media.MediaPrompter` of a vision model's projector (None without one).
        Raises ModelLoadError (the model is freed then)."""
        self.projector_path = Path(projector_path) if projector_path else None
        if projector_path is None:
            return None
        from ollapy.engine.backend.media import Projector
        from ollapy.engine.media import MediaPrompter

        try:
            return MediaPrompter(Projector(projector_path, self.backend))
        except BaseException:
            if self.draft_backend is not None:
                self.draft_backend.close()
            self.backend.close()
            raise

    @property
    def supports_vision(self) -> bool:
        """Whether a vision projector is loaded (Ollama's ``vision`` capability)."""
        return self.media is not None

    # ---- generation ---------------------------------------------------------------------------
    def submit(self, prompt: Prompt, options: Options, *, fmt=None, cache: bool = True,
               loop: asyncio.AbstractEventLoop | None = None, pin: bool = False, logprobs: int = -1,
               timeout: float | None = None) -> Request:
        """Queue a generation for ``prompt``; returns the Request to stream chunks from.

        Compiles ``fmt``'s grammar on the caller's thread (a server calls this off its event loop);
        ``timeout`` is accepted for the runner interface and unused here (nothing to wait for).

        ``pin`` marks the prompt-cache entries this request saves as pinned
        (never evicted); ``cache=False`` bypasses the prompt cache;
        ``logprobs`` >= 0 attaches each token's log-probability and that many
        alternatives to the chunks (:class:`~ollapy.engine.request.TokenLogprob`).
        """
        return self.engine.submit(prompt.tokens, options, grammar=self.grammar_for(fmt), keep=prompt.keep,
                                  cache=cache, save_points=prompt.save_points, loop=loop, pin=pin,
                                  truncated=prompt.truncated, logprobs=logprobs, media=getattr(prompt, "media", ()),
                                  save_end=getattr(prompt, "save_end", True))

    def chat(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
             think: bool | str | None = None, **kw) -> Request:
        """Render ``messages`` (with ``tools`` and ``think`` as in :meth:`render`) and submit; other keyword
        arguments as in :meth:`submit`."""
        options = options or self.options
        return self.submit(self.chat_prompt(messages, options, tools=tools, think=think), options, **kw)

    # ---- embeddings ---------------------------------------------------------------------------
    def embed(self, inputs, *, truncate: bool = True, normalized: bool = True, dimensions: int | None = None):
        """Embed ``inputs`` (a list of texts or of token-id lists) on the model's own embedding context.

        Returns :class:`ollapy.engine.backend.embedding.Embeddings`: ``vectors`` float32 ``(len(inputs), dim)`` in
        input order (L2-normalised unless ``normalized`` is false; ``dimensions`` keeps the first values and
        renormalises), ``token_counts`` per input. Runs on the caller's thread and never disturbs generation
        (see :mod:`ollapy.engine.backend.embedding`). Raises OptionError (empty input, bad token id, dimensions < 1),
        ContextError (``truncate=False`` and an input over ``min(num_ctx, n_ctx_train)`` tokens), DecodeError.
        """
        from ollapy.engine.backend.embedding import Embedder

        with self._embedder_lock:
            if self._closed:
                from ollapy.errors import DecodeError

                raise DecodeError(f"{self.name} is being unloaded", hint="retry the request")
            if self._embedder is None:
                self._embedder = Embedder(self.backend, num_ctx=self.options.num_ctx, num_batch=self.options.num_batch)
            embedder = self._embedder
        return embedder.embed(list(inputs), truncate=truncate, normalized=normalized, dimensions=dimensions)

    @property
    def embedding_only(self) -> bool:
        """True for an embedding model (GGUF ``pooling_type`` set, or an encoder such as BERT), as Ollama decides."""
        from ollapy.engine.backend.embedding import is_embedding_model

        return is_embedding_model(self.backend)

    # ---- figures ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True until :meth:`close`."""
        return not self._closed

    @property
    def cache_block(self) -> int | None:
        """Tokens per prompt-cache block; None without a prompt cache."""
        return getattr(self.cache, "block", None) if self.cache is not None else None

    def stats(self) -> dict:
        """The engine's figures (:meth:`ollapy.engine.engine.Engine.stats`)."""
        return self.engine.stats()

    def cache_stats(self):
        """The prompt cache's :class:`ollapy.cache.stats.CacheStats`; None without a prompt cache."""
        return self.cache.snapshot() if self.cache is not None else None

    def snapshot(self) -> RunnerSnapshot:
        """The figures now: in this process they are read directly (two short locks, no I/O)."""
        return RunnerSnapshot(stats=self.stats(), cache=self.cache_stats())

    def info(self) -> dict:
        """Model facts for ``show``/``ps``/``--verbose``: architecture, sizes, template source, KV bytes."""
        b = self.backend
        kv = b.kv_bytes_per_token()
        return {
            "name": self.name,
            "path": str(self.path),
            "architecture": self.architecture,
            "description": b.description(),
            "size": b.model_size(),
            "context_length": b.n_ctx_train,
            "num_ctx": b.num_ctx,
            "num_parallel": b.n_parallel,
            "template": self.template.source,
            "kv_bytes_per_token": kv,
            "kv_bytes_per_slot": kv * b.num_ctx,
            "extra_bufts": b.extra_bufts_reason,
            "flash_attn": b.flash_attn,
            "can_shift": b.can_shift,
            "threads": b.threads,
            "devices": b.devices,
            "gpu_offload": b.gpu_offload,
            "gpu_layers": list(b.gpu_layers),  # [offloaded, total] layers (total counts the output layer)
            "draft": self.engine.spec.draft_name,  # the draft model's name, "ngram" by default, or ""
            "draft_size": self._draft_bytes(),  # a draft model's weights plus its KV cache (bytes), else 0
            "row_invariant": b.row_invariant,  # drafting's output is bit-identical to plain decoding's
            "vision": self.media is not None,  # a vision projector is loaded (Ollama's "vision" capability)
            "projector": str(self.projector_path) if self.projector_path else "",
        }

    def _draft_bytes(self) -> int:
        d = self.draft_backend
        if d is None:
            return 0
        return d.model_size() + d.kv_bytes_per_token() * d.num_ctx * d.n_parallel

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, timeout: float = 120.0) -> int:
        """Stop and join the engine, close the cache (bounded drain), free the model; idempotent.

        Returns how many prompt-cache states could not be saved (timeout or
        Ctrl-C during the drain). A KeyboardInterrupt during the drain is
        re-raised after the model was freed; ``unsaved_states`` keeps the count.
        """
        if self._closed:
            return self.unsaved_states
        self._closed = True
        joined = self.engine.stop(timeout=60)
        if joined and self._step_costs is not None:
            store, key = self._step_costs
            steps = self.engine.spec.measured_steps()
            if steps:
                store.save(key, steps)
        interrupted = False
        try:
            if self.cache is not None and hasattr(self.cache, "close"):
                try:
                    self.unsaved_states = self.cache.close(timeout).unsaved
                except KeyboardInterrupt:
                    interrupted = True
                    self.unsaved_states = self.cache.last_drain.unsaved
        finally:
            with self._embedder_lock:
                embedder, self._embedder = self._embedder, None
            if embedder is not None:
                embedder.close()  # waits for an embedding decode in flight; before the model is freed
            if joined:
                if self.media is not None:
                    self.media.close()  # the projector holds the text model: freed first
                self.backend.close()
                if self.draft_backend is not None:
                    self.draft_backend.close()
            else:
                log.warning("engine loop of %s did not stop; its llama.cpp context is leaked, not freed", self.name)
            release_free_heap()  # the cache's blocks and llama.cpp's buffers, freed above, leave the process
        if interrupted:
            raise KeyboardInterrupt
        return self.unsaved_states
