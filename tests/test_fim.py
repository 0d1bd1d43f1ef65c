"""Code completion (fill-in-the-middle) through ``ollapy serve``, on the real Qwen2.5-Coder-0.5B (FIM and repository
tokens), with the official ``ollama`` and ``openai`` clients and raw ``/infill`` as llama.vscode posts it.

Each layout is checked against the same tokens sent verbatim (``raw``), so a test fails when the prompt is laid out
differently from llama-server's ``format_prompt_infill`` / Ollama's registry template for the model. The model runs
in a runner child (``serve``'s default), so ``fim_prompt`` and the model's FIM facts cross the process boundary.
"""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from conftest import live_api

GREEDY = {"temperature": 0, "num_predict": 12}
PRE = "import math\n\n\ndef circle_area(r):\n    return "
SUF = "\n\n\nprint(circle_area(2.0))\n"
FIM = "<|fim_prefix|>{pre}<|fim_suffix|>{suf}<|fim_middle|>"
# a file of ~170 tokens, with the cursor typing on the line after `def mean(values):`
FILE_HEAD = '''"""Small statistics helpers."""
from __future__ import annotations

import math
from collections.abc import Sequence


def total(values: Sequence[float]) -> float:
    """The sum of the values."""
    out = 0.0
    for v in values:
        out += v
    return out


def stdev(values: Sequence[float]) -> float:
    """The population standard deviation of the values."""
    m = mean(values)
    return math.sqrt(total([(v - m) ** 2 for v in values]) / len(values))


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of the values."""
'''
FILE_TAIL = "\n\n\nif __name__ == \"__main__\":\n    print(mean([1.0, 2.0, 3.0]), stdev([1.0, 2.0, 3.0]))\n"
TYPED = ["    ", "    return ", "    return total(", "    return total(values) / "]
EXTRA = [{"filename": "util/io.py",
          "text": "def read_numbers(path):\n    with open(path) as f:\n        return [float(x) for x in f]\n"}]
# a registry-style Go template with .Suffix (Ollama's qwen2.5-coder template has this shape), on SmolLM2
SUFFIX_TEMPLATE = ("{{- if .Suffix }}<|im_start|>fim\n{{ .Prompt }}<|im_end|>\n<|im_start|>after\n{{ .Suffix }}<|im_end|>\n"
                   "<|im_start|>assistant\n{{- else }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"
                   "{{ end }}")


@pytest.fixture(scope="module")
def api(tmp_path_factory, qwen_coder_path):
    with live_api(tmp_path_factory.mktemp("fim"), qwen_coder_path, {"coder": {}}) as api:
        yield api


def _infill(api, **body) -> httpx.Response:
    return httpx.post(api.url + "/infill", json={"model": "coder", **body}, timeout=600)


def _raw(api, prompt: str, n: int = 12) -> dict:
    r = httpx.post(api.url + "/api/generate", json={"model": "coder", "prompt": prompt, "raw": True, "stream": False,
                                                    "options": {"temperature": 0, "num_predict": n}}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _tokenize(api, text: str) -> list[int]:
    return httpx.post(api.url + "/tokenize", json={"model": "coder", "content": text}, timeout=60).json()["tokens"]


def _ps(api, since: float | None = None) -> dict:
    """The model's /api/ps row; with ``since`` (a ``time.monotonic()``), one whose figures were taken after it (a
    runner child refreshes them every second)."""
    api.oc.generate(model="coder", prompt="")  # loaded (an empty prompt only loads)
    while True:
        t = time.monotonic()
        row = next(m for m in httpx.get(api.url + "/api/ps", timeout=30).json()["models"] if m["name"] == "coder:latest")
        if since is None or row["stats_age_s"] < t - since:
            return row
        time.sleep(0.2)


def test_generate_suffix_is_the_fim_layout_streamed_or_not(api):
    """Continue's request: ``/api/generate`` with ``prompt`` (the whole prefix) and ``suffix``: the same answer as
    the FIM tokens sent raw, streamed or not; ``system`` is not used with a suffix, ``raw`` ignores it (as in
    Ollama)."""
    r = api.oc.generate(model="coder", prompt=PRE, suffix=SUF, options=GREEDY)
    want = _raw(api, FIM.format(pre=PRE, suf=SUF))
    assert r.response == want["response"] and "pi" in r.response, r.response
    assert r.prompt_eval_count == want["prompt_eval_count"]  # every prompt token, reused or not
    assert r.context and r.done_reason in ("stop", "length")
    parts = list(api.oc.generate(model="coder", prompt=PRE, suffix=SUF, options=GREEDY, stream=True,
                                 system="Answer in French."))
    assert "".join(p.response for p in parts) == r.response and parts[-1].done
    # raw: the prompt is sent as it is and the suffix unused (Ollama's GenerateHandler), no context returned
    fim_text = FIM.format(pre=PRE, suf=SUF)
    raw = api.oc.generate(model="coder", prompt=fim_text, suffix="ignored", raw=True, options=GREEDY)
    assert raw.response == r.response and raw.prompt_eval_count == r.prompt_eval_count and not raw.context


def test_openai_completions_suffix(api):
    """``/v1/completions`` with ``suffix`` was silently a prefix-only completion; now it is the FIM prompt (its
    prompt tokens are the FIM prompt's, not the prefix's), streamed or not."""
    c = api.oai.completions.create(model="coder", prompt=PRE, suffix=SUF, max_tokens=12, temperature=0)
    want = _raw(api, FIM.format(pre=PRE, suf=SUF))
    assert c.choices[0].text == want["response"]
    prefix_only = api.oai.completions.create(model="coder", prompt=PRE, max_tokens=1, temperature=0)
    assert c.usage.prompt_tokens == want["prompt_eval_count"] > prefix_only.usage.prompt_tokens + len(SUF) // 4
    chunks = api.oai.completions.create(model="coder", prompt=PRE, suffix=SUF, max_tokens=12, temperature=0,
                                        stream=True)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want["response"]


def test_infill_layout_fields_and_stream(api):
    """llama.vscode's ``/infill``: repository context from ``input_extra``, ``prompt`` at the prefix's end (the
    default layout, llama-server's) or after ``FIM_MID`` (``moved-line``), ``n_predict``; llama-server's response
    fields; ``response_fields``; the SSE stream."""
    head = FILE_HEAD + TYPED[1]
    body = {"input_prefix": FILE_HEAD, "input_suffix": FILE_TAIL, "input_extra": EXTRA, "prompt": TYPED[1],
            "n_predict": 8, "temperature": 0, "samplers": ["top_k", "top_p", "temperature"]}
    r = _infill(api, **body)
    assert r.status_code == 200, r.text
    out = r.json()
    extra = "".join(f"<|file_sep|>{c['filename']}\n{c['text']}" for c in EXTRA)
    want = _raw(api, f"<|repo_name|>myproject\n{extra}<|file_sep|>filename\n"
                     f"<|fim_prefix|>{head}<|fim_suffix|>{FILE_TAIL}<|fim_middle|>", n=8)
    assert out["content"] == want["response"] and head
    assert out["stop"] is True and out["model"] == "coder"
    n = out["timings"]["predicted_n"]
    assert out["stop_type"] == ("limit" if n == 8 else "eos") and out["stopped_eos"] == (n < 8)  # EOG or n_predict
    assert n == out["tokens_predicted"] == len(_tokenize(api, out["content"]))
    assert out["tokens_evaluated"] == out["timings"]["prompt_n"] + out["timings"]["cache_n"] > 150
    assert out["tokens_cached"] == out["tokens_evaluated"] + n and out["timings"]["prompt_ms"] > 0
    assert out["timings"]["predicted_ms"] > 0 and out["truncated"] is False
    two = _infill(api, **{**body, "n_predict": 2}).json()
    assert two["timings"]["predicted_n"] == 2 and two["stop_type"] == "limit" and two["stopped_limit"]
    # moved-line is another prompt: the typed text after FIM_MID
    moved = _infill(api, **body, options={"fim_layout": "moved-line"}).json()
    want_moved = _raw(api, f"<|repo_name|>myproject\n{extra}<|file_sep|>filename\n"
                           f"<|fim_prefix|>{FILE_HEAD}<|fim_suffix|>{FILE_TAIL}<|fim_middle|>{TYPED[1]}", n=8)
    assert moved["content"] == want_moved["response"]
    cut = _infill(api, **body, response_fields=["content", "timings/predicted_n", "nope/x"]).json()
    assert cut == {"content": out["content"], "timings/predicted_n": n}
    with httpx.stream("POST", api.url + "/infill", json={"model": "coder", **body, "stream": True}, timeout=600) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert not any(e == "[DONE]" for e in events) and events[-1]["stop"] is True
    assert all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events) == out["content"]


def test_infill_n_indent_and_t_max_predict_ms_end_at_a_line(api):
    """llama-server's line limits: ``n_indent`` cuts the answer at the first line indented less (the function's
    end), ``t_max_predict_ms`` at the first new line once its time is up; both are prefixes of the whole answer."""
    body = {"input_prefix": "def clamp(x, lo, hi):\n", "input_suffix": "\n", "prompt": "    if x < lo:",
            "n_predict": 48, "temperature": 0}
    full = _infill(api, **body).json()["content"]
    lines = full.split("\n")
    assert len(lines) > 3 and any(line and not line.startswith("    ") for line in lines[1:]), full
    cut = _infill(api, **body, n_indent=4).json()
    assert cut["stop_type"] == "limit" and full.startswith(cut["content"]) and len(cut["content"]) < len(full)
    assert cut["timings"]["predicted_n"] >= len(_tokenize(api, cut["content"])) and cut["tokens_evaluated"] > 5
    with httpx.stream("POST", api.url + "/infill", json={"model": "coder", **body, "n_indent": 4, "stream": True},
                      timeout=600) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == cut["content"] and events[-1]["stop_type"] == "limit"
    assert all(not line.strip() or line.startswith("    ") for line in cut["content"].split("\n")[1:]), cut
    timed = _infill(api, **body, t_max_predict_ms=1).json()
    assert timed["content"] == full[:full.index("\n") + 1] and timed["stop_type"] == "limit"


def test_infill_bad_bodies_are_llama_server_errors(api):
    for body, words in (({"input_suffix": ""}, '"input_prefix" is required'),
                        ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]},
                         'must contain a "text" field'),
                        ({"input_prefix": 1, "input_suffix": ""}, "must be a string"),
                        ({"input_prefix": "", "input_suffix": "", "samplers": 3}, "samplers"),
                        ({"input_prefix": "", "input_suffix": "", "options": {"fim_layout": "up"}}, "fim_layout")):
        r = _infill(api, **body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_keystrokes_answer_as_cold_and_write_the_file_once(api):
    """A keystroke trace over one file (llama.vscode's shape): every answer equals the same request cold (slot
    emptied by another prompt, prompt cache off) and restored from the prompt cache; the cache writes the file's
    stable part once, not a state per keystroke (bytes written at most 1.5x the file's KV)."""
    before = _ps(api, since=time.monotonic())["prompt_cache"] or {}
    base = {"input_prefix": FILE_HEAD, "input_suffix": FILE_TAIL, "n_predict": 6, "temperature": 0}
    warm = [_infill(api, **base, prompt=t).json() for t in TYPED]
    assert all(w["timings"]["cache_n"] > 120 for w in warm[1:]), [w["timings"] for w in warm]  # the file above the line
    stats = _ps(api, since=time.monotonic())
    cache = stats["prompt_cache"]
    written = cache["bytes_written"] - before.get("bytes_written", 0)
    stable_kv = stats["kv_bytes_per_token"] * (warm[0]["tokens_evaluated"] - 2)
    assert 0 < written <= 1.5 * stable_kv, (written, stable_kv)
    assert cache["stores"] - before.get("stores", 0) == 1, cache
    for t, w in zip(TYPED[1:3], warm[1:3]):
        _raw(api, "Hello", n=1)  # the slot now holds another prompt
        restored = _infill(api, **base, prompt=t).json()
        _raw(api, "Hello", n=1)
        cold = _infill(api, **base, prompt=t, cache_prompt=False).json()
        assert cold["timings"]["cache_n"] == 0 and restored["timings"]["cache_n"] > 120
        assert w["content"] == restored["content"] == cold["content"], (t, w["content"], cold["content"])


def test_a_cancelled_completion_frees_its_slot(api):
    """An editor drops the connection when the user types on (streamed, and not streamed): the next request is
    answered at once, not after the abandoned one's 900 tokens, and the slot is free again."""
    long = {"input_prefix": "# count to a thousand\n", "input_suffix": "", "prompt": "1, 2, 3, ", "n_predict": 900,
            "temperature": 0}
    with httpx.stream("POST", api.url + "/infill", json={"model": "coder", **long, "stream": True}, timeout=600) as s:
        next(line for line in s.iter_lines() if line.startswith("data: "))
    t0 = time.perf_counter()
    r = _infill(api, input_prefix=PRE, input_suffix=SUF, n_predict=4, temperature=0)
    assert r.status_code == 200 and r.json()["timings"]["predicted_n"] == 4
    first = time.perf_counter() - t0
    done = threading.Event()

    def abandon():  # not streamed: the client gives up (a timeout closes the connection)
        try:
            httpx.post(api.url + "/infill", json={"model": "coder", **long}, timeout=2.0)
        except httpx.TimeoutException:
            pass
        done.set()

    threading.Thread(target=abandon, daemon=True).start()
    assert done.wait(60)
    t0 = time.perf_counter()
    r = _infill(api, input_prefix=PRE, input_suffix=SUF, n_predict=4, temperature=0)
    assert r.status_code == 200
    assert time.perf_counter() - t0 < 30 and first < 30  # 900 tokens of the abandoned ones take minutes here
    deadline = time.monotonic() + 10
    while _ps(api)["slots_busy"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ps(api)["slots_busy"] == 0


def test_a_go_template_with_suffix_renders_it(tmp_path, smollm2_path):
    """A model without FIM tokens whose TEMPLATE (an Ollama registry Go template) uses ``.Suffix``: Ollama's
    ``insert`` capability; the suffix request renders the template's ``.Suffix`` branch with ``.Prompt``."""
    with live_api(tmp_path, smollm2_path, {"smol-fim": {"template": SUFFIX_TEMPLATE}}) as smol:
        r = smol.oc.generate(model="smol-fim", prompt="def add(a, b):", suffix="print(add(1, 2))",
                             options={"temperature": 0, "num_predict": 8})
        text = ("<|im_start|>fim\ndef add(a, b):<|im_end|>\n<|im_start|>after\nprint(add(1, 2))<|im_end|>\n"
                "<|im_start|>assistant")
        raw = smol.oc.generate(model="smol-fim", prompt=text, raw=True, options={"temperature": 0, "num_predict": 8})
        assert r.response == raw.response and r.prompt_eval_count == raw.prompt_eval_count
        plain = smol.oc.generate(model="smol-fim", prompt="def add(a, b):", options={"temperature": 0,
                                                                                      "num_predict": 8})
        assert plain.prompt_eval_count != r.prompt_eval_count  # without a suffix: the other branch


def test_show_tells_continue_the_model_fills_in_the_middle(api):
    """Continue sends ``suffix`` only when ``/api/show``'s template names ``.Suffix`` (core/llm/llms/Ollama.ts);
    a model with FIM tokens says so, with Ollama's ``insert`` capability."""
    shown = httpx.post(api.url + "/api/show", json={"model": "coder"}).json()
    assert ".Suffix" in shown["template"] and "insert" in shown["capabilities"]
    assert shown["capabilities"].index("insert") > shown["capabilities"].index("completion")
