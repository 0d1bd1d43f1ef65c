"""Token-sequence helpers shared by the engine's prefix planning and the prompt cache's index."""
from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    Compares 256-token slices first (C-speed list equality), then token by token.
    """
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i
