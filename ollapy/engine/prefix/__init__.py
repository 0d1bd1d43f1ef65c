"""Prefix reuse: where a request's prompt prefix comes from, and the evaluation order that keeps it exact.

- :mod:`.source`: :class:`~.source.PrefixSource`, the engine's Protocol for a prompt cache (the cache satisfies
  it structurally; the engine imports nothing of :mod:`ollapy.cache`).
- :mod:`.planner`: :func:`~.planner.plan_prefix`, a pure function choosing ONE source per request (the slot's
  own KV, another slot's KV copied in-context, or a saved state).
- :mod:`.assignment`: applying the plan to a slot and starting its prefill.
- :mod:`.evalorder`: the canonical evaluation order (the same batch shapes cold or from the cache), the
  exactness rule of docs/design/DESIGN.md.
"""
