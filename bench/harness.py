"""The benchmark's one runner: every entry point starts its jobs with `run_job` and reads what
their ranks print with `documents`; `run` runs every (world, system) job once a round, the systems
in an order rotated by one per round so that drift of a shared machine hits all alike, and
`points_table` pools the samples of all rounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench import metrics

REPO_ROOT = Path(__file__).resolve().parent.parent
Command = tuple[list[str], dict[str, str]]  # argv and the environment it adds


def free_ports(count: int = 1, tries: int = 100) -> int:
    """The first of `count` consecutive TCP ports free on 127.0.0.1 now (MLX's ring listens on
    base..base+count-1), as a user picks a coordinator's port: below the kernel's ephemeral range,
    whose ports an outgoing connection may take before the rank binds them."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's usual start (macOS: 49152)
    for _ in range(tries):
        base = random.randrange(10000, max(low - count, 10001))
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports found")


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH, unbuffered, plus `extra`."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1") | (extra or {})


def documents(text: str, key: str) -> list[dict[str, Any]]:
    """Every JSON object holding `key` that `text` has, one a line (a launcher's '[rank] ' prefix
    allowed), in order."""
    found = []
    for line in text.splitlines():
        at, end = line.find("{"), line.rfind("}")
        if 0 <= at < end:
            try:
                doc = json.loads(line[at:end + 1])
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and key in doc:
                found.append(doc)
    return found


@dataclass
class JobResult:
    """What one job gave: its processes' output, the first document, or why it failed."""

    doc: dict[str, Any] | None
    error: str | None = None
    wall_s: float = 0.0
    output: str = ""


def _stop(p: subprocess.Popen) -> None:
    """End a process we started, and its process group (it was started in a session of its own)."""
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=3)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _wait_all(procs: list[subprocess.Popen], timeout: float, grace: float) -> str | None:
    """Wait for every process; once one fails (or the timeout) give the rest `grace` seconds to
    notice and exit, then end them. None when all exited 0."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [f"process {i} exited with {c}" for i, c in enumerate(codes) if c not in (None, 0)]
        late = time.monotonic() > deadline
        if failed or late or all(c == 0 for c in codes):
            end = time.monotonic() + (grace if failed else 0)
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            for p in procs:
                _stop(p)
            return "; ".join(failed) or (f"timed out after {timeout:.0f} s" if late else None)
        time.sleep(0.02)


def run_job(cmds: list[Command], timeout: float, key: str | None = "points", grace: float = 5.0,
            cwd: Path = REPO_ROOT) -> JobResult:
    """Run a job's processes to the end (or `timeout`) and take the first document holding `key`
    from their output, rank 0's first. Never raises for a failing job: see the result's error."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fastcoll-bench-") as tmp:
        partial = Path(tmp) / "partial.json"
        logs = [Path(tmp) / f"p{i}.log" for i in range(len(cmds))]
        procs = []
        for (argv, extra), log in zip(cmds, logs):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    argv, env=worker_env(extra | {"BENCH_PARTIAL_FILE": str(partial)}), cwd=cwd,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        try:
            error = _wait_all(procs, timeout, grace)
        finally:
            for p in procs:
                _stop(p)
        output = "\n".join(log.read_text(errors="replace") for log in logs)
        docs = documents(output, key) if key is not None else []
        doc = docs[0] if docs else None
        if doc is None and partial.exists():  # the points rank 0 finished before the job died
            with contextlib.suppress(OSError, json.JSONDecodeError):
                doc = json.loads(partial.read_text()) | {"incomplete": True}
    if doc is None and error is None and key is not None:
        error = "no result printed"  # mlx.launch exits 0 even when a rank fails
    if error is not None:
        tail = [x.strip() for x in output.splitlines() if x.strip(" ^~\t") and "Warning" not in x]
        error = " | ".join([error, *tail[-4:]])
    return JobResult(doc, error, time.monotonic() - t0, output)


@contextlib.contextmanager
def busy(count: int):
    """`count` processes that each keep a core busy (a Python loop) while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            _stop(p)


def machine_info() -> dict[str, Any]:
    """Where and when the run happened; the load average shows whether the machine was shared."""
    info: dict[str, Any] = {"host": socket.gethostname(), "platform": platform.platform(), "cpu": "?",
                            "python": platform.python_version(), "cpus": os.cpu_count(),
                            "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                            "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    with contextlib.suppress(OSError, StopIteration):
        info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        info["git"] = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
    return info


@dataclass
class Config:
    """What to run and how long to measure it."""

    systems: list[Any]  # systems.System, or a name a custom `launch` understands
    ops: list[str]
    worlds: list[int]
    sizes: list[int]
    rounds: int = 3
    iters: int = 0  # > 0: fixed iterations per point and round; else the time budget applies
    warmup: int = 3
    settle_s: float = 0.5  # seconds of untimed calls at each job's start (timing.settle)
    budget_s: float = 0.25
    min_iters: int = 5
    max_iters: int = 2000
    timeout_s: float = 600.0

    def worker_args(self) -> list[str]:
        """The command line of the workers (bench/workers/timing.py understands it)."""
        return ["--ops", ",".join(self.ops), "--sizes", ",".join(map(str, self.sizes)), "--warmup",
                str(self.warmup), "--min-iters", str(self.min_iters), "--max-iters", str(self.max_iters),
                "--iters", str(self.iters), "--budget", "0" if self.iters > 0 else str(self.budget_s),
                "--settle", str(self.settle_s)]


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
    """`items` rotated left by k (round k starts with the k-th system)."""
    k %= max(len(items), 1)
    return items[k:] + items[:k]


Launch = Callable[[Any, int, list[str], float], JobResult]


def run(config: Config, launch: Launch, progress: Callable[[str], None] = print,
        skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """Every round, world and system once, by `launch(system, world, worker_args, timeout)`;
    the raw results: machine, configuration, the jobs with their documents, skipped systems."""
    meta = machine_info() | {"argv": sys.argv, "config": asdict(config)}
    meta["config"]["systems"] = [getattr(s, "name", s) for s in config.systems]
    jobs: list[Job] = []
    for rnd in range(config.rounds):
        for wi, world in enumerate(config.worlds):
            for s in rotated(config.systems, rnd + wi):
                res = launch(s, world, config.worker_args(), config.timeout_s)
                name = getattr(s, "name", s)
                jobs.append(Job(name, world, rnd, res.wall_s, res.error, res.doc))
                progress(f"round {rnd + 1}/{config.rounds} world {world} {name}: {res.wall_s:.1f} s "
                         + ("ok" if res.error is None else f"FAILED: {res.error}"))
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"meta": meta, "skipped": skipped or {}, "jobs": jobs}


def pool_points(jobs: list[Job]) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Each (system, op, world, size)'s samples pooled over the rounds, every round's status and median."""
    pooled: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for job in jobs:
        for p in (job.doc or {}).get("points", []):
            acc = pooled.setdefault((job.system, p["op"], job.world, int(p["size"])), {
                "times": [], "cpu": [], "rounds": 0, "statuses": [], "reasons": [], "round_medians": [],
                "bytes": p.get("bytes"), "emulated": p.get("emulated")})
            acc["statuses"].append(p.get("status", "error"))
            if p.get("reason"):
                acc["reasons"].append(p["reason"])
            if p.get("status") == "ok":
                acc["times"] += p["times"]
                acc["cpu"] += p.get("cpu_s", [])
                acc["rounds"] += 1
                acc["round_medians"].append(metrics.summarize(p["times"])["median_s"])  # the spread between rounds
    return pooled


def points_table(jobs: list[Job]) -> list[dict[str, Any]]:
    """One record per (system, op, world, size): status, statistics and bandwidths. A wrong result
    in any round makes the point `check failed`: a broken system must not look fast."""
    out = []
    for (system, op, world, size), acc in sorted(pool_points(jobs).items()):
        rec: dict[str, Any] = {"system": system, "op": op, "world": world, "size": size,
                               "bytes": acc["bytes"] or size}
        statuses = acc["statuses"]
        rec["status"] = ("check failed" if "check failed" in statuses else "ok" if acc["times"]
                         else "n/a" if all(s == "n/a" for s in statuses) else "error")
        if acc["emulated"]:
            rec["emulated"] = acc["emulated"]
        if acc["reasons"]:
            rec["reason"] = acc["reasons"][0]
        if rec["status"] == "ok":
            stats = metrics.summarize(acc["times"])
            rec |= stats | {"samples": len(acc["times"]), "rounds": acc["rounds"], "round_medians_s": acc["round_medians"]}
            rec["algbw_GBps"] = metrics.algbw(rec["bytes"], stats["median_s"]) / metrics.GB
            rec["busbw_GBps"] = metrics.busbw(op, world, rec["bytes"], stats["median_s"]) / metrics.GB
            if acc["cpu"]:
                rec["cpu_s"] = metrics.summarize(acc["cpu"])["median_s"]
        out.append(rec)
    return out
