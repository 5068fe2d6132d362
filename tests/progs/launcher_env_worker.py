"""A rank started by another launcher (mpiexec, mlx.launch): init() from that launcher's
variables alone, then one all-reduce and one all-gather."""

import logging

import numpy as np

import fastcoll

logging.basicConfig(level=logging.WARNING)  # show the library's warnings (refused connections)

g = fastcoll.init()
r, n = g.rank(), g.size()
y = fastcoll.all_reduce(np.full(4, r + 1, np.int64))
assert (y == n * (n + 1) // 2).all(), y
assert fastcoll.all_gather(np.array([r])).tolist() == list(range(n))
print(f"rank {r} of {n} via {g.config.launcher}: ok")
fastcoll.finalize()
