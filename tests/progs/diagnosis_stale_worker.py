"""One rank of tests/test_diagnosis.py's stale-data test: a rank whose network failed holds what
came before.

    diagnosis_stale_worker.py LIMIT
        rank 0 sends rank 2 a small message, then it and rank 1 fall silent (they sleep, calling
        nothing, past rank 2's window); rank 2, once that message is here, waits for one from
        rank 1 with timeout=LIMIT and prints its error's class and message on one line. No
        peer answers rank 2 after it gives up: what rank 0 had sent before must not count.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import fastcoll

limit = float(sys.argv[1])
g = fastcoll.init()
if g.rank() == 0:
    fastcoll.send(np.ones(16, np.float32), dst=2)
if g.rank() != 2:
    time.sleep(4 * limit)
else:
    time.sleep(limit / 2)  # rank 0's message is here before the wait begins
    try:
        fastcoll.recv(16, np.float32, src=1, timeout=limit)
        print("no error", flush=True)
    except fastcoll.FastcollError as e:
        print(f"{type(e).__name__}: {e}", flush=True)
fastcoll.finalize()
