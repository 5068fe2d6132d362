"""Which algorithm the native engine runs a collective with: the one rule every collective
consults. The algorithms are the native engine's (fastcoll/engine/csrc/algorithms/, one file
each); the pure-Python engine runs one schedule per collective whatever the rule names, reading
only whether it calls an all_reduce small (`small`; fastcoll/algorithms/reference.py).

The choice reads only the collective, its buffer's size in bytes, the group's size and the
group's Config (for_hosts: the job's, with doubling off where the group's hosts make it cross
the network more than once, unless init() timed it the faster there: fastcoll/doubling_probe.py),
so ranks that make the same call choose alike. To add an algorithm, write its
file in csrc/algorithms/ with an entry in fc_algo.c's registry, and give it a name and a line
here.

    small (nbytes <= Config.direct_max_bytes, or direct_max_bytes_two_ranks for two ranks):
        doubling   4, 8, 16 ... ranks (Config.doubling), where it has the collective and
                   fewer than two of its steps cross between hosts (for_hosts), or init()
                   timed it faster than direct across them (doubling_probe)
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

import dataclasses
from collections.abc import Sequence
from typing import Any

# The names an Op carries (fastcoll/engine/ops.py), as the native engine's registry has them.
ALGORITHMS = ("direct", "doubling", "ring", "pairwise", "chain")
# The collectives whose algorithm depends on the size, and those that always run direct.
_SIZED = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce"))
_DIRECT = frozenset(("gather", "scatter", "barrier", "send", "recv"))
_LARGE = {"all_to_all": "pairwise", "reduce": "chain"}
_DOUBLING = frozenset(("all_reduce", "all_gather", "reduce_scatter"))
_SMALL = frozenset(("direct", "doubling"))


def small(name: str) -> bool:
    """Whether algorithm `name` is one the rule gives a small call (the pure-Python engine's
    all_reduce is one round of direct sends for those: fastcoll/algorithms/reference.py)."""
    return name in _SMALL


def doubling_applies(size: int) -> bool:
    """Whether recursive doubling serves a group of `size` ranks (a power of two, more than 2)."""
    return size > 2 and size & (size - 1) == 0


def doubling_crossings(hosts: Sequence[object]) -> int:
    """How many of recursive doubling's steps pair ranks on different hosts, for a group whose
    rank r sits on hosts[r] (0 where doubling does not serve the group)."""
    n = len(hosts)
    if not doubling_applies(n):
        return 0
    steps = (1 << k for k in range(n.bit_length() - 1))
    return sum(any(hosts[r] != hosts[r ^ step] for r in range(n)) for step in steps)


def for_hosts(config: Any, hosts: Sequence[object]) -> Any:
    """`config` for a group whose rank r sits on hosts[r]: recursive doubling off where two or
    more of its steps cross between hosts, each a trip of the network where direct sends take
    one trip in all (bench/NOTES.md 111), but where FASTCOLL_TUNING set `doubling`. Every rank
    reads the same rendezvous table, so all choose alike."""
    if not config.doubling or "doubling" in config.tuned or doubling_crossings(hosts) < 2:
        return config
    return dataclasses.replace(config, doubling=False)


def algorithm(collective: str, nbytes: int, size: int, config: Any) -> str:
    """The name (one of ALGORITHMS) of the algorithm that runs this call: what an Op carries.
    `config`: a fastcoll.Config (its thresholds and switches)."""
    # Ordered so that the common case, a small collective of two ranks, makes no call.
    if collective in _SIZED:
        if nbytes > _small_max(size, config):
            return _LARGE.get(collective, "ring")
        if size != 2 and config.doubling and collective in _DOUBLING and doubling_applies(size):
            return "doubling"
        return "direct"
    if collective in _DIRECT:
        return "direct"
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

