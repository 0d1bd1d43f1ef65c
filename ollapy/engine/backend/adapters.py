"""LoRA adapters (Modelfile ``ADAPTER``) through llama.cpp's adapter API.

An adapter is a GGUF of ``general.type = "adapter"`` holding low-rank pairs ``W.lora_a`` / ``W.lora_b`` for some of
the base model's weights (LoRA: Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models").
``llama_adapter_lora_init`` loads it against a loaded model (it refuses another architecture or shapes that do
not fit); ``llama_set_adapters_lora`` attaches the loaded adapters to a context with one user scale each, and
llama.cpp multiplies that scale by ``alpha / rank`` (``src/llama-adapter.h``, ``get_scale``). Ollama applies every
``ADAPTER`` at scale 1.0, and so does ollapy.

Ownership: the :class:`LoraSet` belongs to the :class:`~.context.Backend` that loaded it and is freed by it, after
its contexts and before its model (llama.cpp would free an adapter with its model anyway; freeing it ourselves
keeps the order explicit). Contexts that share the model (the embedding context) attach the same set.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ollapy.engine.backend.bindings import C
from ollapy.errors import ModelLoadError

#: the user scale Ollama gives every ADAPTER (llama.cpp multiplies it by the adapter's alpha / rank)
DEFAULT_SCALE = 1.0


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter to load: its GGUF file and the user scale (``DEFAULT_SCALE`` unless said otherwise)."""

    path: str
    scale: float = DEFAULT_SCALE


class LoraSet:
    """The adapters loaded for one model: native handles, their scales, and attaching them to a context.

    Raises ModelLoadError (naming the file) when llama.cpp cannot load one; the ones loaded before are freed.
    """

    def __init__(self, model, specs: Sequence[AdapterSpec]) -> None:
        self.specs = tuple(specs)
        self._handles: list = []
        for spec in self.specs:
            p = Path(spec.path)
            if not p.is_file():
                self.close()
                raise ModelLoadError(f"ADAPTER {p.name}: no such file", hint="create the model again with its adapter")
            handle = C.llama_adapter_lora_init(model, str(p).encode())
            if not handle:
                self.close()
                raise ModelLoadError(f"ADAPTER {p.name}: llama.cpp could not load this LoRA adapter (not a LoRA GGUF, "
                                     "or made for another base model)",
                                     hint="use an adapter converted for this model (convert_lora_to_gguf.py), or "
                                          "set OLLAPY_DEBUG=1 for llama.cpp's log")
            self._handles.append(handle)
        n = len(self._handles)
        self._array = (C.llama_adapter_lora_p_ctypes * max(n, 1))(*self._handles)
        self._scales = (ctypes.c_float * max(n, 1))(*[s.scale for s in self.specs])

    def __len__(self) -> int:
        return len(self._handles)

    def attach(self, ctx) -> None:
        """Attach every adapter to ``ctx`` at its scale (no-op without adapters). Raises ModelLoadError."""
        if not self._handles:
            return
        rc = C.llama_set_adapters_lora(ctx, self._array, len(self._handles), self._scales)
        if rc != 0:
            raise ModelLoadError(f"llama.cpp could not attach {len(self._handles)} LoRA adapter(s) (error {rc})",
                                 hint="set OLLAPY_DEBUG=1 for llama.cpp's log")

    def close(self) -> None:
        """Free the adapters (idempotent). Only after every context using them was freed."""
        for handle in self._handles:
            C.llama_adapter_lora_free(handle)
        self._handles = []
