"""What a two-rank job costs in CPU while it does nothing: `python bench/idle.py [--seconds 5]`.

Each job starts two ranks on this machine the way their users start them (`fastcoll-launch -n 2`
for fastcoll, `mlx.launch --backend ring -n 2` for MLX's ring), makes one all-reduce, then
  idle     sleeps SECONDS between two all-reduces (no call under way), or
  waiting  rank 1 sleeps SECONDS while rank 0 waits inside its all-reduce for it,
and ends. The CPU time of the whole job (the launcher and every rank, user + system, start-up
included) is what the operating system charged the children of this script. Rows are interleaved
over --rounds rounds; medians are reported. Writes idle.json and idle.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness  # noqa: E402
from bench.systems import launcher, tool  # noqa: E402

REPO = harness.REPO_ROOT

WORKER = """
import sys, time
import numpy as np
system, scenario, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if system == "mlx-ring":
    import mlx.core as mx
    rank = mx.distributed.init(strict=True, backend="ring").rank()
    call = lambda: mx.eval(mx.distributed.all_sum(mx.ones(4), stream=mx.cpu))
else:
    import fastcoll
    rank = fastcoll.init().rank()
    call = lambda: fastcoll.all_reduce(np.ones(4, np.float32))
call()
if scenario == "idle" or rank == 1:  # waiting: rank 0 waits for rank 1 inside the next call
    time.sleep(seconds)
call()
if system != "mlx-ring":
    fastcoll.finalize()
"""

SYSTEMS = {"fastcoll": {"FASTCOLL_NATIVE": "1"}, "fastcoll/py": {"FASTCOLL_NATIVE": "0"}, "mlx-ring": {}}


def command(system: str, worker: str, scenario: str, seconds: float) -> list[str]:
    """The job as its users start it: fastcoll-launch, or mlx.launch for MLX's ring."""
    py, args = sys.executable, [worker, system, scenario, str(seconds)]
    if system == "mlx-ring":
        return [tool("mlx.launch") or "mlx.launch", "--backend", "ring", "-n", "2", "-p",
                str(harness.free_ports(2)), "--python", py, "--", *args]
    return [*launcher(), "-n", "2", py, *args]


def cpu_of(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, float]:
    """(CPU seconds charged to the job and everything it started, wall seconds)."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    r = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall, after = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{argv} exited {r.returncode}: {r.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def measure(systems: list[str], seconds: float, rounds: int) -> list[dict]:
    """Every (system, scenario) `rounds` times, interleaved; a row of medians each."""
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "idle_worker.py")
        Path(worker).write_text(WORKER)
        for rnd in range(rounds):
            for system in harness.rotated(systems, rnd):
                for scenario in ("idle", "waiting"):
                    env = harness.worker_env(SYSTEMS.get(system, {}))
                    used = cpu_of(command(system, worker, scenario, seconds), env, 120)
                    rows.setdefault((system, scenario), []).append(used)
                    print(f"round {rnd + 1} {system} {scenario}: {used[0]:.2f} CPU-s in {used[1]:.2f} s", flush=True)
    return [{"system": s, "scenario": sc, "cpu_s_median": statistics.median(c for c, _ in v),
             "wall_s_median": statistics.median(w for _, w in v), "cpu_s": [round(c, 3) for c, _ in v]}
            for (s, sc), v in rows.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "idle"))
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    table = measure(systems, args.seconds, args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = harness.machine_info() | {"seconds": args.seconds, "rounds": args.rounds, "argv": sys.argv}
    (out / "idle.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1) + "\n")
    md = [f"A two-rank job, {args.seconds:g} s without work, CPU seconds of the whole job (launcher and ranks, "
          f"start-up included), median of {args.rounds} interleaved rounds:", "",
          "| system | idle between calls | waiting inside a call | wall (waiting) |", "| --- | --- | --- | --- |"]
    for s in systems:
        get = {r["scenario"]: r for r in table if r["system"] == s}
        md.append(f"| {s} | {get['idle']['cpu_s_median']:.2f} | {get['waiting']['cpu_s_median']:.2f} | "
                  f"{get['waiting']['wall_s_median']:.1f} s |")
    (out / "idle.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
