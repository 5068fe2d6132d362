"""What a lent machine's CPUs and a process's threads did during a run, for decode_bench (Linux
/proc): `cpu_ticks`/`steal_share` read what the hypervisor gave to other tenants (bench/NOTES.md
41), `Threads` how each thread of a process was scheduled.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


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

