"""One loaded model: slots, the batch loop, sampling and the detokenizer, above the llama.cpp boundary.

- :mod:`.backend`: the llama.cpp boundary, the ONLY package that imports ``llama_cpp``.
- :mod:`.model`: :class:`~.model.LoadedModel`, the in-process runner (backend + engine + chat template).
- :mod:`.prompt_builder`: the runner's prompt building: chat template rendering, tokens, ``num_keep`` and the
  cache save points, truncation of a chat, grammars for ``format``.
- :mod:`.interface`: :class:`~.interface.ModelRunner`, the Protocol every caller holds.
- :mod:`.engine`: :class:`~.engine.Engine`, ``n_parallel`` slots, continuous batching on one loop thread.
- :mod:`.bookkeeping`: the engine's per-slot bookkeeping: sampling and emitting tokens, verifying drafts, ending
  a request (trim, save, free the slot).
- :mod:`.slot`, :mod:`.request`: a slot's state machine; a request and the chunks it streams back.
- :mod:`.inflight`: the batch in ``llama_decode``, stopped there when every request in it was cancelled.
- :mod:`.sampler`, :mod:`.text`: sampling (llama.cpp's sampler chain); UTF-8 detokenizing and stop strings.
- :mod:`.context_shift`: context shift on overflow and prompt truncation.
- :mod:`.media`: images in prompts (decoding, limits, placeholder ids in the prefix identity, lazy encoding).
- :mod:`.prefix`: prefix reuse (planning, the PrefixSource Protocol, the canonical evaluation order).
- :mod:`.spec`: speculative decoding (n-gram and draft-model drafting, the policy, acceptance).
- :mod:`.cpuload`, :mod:`.hardware`, :mod:`.interrupt`: threads under load, AMX and flash-attention choices,
  Ctrl-C inside C code.
- :mod:`.system`: what this build offers (versions, devices, offload), for ``ollapy info`` and ``rpc-server``.
- :mod:`.heap`: the C heap's free memory given back to the system after a model is unloaded.

Import :class:`ollapy.engine.model.LoadedModel` lazily: importing this package does not load llama.cpp, but
importing ``.model`` or ``.backend`` does.
"""
