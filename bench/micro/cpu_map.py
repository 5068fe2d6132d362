"""How fast each CPU of this machine runs the same Python work, now: a map of a shared host.

On a lent (virtual) machine some CPUs run slower than others for a while, where another tenant
keeps the same physical core busy. A decode benchmark whose processes land on such CPUs measures
its neighbours, not fastcoll (bench/NOTES.md 41). This pins itself to each CPU in turn, times a
fixed loop there, and prints each CPU's median time over the passes and, last, the fastest ones
as a list for `taskset -c`.

    python bench/micro/cpu_map.py [--passes 3] [--fastest 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def work(n: int = 200_000) -> float:
    """Seconds for a fixed loop of Python arithmetic and calls (what a rank's main thread does)."""
    t = time.perf_counter()
    acc = 0
    for i in range(n):
        acc = (acc + i * 7) & 0xFFFF
    return time.perf_counter() - t


def cpu_map(passes: int) -> dict[int, float]:
    """CPU -> median seconds of work() there, over `passes` rounds through every allowed CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    times: dict[int, list[float]] = {c: [] for c in cpus}
    try:
        for _ in range(passes):
            for c in cpus:
                os.sched_setaffinity(0, {c})
                work(20_000)  # on the CPU now, caches warm
                times[c].append(min(work() for _ in range(3)))
    finally:
        os.sched_setaffinity(0, cpus)
    return {c: statistics.median(v) for c, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--fastest", type=int, default=4, help="how many CPUs the last line lists")
    ap.add_argument("--json", help="also write the map here")
    a = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        sys.exit("cpu_map needs Linux (sched_setaffinity)")
    speeds = cpu_map(a.passes)
    best = min(speeds.values())
    for c, s in sorted(speeds.items(), key=lambda kv: kv[1]):
        print(f"cpu {c:3d}: {s * 1e3:7.2f} ms  {s / best:4.2f}x the fastest", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(c): s for c, s in speeds.items()}, f)
    print(",".join(str(c) for c, _ in sorted(speeds.items(), key=lambda kv: kv[1])[: a.fastest]))


if __name__ == "__main__":
    main()
