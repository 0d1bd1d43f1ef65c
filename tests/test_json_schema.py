"""Schema-constrained output (Ollama's ``format`` with a JSON schema): every answer that ends with
``done_reason == "stop"`` parses with ``json.loads`` and validates against its schema (``jsonschema``).

Sampling is seeded and not greedy (temperature 0.8), so the model explores strings where a raw newline or
tab would be likely without the grammar's JSON ``char`` rule."""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ollapy.engine.backend.templating import json_schema_grammar
from ollapy.engine.model import LoadedModel
from ollapy.options import Options

QUESTION = "Capital of France?"


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with LoadedModel(smollm2_path, Options(num_ctx=1024, num_parallel=1)) as m:
        yield m


def _answer(m: LoadedModel, schema: dict, seed: int, question: str = QUESTION, num_predict: int = 96):
    opts = Options(num_ctx=1024, num_parallel=1, seed=seed, temperature=0.8, num_predict=num_predict)
    text, last = m.chat([{"role": "user", "content": question}], opts, fmt=schema).result()
    return text, last.done_reason


def test_schema_strings_admit_no_raw_control_characters():
    """The converted grammar's ``char`` rule excludes U+0000-U+001F and DEL, as JSON and llama.cpp's converter do."""
    gbnf = json_schema_grammar(json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}))
    char = next(line for line in gbnf.splitlines() if line.startswith("char ::="))
    assert char.startswith('char ::= [^"\\\\\\x7F\\x00-\\x1F]'), char


def test_the_reported_case_is_valid_json(smol):
    """Issue 12's report: seed 9, 'Capital of France?', schema {city: string} gave a raw newline in a string."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for seed in (9, 10, 11):
        text, reason = _answer(smol, schema, seed)
        if reason == "stop":
            jsonschema.validate(json.loads(text), schema)
            assert not any(ch in text for ch in "\x00\x01\x7f")


_names = st.text(alphabet="abcdefghij", min_size=1, max_size=6)
_leaf = st.one_of(
    st.just({"type": "string"}),
    st.just({"type": "integer"}),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.lists(st.sampled_from(["red", "green", "blue", "x y", "line"]), min_size=1, max_size=4, unique=True)
    .map(lambda vals: {"enum": vals}),
)


def _object(children):
    return st.dictionaries(_names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True, max_size=len(props)).map(
            lambda req: {"type": "object", "properties": props, "required": req}))


_schema = st.recursive(_leaf, lambda children: st.one_of(
    st.builds(lambda items: {"type": "array", "items": items, "maxItems": 3}, children),
    _object(children)), max_leaves=5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(props=st.dictionaries(_names, _schema, min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_every_stopped_answer_validates(smol, props, seed):
    schema = {"type": "object", "properties": props, "required": sorted(props)}
    text, reason = _answer(smol, schema, seed, question="Describe a city as JSON.", num_predict=96)
    if reason == "stop":
        jsonschema.validate(json.loads(text), schema)
