"""One loaded model: backend (the only llama_cpp importer), slots, batch loop, sampling, detokenizer.

Import :class:`ollapy.engine.model.LoadedModel` lazily: importing this package
does not load llama.cpp, but importing ``.model`` or ``.backend`` does.
"""
