"""Gate sequence numbers: 32-bit words that wrap, compared the way the kernels compare them.

The GPU and the host exchange sequence numbers through 32-bit control words. They wrap at 2**32,
so "has the word reached seq" is decided on the signed 32-bit difference, exactly like the kernels'
`(int)(word - seq) >= 0`. That is correct as long as fewer than 2**31 gates are in flight, which
the gate's serial chain guarantees (at most a handful are).
"""

from __future__ import annotations

MASK = 0xFFFFFFFF
_HALF = 1 << 31
_FULL = 1 << 32


def seq_add(seq: int, n: int = 1) -> int:
    """`seq + n` modulo 2**32."""
    return (seq + n) & MASK


def seq_diff(a: int, b: int) -> int:
    """`a - b` as the kernels see it: the signed 32-bit difference, in [-2**31, 2**31)."""
    d = (a - b) & MASK
    return d - _FULL if d >= _HALF else d


def seq_reached(word: int, seq: int) -> bool:
    """Whether a control word holding `word` has reached (or passed) `seq`, wrap-aware."""
    return seq_diff(word, seq) >= 0
