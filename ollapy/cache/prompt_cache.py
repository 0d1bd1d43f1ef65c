"""The unbound prompt cache: :class:`PromptCache` (one model reference, its load options and the cache's settings)
and :func:`open_prompt_cache`.

A :class:`PromptCache` holds what does not depend on a loaded model: the directory, the RAM and disk budgets, the
block sizes, the splitter (:mod:`ollapy.cache.kvstate`), the tenant and namespace, and the remote tier's store
client (opened here, so a bad ``OLLAPY_CACHE_REMOTE`` fails at load, never at a request). ``LoadedModel`` calls
:meth:`PromptCache.bind` once its backend exists: that gives the KV settings (the salt) and returns the
:class:`~ollapy.cache.manager.BoundCache` the engine talks to.
"""
from __future__ import annotations

from pathlib import Path

from ollapy import config
from ollapy.cache.blocks import BLOCK_TOKENS
from ollapy.cache.index import HashFn, blake2_chain
from ollapy.cache.manager import BLOCK, BoundCache
from ollapy.cache.policy import INTERIM_WRITE_DELAY_S
from ollapy.cache.salt import normalize_digest, salt_from_backend

__all__ = ["PromptCache", "default_splitter", "open_prompt_cache"]


def default_splitter():
    """:mod:`ollapy.cache.kvstate` (cuts and joins llama.cpp states), or None where it is not available."""
    try:
        from ollapy.cache import kvstate
    except ImportError:
        return None
    return kvstate


class PromptCache:
    """An unbound prompt cache for one model reference and its load options.

    ``write_back`` True (the CLI) writes RAM-only entries to disk at
    :meth:`BoundCache.close`; a server leaves them in RAM (see
    :mod:`ollapy.cache.policy` for the admission rule).
    """

    def __init__(self, ref, options=None, *, root: Path | None = None, ram_bytes: int | None = None,
                 disk_bytes: int | None = None, block: int = BLOCK, hash_fn: HashFn = blake2_chain,
                 write_back: bool = False, block_tokens: int = BLOCK_TOKENS, splitter=default_splitter,
                 queue_bytes: int | None = None, write_delay: float = INTERIM_WRITE_DELAY_S,
                 remote: str | None = None, namespace: str | None = None, tenant: str | None = None) -> None:
        """``block_tokens``: positions per KV block (a multiple of ``block``; 0 keeps every state whole);
        ``splitter``: a callable returning an object with ``split_state``/``join_state`` (the API of
        :mod:`ollapy.cache.kvstate`), or None; ``queue_bytes``: the disk writer's byte budget;
        ``write_delay``: seconds a deferred interim write waits (:data:`~ollapy.cache.policy.INTERIM_WRITE_DELAY_S`);
        ``remote``/``namespace``/``tenant``: the remote tier's store URL (``""``: none), key namespace and the
        server-side tenant id put into the salt (None: ``OLLAPY_CACHE_REMOTE``, ``OLLAPY_CACHE_NAMESPACE``,
        :func:`ollapy.config.cache_tenant`). A remote URL is opened here: a missing client library or a bad URL
        raises :class:`~ollapy.cache.remote.RemoteUnavailable` at load, never at a request."""
        if block_tokens and block_tokens % block:
            raise ValueError(f"block_tokens {block_tokens} is not a multiple of the index block {block}")
        self.ref = ref
        self.options = options
        self.root = Path(root) if root is not None else config.cache_dir()
        self.ram_bytes = config.cache_ram_bytes() if ram_bytes is None else ram_bytes
        self.disk_bytes = config.cache_disk_bytes() if disk_bytes is None else disk_bytes
        self.block = block
        self.hash_fn = hash_fn
        self.write_back = write_back
        self.block_tokens = block_tokens
        self.splitter = splitter() if callable(splitter) and not hasattr(splitter, "split_state") else splitter
        self.queue_bytes = queue_bytes
        self.write_delay = write_delay
        self.tenant = config.cache_tenant() if tenant is None else tenant
        self.namespace = config.cache_namespace() if namespace is None else namespace
        url = config.cache_remote() if remote is None else remote
        self.store = None
        if url:
            from ollapy.cache.remote import open_store

            self.store = open_store(url, config.cache_remote_password_file())

    def bind(self, loaded_model) -> BoundCache:
        """Attach to a loaded model (its backend gives the KV settings)."""
        path = Path(getattr(loaded_model, "path", None) or self.ref.path)
        digest = normalize_digest(getattr(loaded_model, "digest", None)) or normalize_digest(getattr(self.ref, "digest", None))
        name = getattr(loaded_model, "name", None) or getattr(self.ref, "name", None) or path.name
        backend = loaded_model.backend
        # llama.cpp saves only the in-window cells of sliding-window layers (llama_kv_cache::state_write
        # skips SWA-masked cells), so such a state restores correctly only as a whole: never trimmed.
        salt = salt_from_backend(backend)
        if self.tenant:  # a server-side id: tenants never share a cached prefix (CVE-2025-46570)
            salt["tenant"] = self.tenant
        return BoundCache(self, path, digest, salt, name,
                          trimmable=int(getattr(backend, "n_swa", 0) or 0) == 0,
                          piece=getattr(backend, "token_piece", None),
                          segments=bool(getattr(backend, "restores_segments", False)))




def open_prompt_cache(ref, options=None, *, write_back: bool = False) -> PromptCache | None:
    """The prompt cache for ``ref`` with load ``options``; None when ``OLLAPY_CACHE=0``."""
    if not config.cache_enabled():
        return None
    return PromptCache(ref, options, write_back=write_back)
