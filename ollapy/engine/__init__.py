"""One loaded model: the llama.cpp boundary (bindings, backend, templating), slots, batch loop, sampling, detokenizer.

Import :class:`ollapy.engine.model.LoadedModel` lazily: importing this package
does not load llama.cpp, but importing ``.model``, ``.backend`` or ``.bindings`` does.
"""
