"""The cache salt names what computed a state's KV cells, not only the KV settings (issue 53, finding 5).

Two model names on one GGUF with different load settings used to share saved states: repacked weights
(``extra_bufts``), rows computed differently by batch size (the tiled K-quant matmul, so no row invariance and no
answer reuse), the devices holding layers (``num_gpu``, the RPC layout, ``tensor_split``). A state one of them
computed is not what the other's cold prefill computes, so a restore there could change a greedy answer. Offload
and the RPC layout need devices: tests/test_rpc_models.py (RPC servers on loopback) and tests/test_gpu_vulkan.py
check that their states are kept apart.
"""
from __future__ import annotations

import pytest

from ollapy.cache.salt import kv_salt, salt_from_backend
from ollapy.engine.backend import bindings


def _salt(path, monkeypatch, tiled: str = "0", **cfg) -> dict:
    from ollapy.engine.backend.context import Backend, ContextConfig

    monkeypatch.setenv(bindings.TILED_ENV, tiled)
    with Backend(path, ContextConfig(num_ctx=256, **cfg)) as b:
        return salt_from_backend(b)


def test_settings_that_change_how_cells_are_computed_change_the_salt(smollm2_path, monkeypatch):
    plain = _salt(smollm2_path, monkeypatch, extra_bufts="off")
    assert plain == _salt(smollm2_path, monkeypatch, extra_bufts="off")  # the same settings share states
    others = {"tiled": _salt(smollm2_path, monkeypatch, tiled="1", extra_bufts="off"),
              "flash": _salt(smollm2_path, monkeypatch, extra_bufts="off", flash_attn="on")}
    if not (bindings.cpu_has_amx() and bindings.build_has_amx()):  # extra_bufts=on is refused where AMX crashes
        others["repacked"] = _salt(smollm2_path, monkeypatch, extra_bufts="on")
    for name, salt in others.items():
        assert salt != plain, name
    assert plain["compute"]["devices"] == [] and plain["compute"]["gpu_layers"] == 0  # the CPU alone here
    assert plain["compute"]["answer_reuse"] and not others["tiled"]["compute"]["row_invariant"]


def test_the_salt_takes_more_identity_parts():
    """An extensible tuple of parts (e.g. LoRA adapters later, issue 56); a part cannot replace a KV setting."""
    base = kv_salt("f16", "off", "0.3.36")
    more = kv_salt("f16", "off", "0.3.36", parts=(("adapters", [["a.gguf", 0.5]]),))
    assert more == {**base, "adapters": [["a.gguf", 0.5]]}
    with pytest.raises(ValueError, match="taken"):
        kv_salt("f16", "off", "0.3.36", parts=(("type_k", "q8_0"),))
