"""Benchmark worker for torch.distributed's gloo backend on CPU tensors, one process per rank,
started torchrun-style with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. all_reduce and
reduce run in place; all_gather_single / reduce_scatter_single are the *_into_tensor /
*_tensor calls of older torch.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.distributed as dist

from timing import ROOT, Backend, Collective, run_worker, worker_args


def _pick(*names: str):
    return next(fn for fn in (getattr(dist, n, None) for n in names) if fn is not None)


def make_backend() -> Backend:
    """Adapt the default torch.distributed process group to the worker interface."""
    world, root = dist.get_world_size(), dist.get_rank() == ROOT
    all_gather_single = _pick("all_gather_single", "all_gather_into_tensor")
    reduce_scatter_single = _pick("reduce_scatter_single", "reduce_scatter_tensor")

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x = torch.from_numpy(inp.copy())
        out = torch.empty(out_elems, dtype=x.dtype)
        parts, pieces = (list(out.chunk(world)), list(x.chunk(world))) if root else (None, None)
        calls = {"all_reduce": lambda: (dist.all_reduce(x), x), "broadcast": lambda: (dist.broadcast(x, src=ROOT), x),
                 "reduce": lambda: (dist.reduce(x, dst=ROOT), x),
                 "all_gather": lambda: (all_gather_single(out, x), out),
                 "reduce_scatter": lambda: (reduce_scatter_single(out, x), out),
                 "all_to_all": lambda: (dist.all_to_all_single(out, x), out),
                 "gather": lambda: (dist.gather(x, gather_list=parts, dst=ROOT), out),
                 "scatter": lambda: (dist.scatter(out, scatter_list=pieces, src=ROOT), out)}
        return lambda: calls[op]()[1]

    def gather_floats(v: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
        out = torch.empty(world * t.numel(), dtype=torch.float64)
        all_gather_single(out, t)
        return out.numpy().reshape(world, -1)

    return Backend("gloo", dist.get_rank(), world, dist.barrier, gather_floats, prepare,
                   meta={"torch": torch.__version__, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    args = worker_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo", init_method="env://")
    try:
        run_worker(make_backend(), args)
    finally:
        dist.destroy_process_group()
