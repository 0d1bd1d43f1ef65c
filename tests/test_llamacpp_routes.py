"""llama.cpp server's utility routes (``/tokenize``, ``/detokenize``, ``/apply-template``) through ``ollapy serve``,
checked against llama.cpp's own tokenizer (llama-cpp-python's ``Llama`` with ``vocab_only``, which calls the same
``llama_tokenize`` / ``llama_token_to_piece`` that llama-server does) and the chat template rendered by jinja2 from
the GGUF, as llama-server renders it."""
from __future__ import annotations

import httpx
import pytest
from conftest import live_api

TEXTS = [
    "Hello world!",
    "  leading spaces, tabs\tand\nnew lines  ",
    "héllo wörld, naïve café: 日本語のテキスト 🦙🚀",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # comment",
]


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    with live_api(tmp_path_factory.mktemp("llamacpp"), smollm2_path, {"smol": {}}) as api:
        yield api


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    from llama_cpp import Llama

    return Llama(str(smollm2_path), vocab_only=True, verbose=False)


def _post(api, route: str, body: dict) -> httpx.Response:
    return httpx.post(api.url + route, json=body, timeout=300)


def _piece_bytes(piece) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)


def test_tokenize_equals_llama_cpp(api, vocab):
    for text in TEXTS:
        for add_special in (False, True):
            for parse_special in (False, True):
                r = _post(api, "/tokenize", {"model": "smol", "content": text, "add_special": add_special,
                                             "parse_special": parse_special})
                assert r.status_code == 200, r.text
                want = vocab.tokenize(text.encode(), add_bos=add_special, special=parse_special)
                assert r.json() == {"tokens": want}, (text, add_special, parse_special)
    # llama-server's defaults: add_special false, parse_special true; the only loaded model when none is named
    r = _post(api, "/tokenize", {"content": TEXTS[3]})
    assert r.json()["tokens"] == vocab.tokenize(TEXTS[3].encode(), add_bos=False, special=True)
    assert vocab.token_eos() in r.json()["tokens"] or 2 in r.json()["tokens"]  # <|im_end|> read as one token


def test_with_pieces_concatenate_back_to_the_text(api, vocab):
    for text in TEXTS:
        r = _post(api, "/tokenize", {"model": "smol", "content": text, "with_pieces": True})
        assert r.status_code == 200, r.text
        items = r.json()["tokens"]
        assert [t["id"] for t in items] == vocab.tokenize(text.encode(), add_bos=False, special=True)
        assert b"".join(_piece_bytes(t["piece"]) for t in items) == text.encode()
        for t in items:  # each piece as llama.cpp renders it; text when it is valid UTF-8 alone, else its bytes
            raw = vocab.detokenize([t["id"]], special=True)
            assert _piece_bytes(t["piece"]) == raw
            try:
                assert t["piece"] == raw.decode("utf-8")
            except UnicodeDecodeError:
                assert t["piece"] == list(raw)
    # the emoji is split into byte tokens on this vocabulary: some piece is a list of bytes
    items = _post(api, "/tokenize", {"model": "smol", "content": "🦙", "with_pieces": True}).json()["tokens"]
    assert any(isinstance(t["piece"], list) for t in items) or len(items) == 1


def test_mixed_content_gets_special_tokens_on_its_first_text_only(api, vocab):
    hello = vocab.tokenize(b"Hello", add_bos=False, special=True)
    r = _post(api, "/tokenize", {"model": "smol", "content": ["Hello", 42, "Hello"], "add_special": True})
    assert r.json()["tokens"] == vocab.tokenize(b"Hello", add_bos=True, special=True) + [42] + hello


def test_detokenize_round_trips(api, vocab):
    for text in TEXTS:
        tokens = vocab.tokenize(text.encode(), add_bos=False, special=True)
        r = _post(api, "/detokenize", {"model": "smol", "tokens": tokens})
        assert r.status_code == 200, r.text
        assert r.json() == {"content": vocab.detokenize(tokens, special=True).decode()} == {"content": text}
    assert _post(api, "/detokenize", {"model": "smol", "tokens": []}).json() == {"content": ""}


def test_bad_input_is_a_400_in_openai_shape(api):
    r = _post(api, "/detokenize", {"model": "smol", "tokens": [1, 10 ** 7]})
    assert r.status_code == 400
    assert "is not an id of this model's vocabulary" in r.json()["error"]["message"]
    r = _post(api, "/detokenize", {"model": "smol", "tokens": "12"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tokens must be a list of token ids")
    r = _post(api, "/tokenize", {"model": "smol", "content": "x", "with_pieces": "yes"})
    assert r.status_code == 400 and "with_pieces must be true or false" in r.json()["error"]["message"]
    r = _post(api, "/tokenize", {"model": "nope", "content": "x"})
    assert r.status_code == 404


def _jinja_prompt(gguf_path, messages) -> str:
    """The GGUF's chat template rendered by jinja2 as llama-server's minja renders it (add_generation_prompt)."""
    import gguf
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")


def test_apply_template_is_the_prompt_chat_evaluates(api, smollm2_path, vocab):
    chats = [
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}],
        [{"role": "system", "content": [{"type": "text", "text": "Parts "}, {"type": "text", "text": "joined."}]},
         {"role": "user", "content": "héllo 🦙"}],
    ]
    for messages in chats:
        r = _post(api, "/apply-template", {"model": "smol", "messages": messages})
        assert r.status_code == 200, r.text
        prompt = r.json()["prompt"]
        flat = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 "".join(p["text"] for p in m["content"])} for m in messages]
        assert prompt == _jinja_prompt(smollm2_path, flat)
        # as many tokens as /api/chat's prompt has (its prompt_eval_count counts cached tokens too)
        body = {"model": "smol", "messages": flat, "stream": False, "options": {"num_predict": 1, "temperature": 0}}
        chat = httpx.post(api.url + "/api/chat", json=body, timeout=300).json()
        tokens = _post(api, "/tokenize", {"model": "smol", "content": prompt, "add_special": True}).json()["tokens"]
        assert chat["prompt_eval_count"] == len(tokens)
    r = _post(api, "/apply-template", {"model": "smol"})
    assert r.status_code == 400


def test_a_suffix_on_a_model_without_fim_gets_ollamas_error(api):
    """Continue's autocomplete sends /api/generate with ``suffix``; SmolLM2 has no FIM tokens and its template
    renders no suffix, so the answer is Ollama's 400 (an unknown model stays a 404), and llama.vscode's /infill
    gets llama-server's words."""
    import ollama

    api.oc.generate(model="smol", keep_alive=0)  # unloaded: the refusal must come from the header, not a load
    with pytest.raises(ollama.ResponseError) as e:
        api.oc.generate(model="smol", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n")
    assert e.value.status_code == 400 and e.value.error.startswith('"smol" does not support insert (send it without ')
    assert api.oc.ps().models == []  # as Ollama: refused from the metadata, nothing loaded (or evicted) for it
    r = _post(api, "/infill", {"model": "smol", "input_prefix": "def add(a, b):\n", "input_suffix": ""})
    assert r.status_code == 400 and "Infill is not supported by this model" in r.json()["error"]["message"]
    with pytest.raises(ollama.ResponseError) as e:
        api.oc.generate(model="nope", prompt="x", suffix="y")
    assert e.value.status_code == 404
    assert api.oc.generate(model="smol", prompt="Hi", suffix="", options={"num_predict": 2}).done
