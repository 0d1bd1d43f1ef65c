"""Log-probabilities leave the engine as plain Python numbers, so every JSON encoder takes them as they are.

The logits are a numpy float32 view; a numpy scalar that slipped through (``logits[t] - lse``) would be a
``numpy.float32`` (which ``json.dumps`` refuses) or a ``numpy.float64`` (which it accepts, but other encoders
and ``type(x) is float`` checks do not). Checked on SmolLM2's real logits, through the response shapes both
APIs build from them.
"""
from __future__ import annotations

import json

import pytest

from ollapy.options import Options


@pytest.fixture(scope="module")
def logprob_items(smollm2_path):
    from ollapy.engine.model import LoadedModel

    model = LoadedModel(smollm2_path, Options(num_ctx=512, num_parallel=1))
    try:
        req = model.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                         Options(temperature=0, num_predict=6, num_ctx=512), logprobs=3)
        items = [lp for chunk in req for lp in (chunk.logprobs or ())]
    finally:
        model.close()
    assert len(items) == 6  # one per generated token
    return items


def _numbers(obj):
    """Every int/float leaf of a JSON-shaped object (dicts, lists, tuples), numpy scalars included."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _numbers(v)
    elif not isinstance(obj, (str, bool, type(None))):
        yield obj


def test_engine_logprobs_are_python_floats(logprob_items):
    for e in logprob_items:
        assert type(e.logprob) is float and e.logprob <= 0, e
        assert len(e.top) == 3 and all(type(lp) is float for _, lp, _ in e.top), e
        assert all(type(b) is int for b in e.bytes) and all(type(b) is int for *_, raw in e.top for b in raw)


def test_api_logprob_objects_are_plain_json(logprob_items):
    from ollapy.server import generation
    from ollapy.server.openai.routes import _legacy_logprobs

    class _Req:
        logprobs = 3

    for obj in (generation.logprob_entries(logprob_items), _legacy_logprobs(_Req(), logprob_items, 0)):
        leaves = list(_numbers(obj))
        assert leaves and {type(x) for x in leaves} <= {int, float}, {type(x) for x in leaves}
        assert json.loads(json.dumps(obj, allow_nan=False)) == obj  # numpy float32 or NaN would raise
