"""llama.cpp's samplers beyond Ollama's (issue 56): ``logit_bias`` on ``/v1``, DRY, XTC and top-n-sigma as options,
through the official ``openai`` and ``ollama`` clients against a live ``ollapy serve`` (SmolLM2, greedy unless a
seed is given); bad values are one-line 400s. Drafting with them on: tests/test_speculation.py."""
from __future__ import annotations

import httpx
import ollama
import openai
import pytest
from conftest import live_api

from ollapy.errors import OptionError, UsageError
from ollapy.options import parse_options, read_logit_bias
from ollapy.store.modelfile import format_modelfile, parse_modelfile

BANANA = [{"role": "user", "content": "Say the word banana ten times."}]


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    with live_api(tmp_path_factory.mktemp("sampling"), smollm2_path, {"smol": {}}) as api:
        yield api


def _chat(api, **kw) -> str:
    r = api.oai.chat.completions.create(model="smol", messages=BANANA, max_tokens=16, **kw)
    return r.choices[0].message.content


def _ollama(api, **options) -> str:
    options = {"num_predict": 30, "repeat_penalty": 1.0, **options}
    return api.oc.chat(model="smol", messages=BANANA, options=options)["message"]["content"]


def _token_id(api, piece: str) -> int:
    tokens = httpx.post(api.url + "/tokenize", json={"model": "smol", "content": piece}, timeout=60).json()["tokens"]
    assert len(tokens) == 1, (piece, tokens)  # the piece is one token: ban exactly it
    return tokens[0]


def test_logit_bias_minus_100_bans_the_greedy_first_token(api):
    plain = api.oai.chat.completions.create(model="smol", messages=BANANA, max_tokens=16, temperature=0,
                                            logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    tokens = [_token_id(api, first)]
    banned = _chat(api, temperature=0, logit_bias={str(tokens[0]): -100})
    assert not banned.startswith(first) and banned != plain.choices[0].message.content
    # llama-server's forms ban the same token: [id, false] pairs, and a text key (tokenized by the model)
    assert _chat(api, temperature=0, extra_body={"logit_bias": [[tokens[0], False]]}) == banned
    assert _chat(api, temperature=0, extra_body={"logit_bias": {first: -100}}) == banned
    # /v1/completions too
    plain = api.oai.completions.create(model="smol", prompt="Banana, banana,", max_tokens=6, temperature=0, logprobs=0)
    first = plain.choices[0].logprobs.tokens[0]
    after = api.oai.completions.create(model="smol", prompt="Banana, banana,", max_tokens=6, temperature=0, logprobs=0,
                                       logit_bias={str(_token_id(api, first)): -100}).choices[0]
    assert after.logprobs.tokens[0] != first and after.text != plain.choices[0].text


def test_dry_and_xtc_change_a_repetitive_answer_and_stay_deterministic(api):
    plain = _ollama(api, temperature=0)
    dry = _ollama(api, temperature=0, dry_multiplier=0.8)  # Ollama's options object
    assert dry != plain and plain.lower().count("banana") > dry.lower().count("banana")
    assert _ollama(api, temperature=0, dry_multiplier=0.8) == dry
    seeded = dict(temperature=0.7, seed=2)
    plain = _chat(api, **seeded)
    xtc = _chat(api, **seeded, extra_body={"xtc_probability": 1.0, "xtc_threshold": 0.1})  # top level, as llama-server
    assert xtc != plain
    assert _chat(api, **seeded, extra_body={"xtc_probability": 1.0, "xtc_threshold": 0.1}) == xtc
    both = {"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n"], "top_n_sigma": 1.5, "xtc_probability": 0.5}
    assert _chat(api, **seeded, extra_body=both) == _chat(api, **seeded, extra_body=both)


@pytest.mark.parametrize("body, message", [
    ({"xtc_probability": 2}, "option xtc_probability must be at most 1, got 2.0"),
    ({"dry_base": 0.5}, "option dry_base must be at least 1, got 0.5"),
    ({"dry_allowed_length": -1}, "option dry_allowed_length must be at least 0, got -1"),
    ({"dry_sequence_breakers": []}, "option dry_sequence_breakers must name at least one non-empty string"),
    ({"logit_bias": {"15": 101}}, "logit_bias value for 15 must be from -100 to 100, got 101"),
    ({"logit_bias": {"99999999": -100}}, "logit_bias token 99999999 is outside the vocabulary of this model "
                                         "(0 to 49151)"),
    ({"logit_bias": [[1, 2, 3]]}, "logit_bias entries must be [token, bias] pairs, got [1, 2, 3]"),
    ({"logit_bias": {str(i): 1 for i in range(4097)}}, "logit_bias has 4097 entries; at most 4096 are allowed"),
])
def test_bad_values_are_one_line_400s(api, body, message):
    with pytest.raises(openai.BadRequestError) as exc:
        _chat(api, temperature=0, extra_body=body)
    assert exc.value.status_code == 400 and exc.value.body["message"].startswith(message)
    assert "\n" not in exc.value.body["message"]


def test_bad_ollama_option_is_a_400(api):
    with pytest.raises(ollama.ResponseError) as exc:
        _ollama(api, xtc_threshold=-0.5)
    assert exc.value.status_code == 400 and "option xtc_threshold must not be negative, got -0.5" in exc.value.error


def test_modelfile_parameters_and_request_only_logit_bias():
    mf = parse_modelfile('FROM m\nPARAMETER dry_multiplier 0.8\nPARAMETER dry_sequence_breakers "\\n"\n'
                         'PARAMETER dry_sequence_breakers ":"\nPARAMETER top_n_sigma 1.5\n')
    assert mf.parameters == {"dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", ":"], "top_n_sigma": 1.5}
    again = parse_modelfile(format_modelfile("m", mf.parameters, None, None, None, []))
    assert again.parameters == mf.parameters
    with pytest.raises(UsageError, match="Modelfile line 2: logit_bias must be an object"):
        parse_modelfile("FROM m\nPARAMETER logit_bias 15\n")
    assert parse_options(["dry_sequence_breakers=a", "dry_sequence_breakers=b"]) == {"dry_sequence_breakers": ("a", "b")}
    assert read_logit_bias({"15": -100, "x": 2, "7": False}) == ((15, float("-inf")), ("x", 2.0), (7, float("-inf")))
    with pytest.raises(OptionError):
        read_logit_bias({"-3": 1})


def test_logit_bias_given_as_text_is_read_as_json():
    """``-o logit_bias={...}`` (the CLI's option values are text) reads as the JSON it holds; bad text is one line."""
    assert read_logit_bias('{"1": -100, "Hello": 5}') == read_logit_bias({"1": -100, "Hello": 5})
    assert read_logit_bias('{"1": -100}')[0][0] == 1
    for bad in ("xx", '"1"'):
        with pytest.raises(OptionError):
            read_logit_bias(bad)
