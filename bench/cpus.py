"""What this machine's CPUs and a process's threads do, for decode_bench (Linux /proc).

On a lent (virtual) machine some CPUs run slower than others for a while, where another tenant
keeps the same physical core busy (bench/NOTES.md 41): `cpu_map` times a fixed Python loop on
each CPU in turn, `cpu_ticks`/`steal_share` read what the hypervisor stole, `pin_main_thread`
puts a process's main thread alone on one CPU, and `Threads` says how each thread was scheduled.

    python bench/cpus.py [--passes 3] [--fastest 4]     the map, fastest first; the last line
                                                        lists the fastest CPUs for `taskset -c`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path


def work(n: int = 200_000) -> float:
    """Seconds for a fixed loop of Python arithmetic (what a rank's main thread does)."""
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


def pin_main_thread(rank: int) -> list[int] | None:
    """DECODE_MAIN_CPUS (decode_bench's --fast-main): the calling thread alone onto its rank's CPU
    of that list, and every other thread of the process onto every CPU the process had (a thread
    inherits the mask of the thread that starts it, and MLX starts some lazily). Returns the
    caller's CPUs, or None without DECODE_MAIN_CPUS."""
    cpus = os.environ.get("DECODE_MAIN_CPUS")
    if not cpus:
        return None
    listed = [int(c) for c in cpus.split(",")]
    everywhere, me = os.sched_getaffinity(os.getpid()), threading.get_native_id()
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {listed[rank % len(listed)]} if int(task.name) == me else everywhere)
        except OSError:  # a thread that has just ended
            pass
    return sorted(os.sched_getaffinity(0))


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """CPU -> (all ticks, ticks stolen by the hypervisor), from /proc/stat ({} elsewhere)."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for name, *fields in (line.split() for line in f):
                if name.startswith("cpu") and name != "cpu":
                    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
                    out[int(name[3:])] = (sum(ticks), ticks[7])
    except OSError:
        pass
    return out


def steal_share(before: dict, after: dict, cpus: list[int]) -> dict[int, float]:
    """The share of each CPU's time that the hypervisor gave to someone else between two reads."""
    return {c: round((after[c][1] - before[c][1]) / (after[c][0] - before[c][0]), 3)
            for c in cpus if c in before and c in after and after[c][0] > before[c][0]}


class Threads:
    """Each thread's scheduling between construction and `summary`: CPU share, the switches it
    asked for (waits) and those forced on it (preemptions), moves between CPUs, page faults."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> dict[str, dict]:
        named, out, tick = {t.native_id: t.name for t in threading.enumerate()}, {}, os.sysconf("SC_CLK_TCK")
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text().rpartition(")")[2].split()
                status = dict(ln.split(":\t", 1) for ln in (task / "status").read_text().splitlines() if ":\t" in ln)
                sched = (task / "sched").read_text() if (task / "sched").exists() else ""
                name = named.get(int(task.name)) or (task / "comm").read_text().strip()
            except OSError:
                continue
            moves = [int(float(ln.split(":")[1])) for ln in sched.splitlines() if ln.startswith("se.nr_migrations")]
            out[task.name] = {"name": name, "cpu_s": (int(stat[11]) + int(stat[12])) / tick,
                              "faults": int(stat[7]) + int(stat[9]), "last_cpu": int(stat[36]),
                              "waits": int(status.get("voluntary_ctxt_switches", 0)),
                              "preempted": int(status.get("nonvoluntary_ctxt_switches", 0)),
                              "moves": moves[0] if moves else 0}
        return out

    def summary(self, seconds: float) -> list[dict]:
        """One row a thread, busiest first: the differences since construction over `seconds`."""
        rows = []
        for tid, e in self._read().items():
            b = self._start.get(tid, dict.fromkeys(("cpu_s", "faults", "waits", "preempted", "moves"), 0))
            rows.append({"tid": int(tid), "name": e["name"], "cpu_share": round((e["cpu_s"] - b["cpu_s"]) / seconds, 3),
                         "last_cpu": e["last_cpu"]} | {k: e[k] - b[k] for k in ("waits", "preempted", "moves", "faults")})
        return sorted(rows, key=lambda r: -r["cpu_share"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--fastest", type=int, default=4, help="how many CPUs the last line lists")
    a = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        sys.exit("cpus.py needs Linux (sched_setaffinity)")
    speeds = cpu_map(a.passes)
    ranked = sorted(speeds, key=speeds.get)
    for c in ranked:
        print(f"cpu {c:3d}: {speeds[c] * 1e3:7.2f} ms  {speeds[c] / speeds[ranked[0]]:4.2f}x the fastest", file=sys.stderr)
    print(",".join(map(str, ranked[: a.fastest])))


if __name__ == "__main__":
    main()
