"""Benchmark worker for fastcoll, one process per rank, through its public API only.

`fastcoll.init()` reads the variables the harness (or fastcoll-launch) set. Inputs are numpy
float32 arrays by default; `--array mlx` passes evaluated mx.arrays instead and evaluates each
result inside the timed region.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

import fastcoll
from timing import ROOT, Backend, Collective, run_worker, worker_args

ROOTED = {"broadcast", "gather", "scatter", "reduce"}


def make_backend(group: fastcoll.Group, array: str = "numpy") -> Backend:
    """Adapt an initialised fastcoll group to the worker interface."""
    if array == "mlx":
        import mlx.core as mx

        def convert(a: np.ndarray) -> Any:
            x = mx.array(a)
            mx.eval(x)
            return x

        finish = lambda y: (y is None or mx.eval(y), y)[1]  # gather and reduce: None off the root
    else:
        convert = finish = lambda a: a

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x, call = convert(inp), getattr(fastcoll, op)
        kwargs = {"root": ROOT} if op in ROOTED else {}
        return lambda: finish(call(x, group=group, **kwargs))

    def gather_floats(v: np.ndarray) -> np.ndarray:
        out = fastcoll.all_gather(np.ascontiguousarray(v, dtype=np.float64), group=group)
        return np.asarray(out, dtype=np.float64).reshape(group.size(), -1)

    meta = {"fastcoll": fastcoll.__version__, "transport": group.transport_info(), "array": array, "small": group.choose("all_reduce", 4)}
    meta |= {k: v for k, v in os.environ.items() if k in ("FASTCOLL_CONNECTIONS", "FASTCOLL_INTERFACE",
                                                          "FASTCOLL_FAST_SYNC", "FASTCOLL_TUNING")}
    return Backend(os.environ.get("BENCH_SYSTEM", f"fastcoll-{os.environ.get('FASTCOLL_TRANSPORT', 'tcp')}"),
                   group.rank(), group.size(), lambda: fastcoll.barrier(group=group), gather_floats,
                   prepare, meta=meta)


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--array", choices=("numpy", "mlx"), default="numpy")
    array = p.parse_known_args()[0].array
    args = worker_args()
    group = fastcoll.init()
    try:
        run_worker(make_backend(group, array), args)
    finally:
        fastcoll.finalize()


if __name__ == "__main__":
    main()
