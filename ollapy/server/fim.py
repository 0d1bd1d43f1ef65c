"""Code completion (fill-in-the-middle) shared by the routes editors call: start a FIM generation.

Three routes build a :class:`~ollapy.chat.fim.FimRequest` and call :func:`start_fim`: Ollama's
``/api/generate`` with ``suffix`` (Continue), OpenAI's ``/v1/completions`` with ``suffix``, and llama.cpp's
``/infill`` (llama.vscode, llama.vim; :mod:`ollapy.server.llamacpp.infill`). The model decides how the prompt is
built (:meth:`ollapy.engine.interface.ModelRunner.fim_prompt`): the vocabulary's FIM tokens laid out as
llama-server lays them out, else a template that reads ``suffix`` (an Ollama registry template with ``.Suffix``)
rendered as Ollama renders it; a model with neither answers Ollama's ``"NAME" does not support insert`` (400),
checked on the loaded model, never on its name.

What Ollama does with the other ``/api/generate`` fields when ``suffix`` is set (``server/routes.go``,
``GenerateHandler``), ollapy does too: ``system`` (and the model's SYSTEM) is not used, ``context`` goes in front
of the completion prompt, ``raw`` sends ``prompt`` verbatim and ignores ``suffix`` (the model must still support
insert), and an empty ``prompt`` only loads the model (the route's business).

A completion's prompt cache use is bounded by design: the prompt's one save point is its stable part (see
:mod:`ollapy.chat.fim`), and the state a finished completion leaves is not stored (``Prompt.save_end``), so a
trace of keystrokes over one file writes that file's KV about once, not once per keystroke. Cancelling (the
client closed the connection) frees the slot within one engine step, as for every generation
(:class:`~ollapy.server.generation.Generation`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from ollapy.chat.fim import FimRequest
from ollapy.chat.reply import ReplyParser
from ollapy.errors import OptionError
from ollapy.options import api_options
from ollapy.server.generation import Generation, check_fits, with_context
from ollapy.server.ollama.details import ref_supports_insert


def insert_unsupported(name: str) -> OptionError:
    """Ollama's 400 for a ``suffix`` to a model without FIM tokens or a ``.Suffix`` template."""
    return OptionError(f'"{name}" does not support insert',
                       hint="send it without suffix, or use a code model with FIM tokens (e.g. qwen2.5-coder)")


async def start_fim(state, name: str, request: FimRequest, *, route: str, options: dict | None = None,
                    keep_alive=None, cache: bool = True, context: list[int] | None = None, raw_prompt: str | None = None,
                    logprobs: int = -1, fmt=None, overflow: str = "truncate",
                    refuse: Callable[[str], Exception] = insert_unsupported) -> Generation:
    """Load ``name`` if needed and submit one code completion; raises before anything is sent on errors.

    ``request``'s ``layout`` is replaced by the request's ``fim_layout`` option. ``raw_prompt`` (Ollama's
    ``raw``): that text verbatim instead of a FIM prompt. ``context``: token ids an earlier ``/api/generate``
    returned, put in front. ``overflow`` as :func:`ollapy.server.generation.start` (``"error"``: a prompt that
    does not fit ``num_ctx`` is a 400 unless ``options`` set ``truncate``). ``refuse(name)``: the error for a
    model that supports no insert (default Ollama's words). Raises OptionError (400: no insert support, bad
    options), ModelNotFound (404), BusyError, RunnerError.
    """
    t0 = time.perf_counter()
    rt = state.runtime
    if overflow == "error" and "truncate" not in (options or {}):
        options = {**(options or {}), "truncate": False}
    opts_in = api_options(options)
    ref = await rt.resolve(name)
    if not await asyncio.to_thread(ref_supports_insert, ref):  # refused before a load evicts another model
        raise refuse(name)
    entry, opts, load_ns = await rt.acquire(name, opts_in, keep_alive, ref=ref)
    try:
        model = entry.model
        if not model.supports_insert:
            raise refuse(name)
        if raw_prompt is not None:
            p = await rt.call(entry, model.raw_prompt, raw_prompt)
        else:
            p = await rt.call(entry, model.fim_prompt, dataclasses.replace(request, layout=opts.fim_layout), opts)
            if context:
                f = model.facts
                p = with_context(p, context, f.n_vocab, f.bos if f.add_bos else None)
        if not opts.truncate:
            check_fits(len(p.tokens), opts)
        req = await rt.call(entry, model.submit, p, opts, fmt=fmt, cache=cache, loop=asyncio.get_running_loop(),
                            logprobs=logprobs, late=lambda r: r.cancel())
    except BaseException:
        rt.release_nowait(entry)
        raise
    gen = Generation(state, entry, req, load_ns, t0, route, ReplyParser())
    gen.prompt_tokens = len(p.tokens)
    return gen
