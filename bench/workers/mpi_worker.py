"""Benchmark worker for MPI through mpi4py (the `mpich` wheel), one process per rank:
`mpiexec -n 2 python bench/workers/mpi_worker.py --sizes 4,4096`. Receive buffers are allocated
once per point, outside the timed region, as MPI programs do.
"""

from __future__ import annotations

import mpi4py
import numpy as np
from mpi4py import MPI

from timing import ROOT, Backend, Collective, run_worker, worker_args


def make_backend(comm: MPI.Comm) -> Backend:
    """Adapt an MPI communicator to the worker interface."""
    world, root = comm.Get_size(), comm.Get_rank() == ROOT

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> Collective:
        x, out = np.ascontiguousarray(inp), np.empty(out_elems, dtype=inp.dtype)
        calls = {"all_reduce": lambda: comm.Allreduce(x, out), "all_gather": lambda: comm.Allgather(x, out),
                 "reduce_scatter": lambda: comm.Reduce_scatter_block(x, out),
                 "all_to_all": lambda: comm.Alltoall(x, out),
                 "gather": lambda: comm.Gather(x, out if root else None, root=ROOT),
                 "scatter": lambda: comm.Scatter(x if root else None, out, root=ROOT),
                 "reduce": lambda: comm.Reduce(x, out if root else None, root=ROOT)}
        if op == "broadcast":  # in place, as MPI_Bcast is; the buffer keeps the root's data
            return lambda: (comm.Bcast(x, root=ROOT), x)[1]
        return lambda: (calls[op](), out)[1]

    def gather_floats(v: np.ndarray) -> np.ndarray:
        out = np.empty((world, v.size), dtype=np.float64)
        comm.Allgather(np.ascontiguousarray(v, dtype=np.float64), out)
        return out

    return Backend("mpi", comm.Get_rank(), world, comm.Barrier, gather_floats, prepare,
                   meta={"mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip()})


if __name__ == "__main__":
    args = worker_args()
    run_worker(make_backend(MPI.COMM_WORLD), args)
