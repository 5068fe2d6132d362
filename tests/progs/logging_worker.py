"""One rank of the logging and timeout-message tests (tests/test_logging.py).

    logging_worker.py log             init, one all_reduce, finalize (the program configures no logging)
    logging_worker.py timeout SECONDS rank 0 calls all_reduce(timeout=SECONDS) (or none: the
                                      environment's), rank 1 never does; rank 0 prints the error
"""

from __future__ import annotations

import sys
import time

import numpy as np

import fastcoll

mode = sys.argv[1]
g = fastcoll.init()
if mode == "log":
    fastcoll.all_reduce(np.ones(4, np.float32))
elif mode == "timeout":
    if g.rank() == 0:
        limit = float(sys.argv[2]) if len(sys.argv) > 2 else None
        t0 = time.monotonic()
        try:
            fastcoll.all_reduce(np.ones(4, np.float32), timeout=limit)
        except fastcoll.CollectiveTimeoutError as e:
            print(f"after {time.monotonic() - t0:.2f} s: {e}", flush=True)
    else:
        time.sleep(4)  # never calls it; stays until rank 0 has given up
fastcoll.finalize()
