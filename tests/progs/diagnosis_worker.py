"""One rank of tests/test_diagnosis.py's process test.

    diagnosis_worker.py SILENT   rank SILENT sleeps past the others' timeout and never calls;
                                 every other rank calls all_reduce and prints its error's class
                                 and message on one line
"""

from __future__ import annotations

import sys
import time

import numpy as np

import fastcoll

silent = int(sys.argv[1])
g = fastcoll.init()
if g.rank() == silent:
    time.sleep(4)  # stays (its connections open) until the others have given up
else:
    try:
        fastcoll.all_reduce(np.ones(4096, np.float32))
        print("no error", flush=True)
    except fastcoll.FastcollError as e:
        print(f"{type(e).__name__}: {e}", flush=True)
fastcoll.finalize()
