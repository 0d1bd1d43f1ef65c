"""Where a new request's prompt prefix comes from: one source per request, chosen by a pure function.

:func:`plan_prefix` looks at what the slots hold and at the prompt cache's best
candidate (nothing read yet) and returns ONE :class:`Plan`:

* ``slot``: the destination slot's own KV, its longest common prefix (LCP)
  with the prompt (the diverging tail is removed with ``seq_rm``);
* ``copy``: a busy slot (the donor) holds a longer prefix; its whole sequence
  is copied in-context with ``llama_memory_seq_cp``, then trimmed;
* ``cache``: a saved state shares a longer prefix; it is restored with
  ``llama_state_seq_set_data`` into the slot, then trimmed;
* ``none``: prefill everything.

Only one source is applied to a slot. This matters because llama.cpp queues a
cross-stream ``seq_cp`` (non-unified KV: one stream per sequence) and copies
the buffers at the next ``llama_decode``: a state restored into the same slot
after a copy would be overwritten by it (``llama_kv_cache::seq_cp`` and
``update`` in llama.cpp's ``src/llama-kv-cache.cpp``).

Costs decide between sources (the idea of llama-server's ``--cache-reuse``
threshold and vLLM's prefix caching, with explicit byte costs):

* a cross-stream copy moves the whole destination stream, ``num_ctx`` cells of
  every layer (``ggml_backend_tensor_copy`` of the stream views), whatever the
  donor's length: it must save at least :data:`MIN_GAIN` tokens and at least
  one token per :data:`COPY_BYTES_PER_TOKEN` bytes moved;
* a restore moves the state's bytes: it must save :data:`MIN_GAIN` tokens and
  one token per :data:`RESTORE_BYTES_PER_TOKEN` bytes.

The constants are conservative for CPUs (memory copies at several GB/s against
prefill at hundreds of tokens/s) and GPUs alike.

The slot chosen is the idle slot with the longest LCP (least recently used on
ties); a copy or a restore goes to the idle slot whose contents are worth
least (empty first, then least recently used), so a useful prefix elsewhere
survives. At least one prompt token is always left to evaluate (fresh logits).
"""
from __future__ import annotations

from dataclasses import dataclass

from ollapy.tokens import common_prefix

MIN_GAIN = 16
COPY_BYTES_PER_TOKEN = 4 << 20
RESTORE_BYTES_PER_TOKEN = 1 << 20



@dataclass(frozen=True)
class SlotView:
    """What the planner needs of a slot: ``usable`` tokens whose KV equals a fresh prefill's.

    ``held``: how many positions the sequence holds now (``seq_pos_max + 1``;
    a busy slot may hold fewer than ``usable`` while it prefills).
    """

    id: int
    usable: tuple[int, ...] | list[int]
    busy: bool
    last_used: float
    held: int


@dataclass(frozen=True)
class CacheOffer:
    """The prompt cache's best candidate: ``n_tokens`` verified shared tokens, ``nbytes`` to restore."""

    n_tokens: int
    nbytes: int
    tier: str


@dataclass(frozen=True)
class Plan:
    """The one prefix source for a request: ``kind`` in none/slot/copy/cache, ``slot`` the destination.

    ``reuse`` tokens of the prompt are kept (prefill starts there); ``donor``
    is the source slot of a copy. ``source`` is a short label for logs and
    events: ``none``, ``slot``, ``copy``, ``cache ram``, ``cache disk``.
    """

    kind: str
    slot: int
    reuse: int
    donor: int = -1
    tier: str = ""

    @property
    def source(self) -> str:
        """Label: ``none``, ``slot``, ``copy``, ``cache ram`` or ``cache disk``."""
        return f"cache {self.tier}" if self.kind == "cache" else self.kind


def plan_prefix(prompt: list[int], slots: list[SlotView], offer: CacheOffer | None, *, num_ctx: int,
                kv_bytes_per_token: int) -> Plan:
    """Choose the single prefix source for ``prompt`` (needs at least one idle slot).

    ``slots``: every slot of the engine; ``offer``: the cache's candidate or
    None; ``kv_bytes_per_token``: KV bytes per token of one sequence (for the
    copy cost). Raises ValueError when no slot is idle.
    """
    idle = [s for s in slots if not s.busy]
    if not idle:
        raise ValueError("plan_prefix needs an idle slot")
    limit = max(0, len(prompt) - 1)  # always evaluate at least one prompt token

    def lcp(s: SlotView) -> int:
        return min(common_prefix(s.usable, prompt), s.held, limit)

    own = max(idle, key=lambda s: (lcp(s), -s.last_used))
    best = Plan("slot" if lcp(own) else "none", own.id, lcp(own))
    spare = min(idle, key=lambda s: (len(s.usable) > 0, s.last_used))

    copy_bytes = num_ctx * kv_bytes_per_token
    for d in slots:
        if not d.busy:
            continue  # an idle slot holding more would have been chosen as `own`
        n = lcp(d)
        gain = n - best.reuse
        if gain >= MIN_GAIN and gain * COPY_BYTES_PER_TOKEN >= copy_bytes:
            best = Plan("copy", spare.id, n, donor=d.id)
    if offer is not None:
        n = min(offer.n_tokens, limit)
        gain = n - best.reuse
        if gain >= MIN_GAIN and gain * RESTORE_BYTES_PER_TOKEN >= offer.nbytes:
            best = Plan("cache", spare.id, n, tier=offer.tier)
    # invariants (cheap asserts): one idle destination, at least one prompt token left, a source iff reuse
    assert 0 <= best.reuse <= limit and (best.kind == "none") == (best.reuse == 0), best
    assert any(s.id == best.slot and not s.busy for s in slots), best
    return best
