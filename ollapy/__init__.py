"""ollapy: a command-line local LLM runner in the Ollama style.

Layers, top to bottom (imports point down only; ``tests/test_layering.py`` checks every module):

- :mod:`.cli`: the ``ollapy`` command.
- :mod:`.server`: ``ollapy serve`` (Ollama, OpenAI and Anthropic APIs; the scheduler).
- :mod:`.runner`: a model behind the runner interface, in process or in a child process; the loader.
- :mod:`.engine` and :mod:`.cache`: one loaded model (slots, batch loop, the llama.cpp boundary); the prompt
  cache. They meet only through the engine's PrefixSource Protocol.
- :mod:`.store`: models on disk and pull sources.
- :mod:`.chat`: chat templates and the meaning of a reply.
- :mod:`.web`: the chat page's static files, which :mod:`.server` shows a browser at ``/``.

Shared by every layer: :mod:`.config` (settings read and checked), :mod:`.settings` (the table of ``OLLAPY_*``
variables), :mod:`.options` (model options; their descriptions in :mod:`.option_help`), :mod:`.errors`,
:mod:`.duration`, :mod:`.fsutil`, :mod:`.rpc_endpoint`, :mod:`.tokens`, :mod:`.kvformat` (the byte layout of a llama.cpp
KV cache in a sequence state, read by the cache and the engine), :mod:`.surrogates` (lone UTF-16 surrogates in
text from outside, replaced as Ollama's JSON decoder does).
"""
__version__ = "0.1.0"
