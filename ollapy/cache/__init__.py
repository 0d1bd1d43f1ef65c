"""Prompt-cache manager: a block pool of KV states in a RAM tier and a disk tier shared across processes (and an
opt-in remote tier in Valkey/Redis shared across hosts).

- :mod:`.prompt_cache`: :class:`~.prompt_cache.PromptCache`, a model reference's cache before a model is loaded
  (settings, the remote store), and ``open_prompt_cache``.
- :mod:`.manager`: :class:`~.manager.BoundCache`, the engine-facing facade of a loaded model's cache
  (it satisfies :class:`ollapy.engine.prefix.source.PrefixSource`).
- :mod:`.intake`: the facade's store path: a state copied out, cut into blocks, entered, written as the policy says.
- :mod:`.catalog`: the facade's index kept in step with the disk directory (setup, then each listing).
- :mod:`.candidate`: what a lookup hands the engine (a candidate, then a hit).
- :mod:`.index`: the hash-chained block index (vLLM-style automatic prefix caching), confirmed token by token.
- :mod:`.policy`: admission: which states are worth keeping, and which reach the disk tier.
- :mod:`.tiers`: the RAM LRU and the shared disk directory.
- :mod:`.blocks`: the block pool: KV blocks named by chain hash, held once with reference counts, block files.
- :mod:`.kvstate`: cuts a llama.cpp sequence state into blocks of cells and joins them back, bit for bit.
- :mod:`.kvsegments`: a state kept as blocks, as the memory pieces llama.cpp reads it from without a join.
- :mod:`.diskcap`: the disk tier's files as a whole: listing, usage, the byte cap, collecting unreferenced blocks.
- :mod:`.fileformat`: the state file (header, token ids, payload, checksums).
- :mod:`.filemap`: copy-on-write views of cache files that hold no file descriptor.
- :mod:`.salt`: what makes a saved state valid (model sha256, KV settings).
- :mod:`.writer`, :mod:`.sync`, :mod:`.tempfiles`: the background disk writer, the file-system sync thread,
  and temporary-file names.
- :mod:`.stats`: counters persisted across processes.
- :mod:`.remote_link`, :mod:`.remote_tier`, :mod:`.remote`, :mod:`.remote_reader`, :mod:`.remote_format`: the
  opt-in remote tier (``OLLAPY_CACHE_REMOTE``): the facade's hooks, blocks and entries as values in Valkey/Redis
  (lookup, verified restore, cost gate), the store client (circuit breaker, background ``SET NX`` queue), its
  bulk read (a reader thread ahead of the restore), the value format.
"""
from __future__ import annotations

from ollapy.cache.manager import BoundCache, Hit
from ollapy.cache.prompt_cache import PromptCache, open_prompt_cache

__all__ = ["BoundCache", "Hit", "PromptCache", "open_prompt_cache"]
