"""Benchmark worker for mx.distributed with MLX's ring backend, one process per rank, started by
`mlx.launch --backend ring -n 2 -p PORT --python "$(which python)" -- bench/workers/mlx_worker.py`.
Collectives run on the CPU stream and every timed iteration includes `mx.eval` of the result.
MLX has no broadcast: it is emulated as all_sum with zeros on the other ranks (and marked so).
The ring backend has no sum_scatter (reduce_scatter); that is reported as n/a.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from timing import ROOT, Backend, Collective, NotSupported, run_worker, worker_args


def make_backend(group: mx.distributed.Group) -> Backend:
    """Adapt an initialised mx.distributed group to the worker interface."""
    dist, world = mx.distributed, group.size()
    calls = {"all_reduce": dist.all_sum, "broadcast": dist.all_sum,  # broadcast: zeros off the root
             "all_gather": dist.all_gather, "reduce_scatter": dist.sum_scatter}

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        if op not in calls:
            raise NotSupported(f"mx.distributed has no {op}")
        x = mx.array(inp)
        mx.eval(x)
        run = lambda: (y := calls[op](x, group=group, stream=mx.cpu), mx.eval(y))[0]
        try:
            run()
        except (RuntimeError, ValueError) as e:  # the ring's sum_scatter
            raise NotSupported(f"mx.distributed.{calls[op].__name__}: {e}") from None
        return run

    def gather_floats(v: np.ndarray) -> np.ndarray:
        y = dist.all_gather(mx.array(v.astype(np.float32)), group=group, stream=mx.cpu)
        return np.array(y, dtype=np.float64).reshape(world, -1)

    return Backend("mlx-ring", group.rank(), world, lambda: mx.eval(dist.all_sum(mx.zeros((1,)), group=group,
                   stream=mx.cpu)), gather_floats, prepare,
                   emulated={"broadcast": f"all_sum with zeros on ranks other than root {ROOT}"},
                   meta={"mlx": mx.__version__, "device": "cpu", "backend": "ring"})


if __name__ == "__main__":
    args = worker_args()
    run_worker(make_backend(mx.distributed.init(strict=True, backend="ring")), args)
