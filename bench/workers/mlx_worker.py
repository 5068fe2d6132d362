"""Benchmark worker for mx.distributed with MLX's ring backend, one process per rank.

Started by MLX's own launcher, e.g.
    mlx.launch --backend ring -n 2 -p 40000 --python "$(which python)" -- bench/workers/mlx_worker.py
Collectives run on the CPU stream and every timed iteration includes `mx.eval` of the result.
MLX has no broadcast: it is emulated as all_sum with zeros on the non-root ranks (and marked so).
The ring backend has no sum_scatter (reduce_scatter); that is probed once and reported as n/a.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from timing import ROOT, Backend, Collective, NotSupported, run_worker, worker_args

STREAM = mx.cpu


def _evaluated(fn: Any) -> Collective:
    def run() -> mx.array:
        y = fn()
        mx.eval(y)
        return y

    return run


def make_backend(group: mx.distributed.Group) -> Backend:
    """Adapt an initialised mx.distributed group to the worker interface."""
    dist = mx.distributed
    world = group.size()
    unsupported: dict[str, str] = {}

    def probe_sum_scatter() -> None:
        if "reduce_scatter" in unsupported:
            raise NotSupported(unsupported["reduce_scatter"])
        try:
            mx.eval(dist.sum_scatter(mx.zeros((world,)), group=group, stream=STREAM))
        except (RuntimeError, ValueError) as e:
            unsupported["reduce_scatter"] = f"mx.distributed.sum_scatter: {e}"
            raise NotSupported(unsupported["reduce_scatter"]) from None

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x = mx.array(inp)
        mx.eval(x)
        if op == "all_reduce":
            return _evaluated(lambda: dist.all_sum(x, group=group, stream=STREAM))
        if op == "all_gather":
            return _evaluated(lambda: dist.all_gather(x, group=group, stream=STREAM))
        if op == "reduce_scatter":
            probe_sum_scatter()
            return _evaluated(lambda: dist.sum_scatter(x, group=group, stream=STREAM))
        if op in ("all_to_all", "gather", "scatter", "reduce"):
            raise NotSupported(f"mx.distributed has no {op}")
        if op == "broadcast":  # the non-root inputs are zeros (timing.check_input)
            return _evaluated(lambda: dist.all_sum(x, group=group, stream=STREAM))
        raise ValueError(op)

    def barrier() -> None:
        mx.eval(dist.all_sum(mx.zeros((1,)), group=group, stream=STREAM))

    def gather_floats(v: np.ndarray) -> np.ndarray:
        y = dist.all_gather(mx.array(v.astype(np.float32)), group=group, stream=STREAM)
        return np.array(y, dtype=np.float64).reshape(world, -1)

    return Backend(
        system="mlx-ring",
        rank=group.rank(),
        world=world,
        barrier=barrier,
        gather_floats=gather_floats,
        prepare=prepare,
        emulated={"broadcast": f"all_sum with zeros on ranks other than root {ROOT}"},
        meta={"mlx": mx.__version__, "device": "cpu", "backend": "ring"},
    )


def main() -> None:
    args = worker_args()
    group = mx.distributed.init(strict=True, backend="ring")
    run_worker(make_backend(group), args)


if __name__ == "__main__":
    main()
