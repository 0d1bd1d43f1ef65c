"""llama.cpp server's ``POST /infill``: code completion for llama.vscode and llama.vim, in llama-server's format.

The body is llama-server's (``tools/server/server-context.cpp``, ``post_infill``, and its README):

* ``input_prefix``, ``input_suffix`` (strings, required): the file before and after the cursor;
* ``input_extra``: ``[{"filename": str, "text": str}, ...]``, repository context (llama.vscode's ring buffer of
  chunks), laid out with the model's ``FIM_REP``/``FIM_SEP`` tokens (:mod:`ollapy.chat.fim`);
* ``prompt``: the text typed so far on the current line; where it goes is the ``fim_layout`` option (default:
  after ``FIM_MID``, so a keystroke extends a cached prefix; ``plain``: llama-server's place, the prefix's end);
* ``n_predict`` (-1: no limit), ``t_max_predict_ms`` (stop at a new line once this much time went into
  generating), ``n_indent`` (stop at a new line indented less: that line is cut);
* ``samplers``: the names in the chain (llama-server's ``top_k``, ``top_p``, ``min_p``, ``typ_p``,
  ``temperature``...; the one-letter string form too); a sampler left out is turned off (its neutral value).
  ``dry``, ``xtc``, ``infill`` and ``penalties`` are accepted and have no sampler of their own here;
* ``cache_prompt`` (false: the prompt cache is not used), ``response_fields`` (the final object is cut to these
  paths, ``timings/prompt_n`` style, keyed by the path as llama-server does), ``stream``;
* sampling as ``/completion`` takes it: ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``,
  ``seed``, ``stop``, ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``,
  ``mirostat``, ``mirostat_tau``, ``mirostat_eta``; ``model`` names the model (else the one loaded), and
  ``options`` (an ollapy extension, Ollama's options object) may set the rest (``fim_layout``, ``num_ctx``...).

The answer is llama-server's final object: ``content``, ``stop`` (true), ``model``, ``tokens_predicted``,
``tokens_evaluated`` (prompt tokens), ``tokens_cached`` (tokens the slot holds after it), ``truncated``,
``stop_type`` (``eos``, ``word``, ``limit``), ``stopping_word``, ``has_new_line``, ``timings`` (``cache_n``,
``prompt_n``, ``prompt_ms``, ``prompt_per_token_ms``, ``prompt_per_second``, ``predicted_n``, ``predicted_ms``,
``predicted_per_token_ms``, ``predicted_per_second``) and, for older clients, ``stopped_eos``, ``stopped_word``
and ``stopped_limit``. Streamed: ``data: {...}`` events with ``content`` and ``stop: false``, the final object
last, and no ``[DONE]`` (llama-server sends none for ``/infill``). The generation stops as llama-server's does:
at an end-of-generation token (the vocabulary's EOT, ``FIM_PAD``, ``FIM_REP`` and ``FIM_SEP`` are all EOG in
llama.cpp), a stop word or a limit. Errors are OpenAI's shape, as llama-server's.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ollapy.chat.fim import FimRequest
from ollapy.errors import OptionError
from ollapy.server import fim
from ollapy.server.errors import sse_error_event
from ollapy.server.http import GenStream, openai_err, read_body, sse_event, state_of, watch_disconnect
from ollapy.server.llamacpp.routes import model_name

router = APIRouter()

SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
            "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta")
"""llama-server's sampling fields that are Ollama options of the same name."""
SAMPLER_OFF = {"top_k": ("top_k", 0), "top_p": ("top_p", 1.0), "min_p": ("min_p", 0.0), "typ_p": ("typical_p", 1.0)}
"""A sampler left out of ``samplers``, and the option value that turns it off."""
SAMPLER_NAMES = {"top_k": "top_k", "top-k": "top_k", "k": "top_k", "top_p": "top_p", "top-p": "top_p",
                 "nucleus": "top_p", "p": "top_p", "min_p": "min_p", "min-p": "min_p", "m": "min_p",
                 "typ_p": "typ_p", "typical_p": "typ_p", "typical-p": "typ_p", "typical": "typ_p", "typ": "typ_p",
                 "y": "typ_p"}
"""llama.cpp's sampler names and one-letter codes (``common/sampling.cpp``) of the samplers ollapy can turn off."""


def _text(body: dict, name: str, required: bool) -> str:
    v = body.get(name)
    if v is None:
        if required:
            raise OptionError(f'"{name}" is required', hint="send input_prefix and input_suffix (strings)")
        return ""
    if not isinstance(v, str):
        raise OptionError(f'"{name}" must be a string')
    return v


def _int(body: dict, name: str, default: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not -2**31 <= v < 2**31:
        raise OptionError(f'"{name}" must be an integer, got {v!r}')
    return int(v)


def read_extra(value: Any) -> tuple[tuple[str, str], ...]:
    """``input_extra`` as ``(filename, text)`` chunks (filename ``tmp`` when absent, as llama-server). Raises
    OptionError with llama-server's words."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise OptionError('"input_extra" must be an array of {"filename": string, "text": string}')
    out = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise OptionError('input_extra chunk must contain a "text" field with a string value')
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise OptionError('input_extra chunk\'s "filename" field must be a string')
        out.append((name, chunk["text"]))
    return tuple(out)


def sampler_options(value: Any) -> dict:
    """The options that turn off the samplers ``samplers`` leaves out (None: llama-server's default chain,
    nothing off). A list of names or a string of one-letter codes; unknown names are skipped, as llama.cpp
    skips them. Raises OptionError for another type."""
    if value is None:
        return {}
    if isinstance(value, str):
        names = list(value)
    elif isinstance(value, list) and all(isinstance(x, str) for x in value):
        names = value
    else:
        raise OptionError('"samplers" must be a list of sampler names or a string of sampler codes')
    on = {SAMPLER_NAMES[n.lower()] for n in names if n.lower() in SAMPLER_NAMES}
    return dict(opt for name, opt in SAMPLER_OFF.items() if name not in on)


def read_fields(value: Any) -> list[str]:
    """``response_fields``: a list of paths (``content``, ``timings/prompt_n``). Raises OptionError."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise OptionError('"response_fields" must be a list of field paths such as "content" or "timings/prompt_n"')
    return value


def nested_fields(paths: list[str], obj: dict) -> dict:
    """llama-server's ``json_get_nested_values``: for each ``a/b`` path found in ``obj``, ``{"a/b": value}``."""
    out = {}
    for path in paths:
        cur: Any = obj
        for key in path.split("/"):
            if not isinstance(cur, dict) or key not in cur:
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def infill_options(body: dict) -> dict:
    """The Ollama options of an ``/infill`` body: its ``options`` object, then the sampling fields, ``n_predict``
    and the samplers left out. Values are checked later (``api_options``)."""
    opts: dict = dict(body["options"]) if isinstance(body.get("options"), dict) else {}
    for name in SAMPLING:
        if body.get(name) is not None:
            opts[name] = body[name]
    n_predict = _int(body, "n_predict", -1)
    if n_predict >= 0:
        opts["num_predict"] = n_predict
    opts.update(sampler_options(body.get("samplers")))
    return opts


class LineLimits:
    """llama-server's ``n_indent`` and ``t_max_predict_ms`` stops, over the text generated so far.

    ``feed(piece, now_s)`` returns the text to send and whether to stop: a line after the first new line whose
    first character other than spaces and tabs comes before column ``n_indent`` ends the answer (its indentation
    is kept, the rest cut); a piece with a new line ends it when more than ``t_max_ms`` went into generating
    since the first piece (llama-server's code; its comment speaks of a second new line)."""

    def __init__(self, n_indent: int, t_max_ms: int) -> None:
        self.n_indent, self.t_max_ms = n_indent, t_max_ms
        self.text = ""
        self.sent = 0
        self.t0: float | None = None

    def feed(self, piece: str, now_s: float) -> tuple[str, bool]:
        if self.t0 is None:
            self.t0 = now_s
        self.text += piece
        cut = self._indent_cut() if self.n_indent > 0 else None
        if cut is not None:
            out, self.sent = self.text[self.sent:cut], max(self.sent, cut)
            return out, True
        stop = False
        if "\n" in piece:  # llama-server stops at any new line once the time is up (first or later)
            stop = self.t_max_ms > 0 and (now_s - self.t0) * 1000 > self.t_max_ms
        out, self.sent = self.text[self.sent:], len(self.text)
        return out, stop

    def _indent_cut(self) -> int | None:
        start = self.text.find("\n") + 1
        while start > 0:
            i = start
            while i < len(self.text) and self.text[i] in " \t":
                i += 1
            if i < len(self.text) and i - start < self.n_indent:
                return i
            start = self.text.find("\n", start) + 1
        return None


def _timings(m: dict) -> dict:
    cached = int(m.get("prompt_cache_tokens") or 0)  # prompt_eval_count counts every prompt token, reused or not
    prompt_n = max(0, int(m.get("prompt_eval_count") or 0) - cached)
    prompt_ms = (m.get("prompt_eval_duration") or 0) / 1e6
    pred_n, pred_ms = int(m.get("eval_count") or 0), (m.get("eval_duration") or 0) / 1e6
    return {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": pred_n, "predicted_ms": pred_ms,
            "predicted_per_token_ms": pred_ms / pred_n if pred_n else 0.0,
            "predicted_per_second": 1e3 * pred_n / pred_ms if pred_ms else 0.0}


def final_object(gen, model: str, text: str, stop_type: str, stopping_word: str, settings: dict,
                 content: str | None = None) -> dict:
    """llama-server's final ``/infill`` object (see the module docstring) for the answer ``text``; ``stop_type``
    eos, word or limit; ``content``: the text the object carries when not all of it (a stream's last piece)."""
    m = gen.metrics() if gen.final is not None else gen.partial_metrics()
    predicted = int(m.get("eval_count") or 0)
    return {"index": 0, "content": text if content is None else content, "tokens": [], "id_slot": -1, "stop": True,
            "model": model,
            "tokens_predicted": predicted, "tokens_evaluated": gen.prompt_tokens,
            "generation_settings": settings, "has_new_line": "\n" in text,
            "truncated": bool(m.get("truncated")), "stop_type": stop_type, "stopping_word": stopping_word,
            "stopped_eos": stop_type == "eos", "stopped_word": stop_type == "word",
            "stopped_limit": stop_type == "limit", "tokens_cached": gen.prompt_tokens + predicted,
            "timings": _timings(m)}


def _stop_type(final) -> tuple[str, str]:
    if final is None:
        return "limit", ""
    if final.stop_sequence:
        return "word", final.stop_sequence
    return ("limit", "") if final.done_reason == "length" else ("eos", "")


@router.post("/infill")
async def infill(request: Request):
    st = state_of(request)
    try:
        body = await read_body(request)
        req = FimRequest(prefix=_text(body, "input_prefix", True), suffix=_text(body, "input_suffix", True),
                         typed=_text(body, "prompt", False), extra=read_extra(body.get("input_extra")), repo=True)
        n_indent, t_max = max(0, _int(body, "n_indent", 0)), max(0, _int(body, "t_max_predict_ms", 0))
        fields = read_fields(body.get("response_fields"))
        stream = False if body.get("stream") is None else body["stream"]  # null: the default, as llama-server
        cache = True if body.get("cache_prompt") is None else body["cache_prompt"]
        if not isinstance(stream, bool) or not isinstance(cache, bool):
            raise OptionError('"stream" and "cache_prompt" must be true or false')
        name = model_name(st, body)
        opts = infill_options(body)
        gen = await fim.start_fim(st, name, req, route="infill", options=opts, cache=cache,
                                  refuse=_infill_unsupported)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return openai_err(exc)
    settings = {"n_predict": opts.get("num_predict", -1), "n_indent": n_indent, "t_max_predict_ms": t_max,
                **{k: v for k, v in opts.items() if k in SAMPLING}}
    limits = LineLimits(n_indent, t_max)

    def final(text: str, last, content: str | None = None) -> dict:
        kind, word = ("limit", "") if last is None else _stop_type(last)
        obj = final_object(gen, name, text, kind, word, settings, content)
        return nested_fields(fields, obj) if fields else obj

    if not stream:
        return await _whole(request, gen, limits, final)

    async def events():
        sent, limited, last = [], False, ""
        try:
            async for c in gen.chunks():
                piece, stop = ("", False) if limited or not c.text else limits.feed(c.text, time.perf_counter())
                if stop:  # a limit: the engine ends the request at its next step (text after it is dropped)
                    limited, last = True, piece
                    gen.req.finish_early()
                    continue
                if piece and not c.done:
                    sent.append(piece)
                    yield sse_event(_partial(gen, piece))
                if c.done:  # the last event: the final object, carrying the last piece of text
                    last = last if limited else piece
                    yield sse_event(final("".join(sent) + last, None if limited else c, last))
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the error is the last event
            yield sse_error_event(exc)

    return GenStream(events(), gen.close, "text/event-stream")


def _partial(gen, piece: str) -> dict:
    m = gen.partial_metrics()
    return {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": -1,
            "tokens_predicted": int(m.get("eval_count") or 0), "tokens_evaluated": gen.prompt_tokens}


async def _whole(request: Request, gen, limits: LineLimits, final):
    """The non-streamed answer (cancelled when the client goes away); a limit ends the generation early
    (:meth:`~ollapy.engine.request.Request.finish_early`: its slot freed at the next step, its figures kept)."""
    watcher = asyncio.get_running_loop().create_task(watch_disconnect(request, gen))
    text, stopped = [], False
    try:
        async for c in gen.chunks():
            if stopped or not c.text:
                continue
            piece, stopped = limits.feed(c.text, time.perf_counter())
            text.append(piece)
            if stopped:  # the engine ends the request at its next step, with its figures; later text is dropped
                gen.req.finish_early()
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return openai_err(exc)
    finally:
        watcher.cancel()
        gen.close()
    return JSONResponse(final("".join(text), None if stopped else gen.final))


def _infill_unsupported(name: str) -> OptionError:
    return OptionError(f"Infill is not supported by this model: {name} has no FIM tokens (prefix, suffix and middle)"
                       " and no template that reads suffix", hint="use a code model such as qwen2.5-coder")
