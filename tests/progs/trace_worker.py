"""A few collectives, small and large, with FASTCOLL_TRACE set by the test; with argument
`fail`, one all_reduce that rank 1 never joins (rank 0's times out; rank 1 waits it out); with
`many`, one all_reduce of 1 MiB (the test cuts it into small pieces)."""

import sys
import time

import numpy as np

import fastcoll

g = fastcoll.init()
if sys.argv[1:] == ["fail"]:
    if g.rank() == 0:
        try:
            fastcoll.all_reduce(np.ones(16, np.float32), timeout=0.5)
        except fastcoll.CollectiveTimeoutError as e:
            print("timed out:", e, flush=True)
    else:
        time.sleep(3)
    sys.exit(0)  # (no finalize: the job failed; the trace is written at exit)
if sys.argv[1:] == ["many"]:  # one call of more phases than the native engine keeps
    fastcoll.all_reduce(np.ones(1 << 18, np.float32))
    fastcoll.finalize()
    sys.exit(0)
fastcoll.all_reduce(np.ones(16, np.float32))
fastcoll.all_reduce(np.ones(1 << 20, np.float32))
fastcoll.all_reduce(np.ones(16, np.float32), async_op=True).wait()
fastcoll.finalize()
print("done")
