"""llama.cpp server's utility routes: ``POST /tokenize``, ``POST /detokenize``, ``POST /apply-template``.

Agents and front ends written for ``llama-server`` count tokens with these before they send. The bodies are
llama.cpp's (``tools/server/server-context.cpp`` and its README):

* ``/tokenize``: ``{"content": str | [str | id, ...], "add_special": false, "parse_special": true,
  "with_pieces": false}`` → ``{"tokens": [id, ...]}``, or with ``with_pieces`` ``{"tokens": [{"id", "piece"}]}``
  where ``piece`` is the token's text, or its bytes as a list of integers when they are not valid UTF-8 alone.
  A list ``content`` mixes texts and ids; only its first text gets the special tokens (``tokenize_mixed``).
* ``/detokenize``: ``{"tokens": [id, ...]}`` → ``{"content": str}`` (special tokens rendered).
* ``/apply-template``: an OpenAI chat body (``messages``, ``tools``...) → ``{"prompt": str}``: the text that
  ``/api/chat`` and ``/v1/chat/completions`` evaluate for it (the model's template, its SYSTEM and MESSAGE
  lines, tools as the chat would render them).

One ``llama-server`` serves one model; ollapy names it with the body's ``model`` (as llama-server's router mode
does), else uses the one loaded model. Errors are OpenAI's shape, as llama-server answers them.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ollapy.errors import OptionError, UsageError
from ollapy.server import generation
from ollapy.server.bodies import checked_model
from ollapy.server.http import openai_err, read_body, state_of
from ollapy.server.openai.bodies import ChatCompletionBody

router = APIRouter()

MODEL_HINT = 'name one: {"model": "NAME", ...} (ollapy serves several models; llama-server serves one)'


def model_name(state, body: dict) -> str:
    """The model a utility request means: its ``model`` field, else the only loaded model. Raises UsageError when
    neither names one."""
    if body.get("model") not in (None, ""):  # llama.vim sends "model": "" unless model_fim is set: no model named
        return checked_model(body.get("model"), hint=MODEL_HINT)
    loaded = list(state.runtime.models)
    if len(loaded) == 1:
        return loaded[0]
    raise UsageError("model is required" + (f": {len(loaded)} models are loaded" if loaded else ": no model is loaded"),
                     hint=MODEL_HINT)


def _flag(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise OptionError(f"{name} must be true or false, got {v!r}")
    return v


def _token_ids(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in value):
        raise OptionError(f"{field} must be a list of token ids (integers)")
    return value


def piece_json(piece: bytes) -> str | list[int]:
    """A token's piece as llama.cpp writes it: its text when the bytes are valid UTF-8, else the byte values."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


async def _with_model(state, name: str, fn, *args, **kwargs):
    """``fn(model, *args, **kwargs)`` on model ``name`` (loaded if needed, as a generation would load it), off
    the event loop."""
    rt = state.runtime
    ref = await rt.resolve(name)
    entry, _, _ = await rt.acquire(name, None, None, ref=ref)
    try:
        return await rt.call(entry, fn, entry.model, *args, **kwargs)
    finally:
        rt.release_nowait(entry)


def tokens_of(model, content: Any, add_special: bool, parse_special: bool) -> list[int]:
    """llama.cpp's ``tokenize_mixed``: a text, or a list of texts and ids where only the first text gets the
    special tokens. Raises OptionError for anything else."""
    parts = content if isinstance(content, list) else [content]
    tokens: list[int] = []
    first = True
    for p in parts:
        if isinstance(p, str):
            tokens += model.tokenize_text(p, add_special=add_special and first, parse_special=parse_special)
        elif isinstance(p, int) and not isinstance(p, bool):
            tokens.append(p)
        else:
            raise OptionError("content must be a string or a list of strings and token ids")
        first = False
    return tokens


@router.post("/tokenize")
async def tokenize(request: Request):
    st = state_of(request)
    try:
        body = await read_body(request)
        add_special, parse_special = _flag(body, "add_special", False), _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        if body.get("content") is None:  # llama-server answers an empty list
            return {"tokens": []}
        name = model_name(st, body)

        def run(model):
            tokens = tokens_of(model, body["content"], add_special, parse_special)
            return tokens, model.token_pieces(tokens) if with_pieces else None

        tokens, pieces = await _with_model(st, name, run)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return openai_err(exc)
    if pieces is None:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": piece_json(p)} for t, p in zip(tokens, pieces)]}


@router.post("/detokenize")
async def detokenize(request: Request):
    st = state_of(request)
    try:
        body = await read_body(request)
        if body.get("tokens") is None:
            return {"content": ""}
        tokens = _token_ids(body["tokens"], "tokens")
        name = model_name(st, body)
        pieces = await _with_model(st, name, lambda model: model.token_pieces(tokens))
    except Exception as exc:  # noqa: BLE001
        return openai_err(exc)
    return {"content": b"".join(pieces).decode("utf-8", "replace")}


@router.post("/apply-template")
async def apply_template(request: Request):
    st = state_of(request)
    try:
        raw = await read_body(request)
        name = model_name(st, raw)
        body = ChatCompletionBody.from_dict({**raw, "model": name})
        p = await generation.chat_prompt_of(st, name, messages=body.messages, tools=body.tools, tool_choice=body.choice,
                                            think=body.think_value)
    except Exception as exc:  # noqa: BLE001
        return openai_err(exc)
    return {"prompt": p.text}
