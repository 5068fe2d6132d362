"""The timing loop that every benchmark worker shares: a worker adapts one system to `Backend`
and hands it to `run_worker`, which for every (op, size) point checks the result on every rank
(so a broken system cannot look fast), warms up, times each iteration (that of its slowest rank)
and each rank's CPU time per call; rank 0 prints one JSON object. Sizes as nccl-tests', float32
(bench/README.md, "What it measures").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")  # the default sweep
ALL_OPS = OPS + ("all_to_all", "gather", "scatter", "reduce")  # MLX has none of these
DTYPE = np.float32
ITEMSIZE = 4
ROOT = 0

Collective = Callable[[], Any]  # runs the collective once, to completion; returns its result


class NotSupported(Exception):
    """The system has no such collective; the point is reported as n/a with this reason."""


@dataclass
class Backend:
    """What a worker supplies: one communication system, already initialised."""

    system: str
    rank: int
    world: int
    barrier: Callable[[], None]
    gather_floats: Callable[[np.ndarray], np.ndarray]  # (k,) on every rank -> (world, k), by the system itself
    prepare: Callable[[str, np.ndarray, int], Collective]  # (op, input, output elements) -> a collective
    emulated: dict[str, str] = field(default_factory=dict)  # op -> how the system emulates it
    meta: dict[str, Any] = field(default_factory=dict)


class Layout(NamedTuple):
    """Element counts of one point: what each rank sends and receives, and the size S."""

    in_elems: int
    out_elems: int
    bytes: int


def layout(op: str, nominal_bytes: int, world: int) -> Layout:
    """The buffers of `op` at a nominal size; tiny sizes round up to one element per rank."""
    elems = max(1, nominal_bytes // ITEMSIZE)
    if op in ("all_reduce", "broadcast", "reduce"):
        return Layout(elems, elems, elems * ITEMSIZE)
    per_rank = max(1, elems // world)
    total = per_rank * world
    if op in ("all_gather", "gather"):
        return Layout(per_rank, total, total * ITEMSIZE)
    if op in ("reduce_scatter", "scatter"):
        return Layout(total, per_rank, total * ITEMSIZE)
    if op == "all_to_all":
        return Layout(total, total, total * ITEMSIZE)
    raise ValueError(f"unknown op {op!r}")


def _pattern(n: int) -> np.ndarray:
    """Small exact integers, so that float32 sums are exact and order mistakes show."""
    return (np.arange(n, dtype=np.int64) % 13 + 1).astype(DTYPE)


def check_input(op: str, lay: Layout, rank: int) -> np.ndarray:
    """The input of `rank` for the correctness check (and the timed iterations)."""
    p = _pattern(lay.in_elems)
    if op in ("all_reduce", "reduce"):
        return p * DTYPE(rank + 1)
    if op in ("all_gather", "gather", "all_to_all"):
        return p + DTYPE(100 * rank)
    if op in ("scatter", "broadcast"):
        return p if rank == ROOT else np.zeros(lay.in_elems, DTYPE)
    if op == "reduce_scatter":
        return p + DTYPE(rank)
    raise ValueError(f"unknown op {op!r}")


def expected(op: str, lay: Layout, rank: int, world: int) -> np.ndarray | None:
    """The result `rank` must get from `check_input` on every rank (None: nothing, off the root)."""
    if op in ("gather", "reduce") and rank != ROOT:
        return None
    mine = slice(rank * lay.out_elems, (rank + 1) * lay.out_elems)
    if op in ("all_reduce", "reduce"):
        return _pattern(lay.in_elems) * DTYPE(world * (world + 1) // 2)
    if op in ("all_gather", "gather"):
        return np.concatenate([check_input(op, lay, r) for r in range(world)])
    if op == "scatter":
        return _pattern(lay.in_elems)[mine]
    if op == "all_to_all":
        k = lay.in_elems // world
        return np.concatenate([check_input(op, lay, r)[rank * k:(rank + 1) * k] for r in range(world)])
    if op == "reduce_scatter":
        return _pattern(lay.in_elems)[mine] * DTYPE(world) + DTYPE(world * (world - 1) // 2)
    if op == "broadcast":
        return _pattern(lay.in_elems)
    raise ValueError(f"unknown op {op!r}")


def verify(op: str, lay: Layout, rank: int, world: int, result: Any) -> str | None:
    """None when `result` is right, else a short description of what is wrong."""
    want = expected(op, lay, rank, world)
    if want is None:
        return None  # a rooted collective's other ranks: their buffers hold nothing defined
    got = np.asarray(result).reshape(-1)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        return f"{bad.size} wrong elements, first at {i}: {got[i]!r} != {want[i]!r}"
    return None


def choose_iters(args: argparse.Namespace, estimate_s: float) -> int:
    """Iterations for one point: --iters, or enough for --budget seconds (--min-iters..--max-iters)."""
    if args.budget <= 0:
        return args.iters
    return int(min(args.max_iters, max(args.min_iters, math.ceil(args.budget / max(estimate_s, 1e-7)))))


def _prepared(backend: Backend, op: str, lay: Layout) -> Collective:
    """The system's collective for `op` over this rank's check input (NotSupported if it has none)."""
    return backend.prepare(op, check_input(op, lay, backend.rank), lay.out_elems)


def _checked(backend: Backend, op: str, lay: Layout) -> tuple[Collective | None, dict[str, Any]]:
    """The prepared collective, run once and checked on every rank, or None and why not."""
    try:
        fn = _prepared(backend, op, lay)
        problem = verify(op, lay, backend.rank, backend.world, fn())
    except NotSupported as e:
        return None, {"status": "n/a", "reason": str(e)}
    oks = backend.gather_floats(np.array([0.0 if problem else 1.0]))  # every rank learns of all
    if problem or oks.min() < 1.0:
        bad = [r for r in range(backend.world) if oks[r, 0] < 1.0]
        why = f"wrong result on ranks {bad}" + (f" (rank {backend.rank}: {problem})" if problem else "")
        return None, {"status": "check failed", "reason": why}
    return fn, {}


def measure_point(backend: Backend, op: str, nominal: int, settings: argparse.Namespace) -> dict[str, Any]:
    """Check, warm up and time one (op, size) point; the same on every rank."""
    lay = layout(op, nominal, backend.world)
    point: dict[str, Any] = {"op": op, "size": nominal, "bytes": lay.bytes}
    if op in backend.emulated:
        point["emulated"] = backend.emulated[op]
    fn, failed = _checked(backend, op, lay)
    if fn is None:
        return point | failed
    warm: list[float] = []
    for _ in range(settings.warmup):
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
    # All ranks must run the same number of iterations: agree on the slowest estimate.
    estimate = float(backend.gather_floats(np.array([np.median(warm) if warm else 0.0])).max())
    iters = choose_iters(settings, estimate)
    times = np.empty(iters, dtype=np.float64)
    backend.barrier()
    cpu = time.process_time()
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    cpu = (time.process_time() - cpu) / iters
    per_rank = backend.gather_floats(np.append(times, cpu))
    return point | {"status": "ok", "iters": iters, "times": [float(t) for t in per_rank[:, :-1].max(axis=0)],
                    "cpu_s": [float(c) for c in per_rank[:, -1]]}


def settle(backend: Backend, points: list[tuple[str, int]], seconds: float) -> dict[str, Any] | None:
    """Run the first of `points` (op, nominal size) that this system has, untimed, until every
    rank has run it for `seconds`: a job's first few hundred milliseconds ran slower for both
    systems measured on the bed (bench/NOTES.md 86), and the first point measured would carry
    them. The ranks agree about every 50 ms whether to stop. What ran, or None if nothing could."""
    for op, nominal in points:
        try:
            fn = _prepared(backend, op, layout(op, nominal, backend.world))
        except NotSupported:
            continue  # the same on every rank: they all try the next point
        t0 = time.perf_counter()
        fn()
        once = float(backend.gather_floats(np.array([time.perf_counter() - t0])).max())
        batch = max(1, min(20, int(0.05 / max(once, 1e-9))))  # a 64 MiB call is not run 20 times
        calls, start = 1, time.perf_counter()
        while float(backend.gather_floats(np.array([time.perf_counter() - start])).min()) < seconds:
            for _ in range(batch):
                fn()
            calls += batch
        return {"op": op, "size": nominal, "calls": calls, "seconds": seconds}
    return None


def worker_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line every worker understands (the harness builds it)."""
    p = argparse.ArgumentParser(description="one rank of a fastcoll benchmark worker")
    p.add_argument("--ops", default=",".join(OPS))  # any of ALL_OPS
    p.add_argument("--sizes", default="4,4096", help="comma-separated nominal sizes in bytes")
    for name, kind, default in (("iters", int, 20), ("warmup", int, 3), ("min-iters", int, 5),
                                ("max-iters", int, 2000), ("budget", float, 0.0),  # budget 0: fixed --iters
                                ("settle", float, 0.0)):  # seconds untimed at the start (harness: 0.5)
        p.add_argument(f"--{name}", type=kind, default=default)
    p.add_argument("--partial", default=os.environ.get("BENCH_PARTIAL_FILE"),
                   help="rank 0 rewrites this file with the results so far after every point")
    return p.parse_known_args(argv)[0]


def run_worker(backend: Backend, args: argparse.Namespace) -> dict[str, Any]:
    """Measure every requested point; rank 0 prints the JSON document and returns it."""
    ops, sizes = [o for o in args.ops.split(",") if o], [int(s) for s in args.sizes.split(",") if s]
    doc: dict[str, Any] = {"system": backend.system, "world": backend.world, "meta": backend.meta, "points": []}
    if args.settle > 0:
        try:
            doc["settle"] = settle(backend, [(o, s) for o in ops for s in sizes], args.settle)
        except Exception as e:  # an untimed start must not cost the points
            doc["settle"] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(file=sys.stderr)
    for op in ops:
        for size in sizes:
            try:
                point = measure_point(backend, op, size, args)
            except Exception as e:  # a failing point must not cost the others
                point = {"op": op, "size": size, "status": "error",
                         "reason": f"{type(e).__name__}: {e}"}
                traceback.print_exc(file=sys.stderr)
            doc["points"].append(point)
            if backend.rank == 0 and args.partial:  # what the harness keeps if the job dies later
                with open(f"{args.partial}.tmp", "w") as f:
                    json.dump(doc, f)
                os.replace(f"{args.partial}.tmp", args.partial)
    if backend.rank == 0:
        print("\n" + json.dumps(doc), flush=True)
    return doc
