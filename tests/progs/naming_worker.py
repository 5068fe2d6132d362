"""One rank of tests/test_messages.py: what an error says about the other ranks.

    naming_worker.py idle LIMIT      rank 1 stays (alive, its connections open) without calling
                                     for 4 * LIMIT s; the others call all_reduce(timeout=LIMIT)
    naming_worker.py stop LIMIT      as idle, but rank 1 stops itself (SIGSTOP) instead; once
                                     continued it exits at once
    naming_worker.py die             rank 1 exits with code 3 after 0.5 s; the others run
                                     all-reduces of 4 MiB (the ring, on 4 ranks), so that the
                                     loss reaches some of them only through a neighbour
    naming_worker.py recv            rank 0 sends 4 float32 to rank 1, which receives 8

Every rank that gets a fastcoll error prints `ERROR <class>: <message>` on one line and exits 3;
every other rank exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import fastcoll

scenario = sys.argv[1]
limit = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
g = fastcoll.init()
try:
    if scenario in ("idle", "stop") and g.rank() == 1:
        if scenario == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        time.sleep(4 * limit)
    elif scenario in ("idle", "stop"):
        fastcoll.all_reduce(np.ones(4, np.float32), timeout=limit)
    elif scenario == "die" and g.rank() == 1:
        time.sleep(0.5)
        os._exit(3)
    elif scenario == "die":
        for _ in range(20):
            fastcoll.all_reduce(np.ones(1 << 20, np.float32))
    elif scenario == "recv":
        if g.rank() == 0:
            fastcoll.send(np.ones(4, np.float32), 1)
        else:
            fastcoll.recv((8,), np.float32, 0)
except fastcoll.FastcollError as e:
    print(f"ERROR {type(e).__name__}: {e}", flush=True)
    os._exit(3)
fastcoll.finalize()
