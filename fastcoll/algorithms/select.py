"""Which algorithm runs a collective: the one rule every collective consults.

The choice reads only the collective, its buffer's size in bytes, the group's size and the
job's Config, so ranks that make the same call choose alike. To add an algorithm, write its
module (the functions of `direct.py` with the same arguments) and give it a line here.

    small (nbytes <= Config.direct_max_bytes, or direct_max_bytes_two_ranks for two ranks):
        doubling   4, 8, 16 ... ranks (Config.doubling), where it has the collective
        direct     otherwise
    large:
        ring       all_reduce, all_gather, reduce_scatter, broadcast
        pairwise   all_to_all
        chain      reduce
    gather, scatter: direct at every size (the root's link carries every block once anyway)
    barrier, send, recv: direct (one message to each peer is all there is)

direct and pairwise send the same messages for all_to_all (each block in pieces), so ranks whose
buffers differ in size (all_to_all_v) may choose differently.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from fastcoll.algorithms import chain, direct, doubling, pairwise, ring

# The collectives whose algorithm depends on the size, and those that always run direct.
_SIZED = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce"))
_DIRECT = frozenset(("gather", "scatter", "barrier", "send", "recv"))
_LARGE = {"all_to_all": pairwise, "reduce": chain}
_DOUBLING = frozenset(c for c in _SIZED if hasattr(doubling, c))
# The algorithms by the name an Op carries (fastcoll/engine/ops.py).
ALGORITHMS = {"direct": direct, "doubling": doubling, "ring": ring, "pairwise": pairwise, "chain": chain}
_NAMES = {module: name for name, module in ALGORITHMS.items()}


def choose(collective: str, nbytes: int, size: int, config: Any) -> ModuleType:
    """The algorithm module whose `collective` function runs this call. `config`: a
    fastcoll.Config (its thresholds and switches)."""
    # Ordered so that the common case, a small collective of two ranks, makes no call.
    if collective in _SIZED:
        if nbytes > _small_max(size, config):
            return _LARGE.get(collective, ring)
        if size != 2 and config.doubling and collective in _DOUBLING and doubling.applies(size):
            return doubling
        return direct
    if collective in _DIRECT:
        return direct
    raise ValueError(f"no algorithm serves {collective!r}")


def _small_max(size: int, config: Any) -> int:
    return config.direct_max_bytes_two_ranks if size == 2 else config.direct_max_bytes


def by_size(collective: str, size: int, config: Any) -> tuple[int, str, str]:
    """The rule for a sized `collective` on `size` ranks at once: (the most bytes a small call
    has, the small calls' algorithm, the large calls' algorithm), for a caller that chooses
    without Python (MLX's graph, fastcoll/engine/csrc/binding/py_graph.c)."""
    if collective not in _SIZED:
        raise ValueError(f"{collective!r} does not choose its algorithm by size")
    most = _small_max(size, config)
    return most, algorithm(collective, 0, size, config), algorithm(collective, most + 1, size, config)


def algorithm(collective: str, nbytes: int, size: int, config: Any) -> str:
    """The name (a key of ALGORITHMS) of the algorithm `choose` picks: what an Op carries."""
    return _NAMES[choose(collective, nbytes, size, config)]
