"""Benchmark worker for MPI through mpi4py (the `mpich` wheel), one process per rank.

Started by that wheel's launcher, e.g.
    mpiexec -n 2 python bench/workers/mpi_worker.py --sizes 4,4096
Uses Allreduce / Allgather / Reduce_scatter_block / Bcast (and Alltoall / Gather / Scatter /
Reduce) on numpy float32 buffers, with the
receive buffers allocated once per point (outside the timed region), as MPI programs do.
"""

from __future__ import annotations

import mpi4py
import numpy as np
from mpi4py import MPI

from timing import ROOT, Backend, Collective, run_worker, worker_args


def make_backend(comm: MPI.Comm) -> Backend:
    """Adapt an MPI communicator to the worker interface."""
    world = comm.Get_size()

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x = np.ascontiguousarray(inp)
        out = np.empty(out_elems, dtype=x.dtype)
        if op == "all_reduce":
            return lambda: (comm.Allreduce(x, out), out)[1]
        if op == "all_gather":
            return lambda: (comm.Allgather(x, out), out)[1]
        if op == "reduce_scatter":
            return lambda: (comm.Reduce_scatter_block(x, out), out)[1]
        if op == "broadcast":  # in place, as MPI_Bcast is; the buffer keeps the root's data
            buf = x.copy()
            return lambda: (comm.Bcast(buf, root=ROOT), buf)[1]
        root = comm.Get_rank() == ROOT
        if op == "all_to_all":
            return lambda: (comm.Alltoall(x, out), out)[1]
        if op == "gather":
            return lambda: (comm.Gather(x, out if root else None, root=ROOT), out)[1]
        if op == "scatter":
            return lambda: (comm.Scatter(x if root else None, out, root=ROOT), out)[1]
        if op == "reduce":
            return lambda: (comm.Reduce(x, out if root else None, root=ROOT), out)[1]
        raise ValueError(op)

    def gather_floats(v: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(v, dtype=np.float64)
        out = np.empty((world, v.size), dtype=np.float64)
        comm.Allgather(v, out)
        return out

    return Backend(
        system="mpi",
        rank=comm.Get_rank(),
        world=world,
        barrier=comm.Barrier,
        gather_floats=gather_floats,
        prepare=prepare,
        meta={"mpi4py": mpi4py.__version__,
              "mpi": MPI.Get_library_version().splitlines()[0].strip()},
    )


def main() -> None:
    args = worker_args()
    run_worker(make_backend(MPI.COMM_WORLD), args)


if __name__ == "__main__":
    main()
