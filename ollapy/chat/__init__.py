"""Chat: templates, prompt rendering and the meaning of a reply. Knows nothing of llama.cpp or HTTP.

Templates (which Jinja2 template renders a conversation; the renderer itself is llama-cpp-python's, behind
:mod:`ollapy.engine.backend.templating`):

- :mod:`.templates`: which chat template a model uses (its GGUF's, a Modelfile's, or the catalogue's).
- :mod:`.gotemplate`: Ollama's Go-template ``TEMPLATE`` translated to Jinja2.
- :mod:`.fim`: a code completion's prompt (fill-in-the-middle) laid out in the model's FIM tokens.

The meaning of a reply (model text in, structured answer out; whole or streamed):

- :mod:`.reply`: an answer split into reasoning, content and tool calls; forced-call schemas.
- :mod:`.thinking`: the ``<think>…</think>`` section.
- :mod:`.toolcalls`: tool calls in each model family's format (hermes, llama 3, mistral…).
- :mod:`.hermes`: the Hermes / Qwen2.5 family's calls as the models write them (tags, fences, bare JSON).
- :mod:`.calljson`: call objects read out of JSON, and whether a streamed JSON value is cut short.
- :mod:`.generic_tools`: llama.cpp's generic tool-call format for templates without tool support.
- :mod:`.answer_memory`: the answers this process generated, as the model wrote them, for the histories that
  send them back (so a follow-up prompt holds the model's own tokens).
"""
