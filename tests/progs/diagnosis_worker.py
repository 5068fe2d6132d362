"""One rank of tests/test_diagnosis.py's process test.

    diagnosis_worker.py LIMIT SILENT [HELD PATIENT]
                                 rank SILENT sleeps past the others' limit and never calls;
                                 every other rank calls all_reduce(timeout=LIMIT) and prints its
                                 error's class and message on one line. With HELD and PATIENT:
                                 rank HELD waits half the limit and, once that has run out, holds
                                 its abort notice back for the whole limit, and rank PATIENT
                                 waits twice the limit, so that rank HELD gets two notices at
                                 once before it reads either: first the one whose wait ran out,
                                 then PATIENT's. (init() has the environment's limit: four ranks
                                 starting on a loaded machine may be more than LIMIT apart.)
"""

from __future__ import annotations

import sys
import time

import numpy as np

import fastcoll
from fastcoll import testhooks

limit, silent = float(sys.argv[1]), int(sys.argv[2])
held, patient = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (None, None)
g = fastcoll.init()
if g.rank() == silent:
    time.sleep(4 * limit)  # stays (its connections open) until the others have given up
else:
    timeout = 2 * limit if g.rank() == patient else limit
    if g.rank() == held:
        timeout = limit / 2
        testhooks.set_hook(lambda p: time.sleep(limit) if p == "abort" else None)
    try:
        fastcoll.all_reduce(np.ones(4096, np.float32), timeout=timeout)
        print("no error", flush=True)
    except fastcoll.FastcollError as e:
        print(f"{type(e).__name__}: {e}", flush=True)
fastcoll.finalize()
