"""The llama.cpp boundary: the only package that imports ``llama_cpp`` (docs/design/DESIGN.md).

Modules, each importing llama.cpp lazily so that ``ollapy --help``, ``list`` and ``ps`` never load it:

- :mod:`.bindings`: the low-level ctypes bindings, imported without the high-level ``Llama`` class;
  backend initialisation, GPU-offload and extra-buffer-type queries.
- :mod:`.context`: :class:`~.context.Backend`, one llama model + context (``n_ctx``, ``n_batch``,
  ``n_seq_max`` sequences), tokenize/detokenize, batches, ``llama_decode``, per-sequence KV edits and
  ``llama_state_seq_*`` saves/restores.
- :mod:`.placement`: where the layers go (GPUs, RPC servers, CPU) and the compute identity in the cache salt.
- :mod:`.abort`: the abort flag llama.cpp polls inside ``llama_decode`` (a cancel stops the decode in flight).
- :mod:`.templating`: chat templates through llama-cpp-python's Jinja2 formatter, JSON-schema grammars.
- :mod:`.embedding`: pooled embeddings on a context of their own.
- :mod:`.adapters`: LoRA adapters (``ADAPTER``) loaded against a model and attached to its contexts.
- :mod:`.quantize`: ``llama_model_quantize`` (``ollapy create --quantize``), its progress read from llama.cpp's log.
- :mod:`.media`: libmtmd: a vision projector, image chunks, their encoding and decoding into a sequence.
- :mod:`.rpc`: ggml's RPC backend (servers, remote devices, model placement).
- :mod:`.seqstate`: the ``llama_state_seq_*`` header, rewritten so a state restores into any ``seq_id``.
- :mod:`.vocab`: a draft model's vocabulary checked against its target's at load time.
- :mod:`.vulkan`: Vulkan device selection.
- :mod:`.window`: a restored sliding-window cache's cells placed in the cold run's attention lanes.

Nothing is imported here, so that importing one module does not load the others.
"""
