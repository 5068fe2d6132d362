"""The interleaved benchmark run: every system, on the same sizes, in rotating order.

Each round runs every (world, system) job once, the systems in an order rotated by one per
round, so that drift of a shared machine (other jobs, thermal state) hits all systems alike.
The per-iteration samples of all rounds are pooled before the statistics are taken.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from bench import metrics
from bench.systems import REPO_ROOT, LaunchResult, System, launch, unavailable

Progress = Callable[[str], None]


@dataclass
class Config:
    """What to run and how long to measure it."""

    systems: list[System]
    ops: list[str]
    worlds: list[int]
    sizes: list[int]
    rounds: int = 3
    iters: int = 0  # > 0: fixed iterations per point and round; else the time budget applies
    warmup: int = 3
    budget_s: float = 0.25
    min_iters: int = 5
    max_iters: int = 2000
    timeout_s: float = 600.0

    def worker_args(self) -> list[str]:
        """The command line of the workers (bench/workers/timing.py understands it)."""
        args = ["--ops", ",".join(self.ops), "--sizes", ",".join(map(str, self.sizes)),
                "--warmup", str(self.warmup), "--min-iters", str(self.min_iters),
                "--max-iters", str(self.max_iters)]
        if self.iters > 0:
            return args + ["--iters", str(self.iters), "--budget", "0"]
        return args + ["--budget", str(self.budget_s)]


@dataclass
class Job:
    """One launch of one system at one world size in one round."""

    system: str
    world: int
    round: int
    wall_s: float
    error: str | None
    doc: dict[str, Any] | None = field(repr=False, default=None)


def rotated(items: list[Any], k: int) -> list[Any]:
    """`items` rotated left by k (round r starts with the r-th system)."""
    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]


def machine_info() -> dict[str, Any]:
    """Where and when the run happened; the load average shows whether the machine was shared."""
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "loadavg_start": _loadavg(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            info["git"] = rev.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(config: Config, progress: Progress = lambda _msg: None) -> dict[str, Any]:
    """Run the benchmark; returns the raw results (jobs with their documents, skipped systems)."""
    meta = machine_info() | {"argv": sys.argv, "config": _config_dict(config)}
    skipped: dict[str, str] = {}
    runnable: list[System] = []
    for s in config.systems:
        reason = unavailable(s)
        if reason is None:
            runnable.append(s)
        else:
            skipped[s.name] = reason
            progress(f"{s.name}: {reason}; skipped")

    jobs: list[Job] = []
    worker_args = config.worker_args()
    for rnd in range(config.rounds):
        for wi, world in enumerate(config.worlds):
            for s in rotated(runnable, rnd + wi):
                res: LaunchResult = launch(s, world, worker_args, config.timeout_s)
                jobs.append(Job(s.name, world, rnd, res.wall_s, res.error, res.doc))
                status = "ok" if res.error is None else f"FAILED: {res.error}"
                progress(f"round {rnd + 1}/{config.rounds} world {world} {s.name}: "
                         f"{res.wall_s:.1f} s {status}")
    meta["loadavg_end"] = _loadavg()
    return {"meta": meta, "skipped": skipped, "jobs": jobs}


@contextlib.contextmanager
def busy(count: int):
    """`count` processes that each keep a core busy (a Python loop) while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _config_dict(config: Config) -> dict[str, Any]:
    d = asdict(config)
    d["systems"] = [s.name for s in config.systems]
    return d


def pool_points(jobs: list[Job]) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Pool each (system, op, world, size)'s samples over the rounds.

    A point is `ok` when at least one round measured it and no round found a wrong result;
    a wrong result in any round makes it `check failed` (a broken system must not look fast).
    """
    pooled: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for job in jobs:
        if job.doc is None:
            continue
        for p in job.doc.get("points", []):
            key = (job.system, p["op"], job.world, int(p["size"]))
            acc = pooled.setdefault(key, {"times": [], "rounds": 0, "statuses": [],
                                          "reasons": [], "bytes": p.get("bytes"),
                                          "emulated": p.get("emulated")})
            acc["statuses"].append(p.get("status", "error"))
            if p.get("reason"):
                acc["reasons"].append(p["reason"])
            if p.get("status") == "ok":
                acc["times"].extend(p["times"])
                acc["rounds"] += 1
                acc["bytes"] = p.get("bytes", acc["bytes"])
    return pooled


def points_table(jobs: list[Job]) -> list[dict[str, Any]]:
    """One record per (system, op, world, size): status, statistics and bandwidths."""
    out = []
    for (system, op, world, size), acc in sorted(pool_points(jobs).items()):
        rec: dict[str, Any] = {"system": system, "op": op, "world": world, "size": size,
                               "bytes": acc["bytes"] or size}
        if acc["emulated"]:
            rec["emulated"] = acc["emulated"]
        statuses = acc["statuses"]
        if "check failed" in statuses:
            rec["status"] = "check failed"
        elif acc["times"]:
            rec["status"] = "ok"
        elif all(s == "n/a" for s in statuses):
            rec["status"] = "n/a"
        else:
            rec["status"] = "error"
        if acc["reasons"]:
            rec["reason"] = acc["reasons"][0]
        if rec["status"] == "ok":
            stats = metrics.summarize(acc["times"])
            rec |= stats | {"samples": len(acc["times"]), "rounds": acc["rounds"]}
            rec["algbw_GBps"] = metrics.algbw(rec["bytes"], stats["median_s"]) / metrics.GB
            rec["busbw_GBps"] = metrics.busbw(op, world, rec["bytes"], stats["median_s"]) / metrics.GB
        out.append(rec)
    return out

