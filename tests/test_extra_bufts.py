"""CPU extra buffer types (weight repacking, AMX): the choice never crashes the process."""
from __future__ import annotations

import pytest

from ollapy.engine.backend import bindings


@pytest.mark.parametrize(("amx", "setting", "use"), [
    (True, "on", False), (True, "auto", False), (True, "off", False),
    (False, "on", True), (False, "auto", False), (False, "off", False),
])
def test_extra_bufts_on_is_refused_only_where_ggmls_amx_path_crashes(monkeypatch, amx, setting, use):
    """Found on a Xeon with AMX: the test suite forced extra_bufts=on and the process segfaulted in
    ggml_backend_amx_mul_mat on its first decode (shared/ENVIRONMENT.md). A forced ``on`` is refused there, with a
    reason that says why; elsewhere it is honoured."""
    monkeypatch.setattr(bindings, "cpu_has_amx", lambda: amx)
    monkeypatch.setattr(bindings, "build_has_amx", lambda: amx)
    got, reason = bindings.choose_extra_bufts(setting)
    assert got is use and reason.startswith("on" if use else "off")
    if amx and setting == "on":
        assert reason == "off (extra_bufts=on refused: AMX CPU and AMX build; ggml's AMX path crashes)"


def test_a_model_forced_to_repack_decodes_on_this_machine(smollm2_path):
    """Whatever this CPU, a Backend asked for extra_bufts=on loads and decodes (repacking where it is safe)."""
    from array import array

    from ollapy.engine.backend.context import Backend, ContextConfig

    with Backend(smollm2_path, ContextConfig(num_ctx=256, extra_bufts="on")) as b:
        toks = b.tokenize("The capital of France is")
        b.decode(array("i", toks), array("i", range(len(toks))), array("i", [0] * len(toks)),
                 array("b", [0] * (len(toks) - 1) + [1]))
        assert b.logits_row(len(toks) - 1).shape == (b.n_vocab,)
        assert b.extra_bufts is not (bindings.cpu_has_amx() and bindings.build_has_amx())
