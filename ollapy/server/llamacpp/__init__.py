"""llama.cpp server's utility routes, in its wire format (``tools/server`` of llama.cpp).

- :mod:`.routes`: ``POST /tokenize``, ``POST /detokenize``, ``POST /apply-template``.
- :mod:`.infill`: ``POST /infill``, code completion (fill-in-the-middle) for llama.vscode and llama.vim.
"""
