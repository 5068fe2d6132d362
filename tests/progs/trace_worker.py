"""A few collectives, small and large, with FASTCOLL_TRACE set by the test."""

import numpy as np

import fastcoll

g = fastcoll.init()
fastcoll.all_reduce(np.ones(16, np.float32))
fastcoll.all_reduce(np.ones(1 << 20, np.float32))
fastcoll.all_reduce(np.ones(16, np.float32), async_op=True).wait()
fastcoll.finalize()
print("done")
