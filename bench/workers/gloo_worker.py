"""Benchmark worker for torch.distributed with the gloo backend on CPU tensors.

The harness starts one process per rank, torchrun-style, with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set; `init_process_group("gloo", init_method="env://")` reads them. Uses all_reduce
(in place), all_gather_single / reduce_scatter_single (the *_into_tensor / *_tensor names on
older torch) and broadcast.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from timing import ROOT, Backend, Collective, run_worker, worker_args


def _pick(*names: str) -> Callable[..., Any]:
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return fn
    raise AttributeError(f"torch.distributed has none of {names}")


def make_backend() -> Backend:
    """Adapt the default torch.distributed process group to the worker interface."""
    world = dist.get_world_size()
    all_gather_single = _pick("all_gather_single", "all_gather_into_tensor")
    reduce_scatter_single = _pick("reduce_scatter_single", "reduce_scatter_tensor")

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x = torch.from_numpy(inp.copy())
        out = torch.empty(out_elems, dtype=x.dtype)
        if op == "all_reduce":  # in place: the timed iterations keep summing, which costs the same
            return lambda: (dist.all_reduce(x), x)[1]
        if op == "all_gather":
            return lambda: (all_gather_single(out, x), out)[1]
        if op == "reduce_scatter":
            return lambda: (reduce_scatter_single(out, x), out)[1]
        if op == "broadcast":
            return lambda: (dist.broadcast(x, src=ROOT), x)[1]
        root = dist.get_rank() == ROOT
        if op == "all_to_all":
            return lambda: (dist.all_to_all_single(out, x), out)[1]
        if op == "gather":  # the root's list is views of one buffer
            parts = list(out.chunk(world)) if root else None
            return lambda: (dist.gather(x, gather_list=parts, dst=ROOT), out)[1]
        if op == "scatter":
            pieces = list(x.chunk(world)) if root else None
            return lambda: (dist.scatter(out, scatter_list=pieces, src=ROOT), out)[1]
        if op == "reduce":  # in place, as all_reduce above
            return lambda: (dist.reduce(x, dst=ROOT), x)[1]
        raise ValueError(op)

    def gather_floats(v: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
        out = torch.empty(world * t.numel(), dtype=torch.float64)
        all_gather_single(out, t)
        return out.numpy().reshape(world, -1)

    return Backend(
        system="gloo",
        rank=dist.get_rank(),
        world=world,
        barrier=dist.barrier,
        gather_floats=gather_floats,
        prepare=prepare,
        meta={"torch": torch.__version__, "threads": torch.get_num_threads()},
    )


def main() -> None:
    args = worker_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    dist.init_process_group("gloo", init_method="env://")
    try:
        run_worker(make_backend(), args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
