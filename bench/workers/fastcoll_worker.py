"""Benchmark worker for fastcoll, one process per rank, through its public API only.

The harness starts one process per rank with FASTCOLL_RANK, FASTCOLL_WORLD_SIZE,
FASTCOLL_COORDINATOR, FASTCOLL_TOKEN and FASTCOLL_TRANSPORT set (the README's environment table), and
`fastcoll.init()` reads them. Inputs are numpy float32 arrays by default; `--array mlx` passes
evaluated mx.arrays instead and evaluates each result inside the timed region.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

import fastcoll
from timing import ROOT, Backend, Collective, run_worker, worker_args


def _array_kind(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--array", choices=("numpy", "mlx"), default="numpy")
    return p.parse_known_args(argv)[0].array


def make_backend(group: Any, array: str = "numpy") -> Backend:
    """Adapt an initialised fastcoll group to the worker interface."""
    world = group.size()
    transport = os.environ.get("FASTCOLL_TRANSPORT", "tcp")

    if array == "mlx":
        import mlx.core as mx

        def convert(a: np.ndarray) -> Any:
            x = mx.array(a)
            mx.eval(x)
            return x

        def finish(y: Any) -> Any:
            mx.eval(y)
            return y
    else:
        def convert(a: np.ndarray) -> Any:
            return a

        def finish(y: Any) -> Any:
            return y

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x = convert(inp)
        if op == "all_reduce":
            return lambda: finish(fastcoll.all_reduce(x, group=group))
        if op == "all_gather":
            return lambda: finish(fastcoll.all_gather(x, group=group))
        if op == "reduce_scatter":
            return lambda: finish(fastcoll.reduce_scatter(x, group=group))
        if op == "broadcast":
            return lambda: finish(fastcoll.broadcast(x, root=ROOT, group=group))
        if op == "all_to_all":
            return lambda: finish(fastcoll.all_to_all(x, group=group))
        if op == "gather":  # None off the root
            return lambda: fastcoll.gather(x, root=ROOT, group=group)
        if op == "scatter":
            return lambda: finish(fastcoll.scatter(x, root=ROOT, group=group))
        if op == "reduce":  # None off the root
            return lambda: fastcoll.reduce(x, root=ROOT, group=group)
        raise ValueError(op)

    def gather_floats(v: np.ndarray) -> np.ndarray:
        out = fastcoll.all_gather(np.ascontiguousarray(v, dtype=np.float64), group=group)
        return np.asarray(out, dtype=np.float64).reshape(world, -1)

    meta = {"fastcoll": getattr(fastcoll, "__version__", "?"), "transport": group.transport_info(),
            "array": array}
    for var in ("FASTCOLL_CONNECTIONS", "FASTCOLL_INTERFACE", "FASTCOLL_FAST_SYNC"):
        if var in os.environ:
            meta[var] = os.environ[var]
    return Backend(
        system=os.environ.get("BENCH_SYSTEM", f"fastcoll-{transport}"),
        rank=group.rank(),
        world=world,
        barrier=lambda: fastcoll.barrier(group=group),
        gather_floats=gather_floats,
        prepare=prepare,
        meta=meta,
    )


def main() -> None:
    args = worker_args()
    group = fastcoll.init()
    try:
        run_worker(make_backend(group, _array_kind()), args)
    finally:
        fastcoll.finalize()


if __name__ == "__main__":
    main()
