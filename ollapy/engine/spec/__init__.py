"""Speculative decoding: drafting in the slot loop, verified by the target in the same ``llama_decode``.

- :mod:`.speculator`: :class:`~.speculator.Speculator`, who drafts, how many tokens, and what it earned.
- :mod:`.policy`: the batch-aware drafting policy (how many drafted rows pay in this step).
- :mod:`.step_costs`: measured step times, remembered per model and machine across processes.
- :mod:`.ngram`: draftless n-gram ("prompt lookup") drafting from the slot's own history.
- :mod:`.draft_model`: a draft model's context kept in step with the target's slots.
- :mod:`.acceptance`: the speculative-sampling acceptance rule (Leviathan et al. 2023), so drafting never
  changes the output distribution.
"""
