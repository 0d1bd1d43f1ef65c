"""Prompt-cache manager: per-prefix KV states in a RAM tier and a disk tier shared across processes.

See :mod:`ollapy.cache.manager` for the engine-facing API, :mod:`.index` for the
hash-chained block index, :mod:`.tiers` for the RAM LRU and disk directory,
:mod:`.fileformat` for the state file and :mod:`.salt` for what makes a state
valid (model sha256, KV settings).
"""
from __future__ import annotations

from .manager import BoundCache, Hit, PromptCache, open_prompt_cache

__all__ = ["BoundCache", "Hit", "PromptCache", "open_prompt_cache"]
