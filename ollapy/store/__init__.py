"""Model store: names, manifests + content-addressed blobs, pull sources (hf, Ollama registry, catalogue, file).

Public API (the engine and CLI use these): :func:`resolve_model` → :class:`ModelRef`,
:func:`list_models`, :func:`pull_model`, :func:`remove_model`, :func:`copy_model`,
:func:`create_model`. Nothing here imports llama_cpp; huggingface_hub and httpx
are imported lazily inside the functions that use them.
"""
from __future__ import annotations

from .names import ModelName, parse_name
from .pull import pull_model
from .resolve import ModelInfo, ModelRef, copy_model, create_model, list_models, remove_model, resolve_model

__all__ = ["ModelInfo", "ModelName", "ModelRef", "copy_model", "create_model", "list_models", "parse_name",
           "pull_model", "remove_model", "resolve_model"]
