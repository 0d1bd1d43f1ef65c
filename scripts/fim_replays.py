#!/usr/bin/env python
"""Replay exactly what editor code-completion clients send, and read the answer as each client reads it.

Used by ``scripts/check_clients.sh`` (group ``fim``); the request bodies were read from the clients' sources:

* Continue, Ollama provider (``core/llm/llms/Ollama.ts``; ``core/autocomplete``): ``POST /api/show``
  ``{"name"}`` first (``ensureModelInfo``: FIM is used only when the answer's ``template`` contains ``.Suffix``;
  ``parameters`` lines are read with ``^(\\S+)\\s+((?:".*")|\\S+)$``). Until then, and for a model without
  ``.Suffix``, autocomplete sends the prompt rendered by its own Qwen template with ``raw: true``
  (``streamComplete``); with ``.Suffix``, ``prompt`` = prefix and ``suffix`` (``_streamFim``); when it has
  snippets (recently edited files...), the prefix carries Qwen's ``<|repo_name|>``/``<|file_sep|>`` text
  (``qwenMultifileFimTemplate``). Options: ``temperature`` 0.01 (autocomplete's default), ``num_predict``
  4096 (its ``DEFAULT_MAX_TOKENS``), ``stop`` (the Qwen list plus its common ones), ``num_ctx`` 8192;
  ``keep_alive`` 1800; ``stream`` and ``raw`` left out when undefined (JSON.stringify drops them). The answer
  is read as NDJSON, each line's ``response`` (or ``error``); the client aborts once its filters have a line.
* llama.vscode (``src/llama-server.ts``, ``createRequestPayload``; ``src/completion.ts``): the ring-buffer update
  (``n_predict`` 0, ``samplers`` []) and the completion (``input_extra`` chunks ``{text, time, filename}``,
  ``prompt`` the line typed so far, ``n_predict`` 128, ``n_cmpl`` 3, ``top_k`` 40, ``top_p`` 0.99, ``samplers``
  ``["top_k", "top_p", "infill"]``, ``cache_prompt``, ``n_indent``, ``t_max_prompt_ms`` 500,
  ``t_max_predict_ms`` 500, ``stream`` false, and ``model``: its ``llama-vscode.ai_model`` setting, by default
  ``google/gemini-2.5-flash``, which llama-server ignores). The answer: an object with ``content`` (or a list of
  them, one per completion), ``tokens_cached``, ``generation_settings``, ``timings``.
* llama.vim (``autoload/llama.vim``): the same two requests with its fields (``top_p`` 0.90, ``temperature`` 0
  on the update, ``stop`` [], ``t_max_predict_ms`` 250 on a first request, ``response_fields``), always with
  ``"model": ""`` and ``Authorization: Bearer`` (an empty key) by default (its ``exists(...) && len("...")`` tests are always
  true). The answer: flat keys (``content``, ``timings/prompt_n``, ``tokens_cached``...), as llama-server's
  ``response_fields`` gives them.

    python scripts/fim_replays.py URL MODEL continue|llama.vscode|llama.vim

Prints what the client would show and exits 0, or prints why not and exits 1.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fim_cases import CASES  # noqa: E402

CASE = next(c for c in CASES if c.name == "py-stack-push")
OTHER = next(c for c in CASES if c.name == "py-load-json")  # another "file" for repository context
QWEN_STOP = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
             "<|file_sep|>", "<|im_start|>", "<|im_end|>"]
CONTINUE_STOP = QWEN_STOP + ["/src/", "#- coding: utf-8", "```"]  # getStopTokens' common stops
PARAM_LINE = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')


class Failed(Exception):
    pass


def need(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


def lines_around() -> tuple[list[str], str, str]:
    """The case's file as an editor sees it: lines before the cursor's line, the line's text before and after
    the cursor."""
    before, after = CASE.before, CASE.after
    cut = before.rfind("\n") + 1
    return before[:cut].split("\n")[:-1], before[cut:], after.split("\n", 1)[0]


def suffix_lines() -> list[str]:
    return CASE.after.split("\n")[1:]


# ---- Continue --------------------------------------------------------------------------------------------
def continue_stream(http: httpx.Client, body: dict) -> tuple[str, dict | None]:
    """Continue's reading of ``/api/generate``: split on new lines, JSON-parse each, yield ``response``, throw on
    ``error``; it stops reading (aborts) once a first line is complete."""
    text, last = "", None
    with http.stream("POST", "/api/generate", json=body) as r:
        if r.status_code != 200:
            raise Failed(f"/api/generate: HTTP {r.status_code}: {r.read()[:200]!r}")
        buf = ""
        for chunk in r.iter_text():
            buf += chunk
            *lines, buf = buf.split("\n")
            for line in lines:
                if not line.strip():
                    continue
                j = json.loads(line)
                need("error" not in j, f"error line: {j.get('error')}")
                need(isinstance(j.get("response"), str), f"a line without response: {line[:200]}")
                text += j["response"]
                last = j
            if "\n" in text.lstrip("\n") or (last and last.get("done")):
                break
    return text, last


def replay_continue(url: str, model: str) -> str:
    http = httpx.Client(base_url=url, timeout=600, headers={"Content-Type": "application/json"})
    r = http.post("/api/show", json={"name": model})
    need(r.status_code == 200, f"/api/show: HTTP {r.status_code}: {r.text[:200]}")
    show = r.json()
    for line in (show.get("parameters") or "").split("\n"):
        m = PARAM_LINE.match(line)
        if m and m.group(1) == "stop":
            json.loads(m.group(2))  # Continue JSON-parses each stop value (a warning when it cannot)
    fim = ".Suffix" in (show.get("template") or "")
    opts = {"temperature": 0.01, "num_predict": 4096, "stop": CONTINUE_STOP, "num_ctx": 8192}
    prefix, suffix = CASE.before, CASE.after
    out = []
    # the first request, before /api/show's answer is in (and every request for a model without .Suffix): raw
    raw = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    text, last = continue_stream(http, {"model": model, "prompt": raw, "raw": True, "options": opts,
                                        "keep_alive": 1800})
    need(CASE.passes(text), f"raw FIM prompt: unexpected completion {text!r}")
    out.append(f"raw {text.strip()!r}")
    # _streamFim, no snippets (replayed even when /api/show keeps Continue from sending it, to show the route)
    text, last = continue_stream(http, {"model": model, "prompt": prefix, "suffix": suffix, "options": opts,
                                        "keep_alive": 1800})
    need(CASE.passes(text), f"suffix: unexpected completion {text!r}")
    out.append(f"suffix {text.strip()!r}")
    # _streamFim with a snippet: qwenMultifileFimTemplate's compiled prefix
    snippet = OTHER.source.replace("█", "json.load(f)")
    multi = (f"<|repo_name|>project\n<|file_sep|>config.py\n{snippet}\n<|file_sep|>stack.py"
             f"<|system_separator_istruction_repository_level|>{prefix}")
    text, last = continue_stream(http, {"model": model, "prompt": multi, "suffix": suffix, "options": opts,
                                        "keep_alive": 1800})
    need(isinstance(text, str), "no text")
    out.append(f"suffix+snippets {text.strip()!r}")
    if not fim:
        raise Failed("/api/show's template has no .Suffix, so Continue never sends suffix, only raw prompts "
                     f"rendered by its own template (replayed anyway: {'; '.join(out)})")
    return "Continue (template has .Suffix): " + "; ".join(out)


# ---- llama.vscode ----------------------------------------------------------------------------------------
def vscode_chunks() -> list[dict]:
    return [{"text": OTHER.source.replace("█", "json.load(f)"), "time": int(time.time() * 1000),
             "filename": "/home/user/project/config.py"}]


def replay_vscode(url: str, model: str) -> str:
    """llama.vscode with ``llama-vscode.ai_model`` set to ``model`` (sent as ``model`` unless empty)."""
    http = httpx.Client(base_url=url, timeout=600)
    chunks = vscode_chunks()
    prep = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "", "n_predict": 0,
            "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
    if model.strip():
        prep["model"] = model
    r = http.post("/infill", json=prep)
    need(r.status_code == 200, f"ring-buffer update: HTTP {r.status_code}: {r.text[:200]}")
    prefix_lines, line_prefix, line_suffix = lines_around()
    prompt = "" if not line_prefix.strip(" \t") else line_prefix
    nindent = len(line_prefix) - len(line_prefix.lstrip())
    body = {"id_slot": 0, "input_prefix": "\n".join(prefix_lines[-256:]) + "\n",
            "input_suffix": line_suffix + "\n" + "\n".join(suffix_lines()[:64]) + "\n", "input_extra": chunks,
            "prompt": prompt, "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 500}
    if nindent:
        body["n_indent"] = nindent
    if model.strip():
        body["model"] = model
    r = http.post("/infill", json=body)
    need(r.status_code == 200, f"/infill: HTTP {r.status_code}: {r.text[:200]}")
    data = r.json()
    # getComplFromContent: {"content"} or a list of them
    compl = [data.get("content") or ""] if isinstance(data, dict) and "content" in data else \
        [c.get("content") or "" for c in data] if isinstance(data, list) else None
    need(compl is not None and all(isinstance(c, str) for c in compl), f"no content: {str(data)[:200]}")
    first = data if isinstance(data, dict) else data[0]
    t = first.get("timings") or {}
    need(isinstance(first.get("tokens_cached"), int) and isinstance(first.get("generation_settings"), dict),
         "tokens_cached / generation_settings missing (the status bar reads them)")
    for k in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"):
        need(isinstance(t.get(k), (int, float)), f"timings.{k} missing")
    # sampled (top_k 40, top_p 0.99 at the server's default temperature): the text is shown, not judged
    return (f"llama.vscode: {len(compl)} completion(s) {compl[0].splitlines()[0] if compl[0] else ''!r}; "
            f"prompt_n {t['prompt_n']}, tokens_cached {first['tokens_cached']}")


# ---- llama.vim -------------------------------------------------------------------------------------------
def replay_vim(url: str, model: str) -> str:
    """llama.vim with ``g:llama_config.model_fim`` set to ``model`` (its default, "", is sent as ``"model": ""``:
    ``model`` "" replays that)."""
    # curl sends its "Authorization: Bearer " header; the value's trailing space is not part of it (RFC 9110 OWS)
    http = httpx.Client(base_url=url, timeout=600, headers={"Content-Type": "application/json",
                                                             "Authorization": "Bearer"})
    chunks = [{"text": OTHER.source.replace("█", "json.load(f)"), "time": time.time(), "filename": "config.py"}]
    prep = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "", "n_predict": 0,
            "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 1,
            "t_max_predict_ms": 1, "response_fields": [""], "model": model}
    r = http.post("/infill", json=prep)
    need(r.status_code == 200, f"ring-buffer update: HTTP {r.status_code}: {r.text[:200]}")
    prefix_lines, line_prefix, line_suffix = lines_around()
    indent = 0 if not line_prefix.strip() and not line_suffix.strip() else len(line_prefix) - len(line_prefix.lstrip())
    fields = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
    body = {"id_slot": 0, "input_prefix": "\n".join(prefix_lines[-256:]) + "\n", "input_suffix":
            line_suffix + "\n" + "\n".join(suffix_lines()[:64]) + "\n", "input_extra": chunks, "prompt": line_prefix,
            "n_predict": 128, "stop": [], "n_indent": indent, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 250, "response_fields": fields, "model": model}
    r = http.post("/infill", json=body)
    need(r.status_code == 200, f"/infill: HTTP {r.status_code}: {r.text[:200]}")
    d = r.json()
    need(isinstance(d.get("content"), str), f"no content: {str(d)[:200]}")
    for k in ("timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_second", "timings/predicted_n",
              "timings/predicted_ms", "timings/predicted_per_second"):
        need(k in d, f"flat key {k} missing (llama.vim reads response_fields as flat keys)")
    need("timings" not in d, "an unrequested nested timings object")
    return (f"llama.vim: {d['content'].splitlines()[0] if d['content'] else ''!r}; timings/prompt_n "
            f"{d['timings/prompt_n']}, tokens_cached {d.get('tokens_cached')}")


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[-2].strip(), file=sys.stderr)
        return 2
    url, model, which = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    fn = {"continue": replay_continue, "llama.vscode": replay_vscode, "llama.vim": replay_vim}[which]
    try:
        print(fn(url, model))
    except Failed as e:
        print(f"{which}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
