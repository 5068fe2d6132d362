"""Whether recursive doubling beats direct sends across this job's hosts: timed once, at init.

select.for_hosts turns doubling off for a group that doubling would take across hosts twice or
more, since each crossing is a trip of the network where direct sends take one. Where a trip
costs less than sending to every peer at once (veths in one kernel: bench/NOTES.md 112), doubling
is still the faster. So a job whose hosts would lose doubling times both ways on its own links
before init() returns: 4-byte all_reduces, the two alternating, ROUNDS of each. The ranks agree
on the slowest rank's median of each (one max all_reduce over direct sends), so every rank keeps
or drops doubling alike; Job.doubling_across_hosts records the answer for every group.

It runs only on the native engine (the pure-Python engine runs one schedule whatever the rule
names) and not where FASTCOLL_TUNING set `doubling` (the user's choice wins).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import numpy as np

from fastcoll import testhooks
from fastcoll.algorithms import select
from fastcoll.engine import Op

log = logging.getLogger("fastcoll")

ROUNDS = 16  # counted calls of each algorithm
_WARM = 2  # calls of each before them, which warm the links and are not counted


def needed(config: Any, host_ids: list, native: bool) -> bool:
    """Whether init() must time the two: the native engine, doubling on and not set by the user,
    and hosts that make doubling cross the network twice or more (for_hosts would turn it off)."""
    return native and bool(host_ids) and select.for_hosts(config, host_ids) is not config


def doubling_wins(group: Any) -> bool:
    """Time doubling and direct 4-byte all_reduces on `group` (the job's group, every rank
    calling) and whether doubling's agreed median is the smaller. Each timed call passes the
    test hook's point "probe:<algorithm>" (tests/test_doubling_probe.py delays one there)."""
    x, out = np.ones(1, np.float32), np.empty(1, np.float32)
    times: dict[str, list[float]] = {"doubling": [], "direct": []}
    for i in range(ROUNDS + _WARM):
        for algorithm in ("doubling", "direct") if i % 2 == 0 else ("direct", "doubling"):
            started = time.perf_counter()
            group.run(f"probe({algorithm})", Op("all_reduce", algorithm, x, out, "float32", "sum", result=out))
            testhooks.point(f"probe:{algorithm}")
            if i >= _WARM:
                times[algorithm].append(time.perf_counter() - started)
    mine = np.array([statistics.median(times["doubling"]), statistics.median(times["direct"])])
    agreed = np.empty_like(mine)
    group.run("probe(agree)", Op("all_reduce", "direct", mine, agreed, "float64", "max", result=agreed))
    wins = bool(agreed[0] < agreed[1])
    log.info("across hosts, 4 B all_reduce: doubling %.1f us, direct %.1f us (slowest rank's medians): "
             "small calls run %s", agreed[0] * 1e6, agreed[1] * 1e6, "doubling" if wins else "direct")
    return wins
