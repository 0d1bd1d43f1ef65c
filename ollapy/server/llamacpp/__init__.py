"""llama.cpp server's utility routes, in its wire format (``tools/server`` of llama.cpp).

- :mod:`.routes`: ``POST /tokenize``, ``POST /detokenize``, ``POST /apply-template``.
"""
