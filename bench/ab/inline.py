"""The caller-runs path against the service thread: 2 ranks on localhost, 4 KiB float32
all-reduce, synchronous calls (run on the caller's thread when the group is idle) against
`async_op=True` + `wait()` (always through the service thread), alternating in blocks.

    python bench/ab/inline.py
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank_main() -> None:
    import numpy as np

    import fastcoll

    g = fastcoll.init()
    x = np.ones(1024, np.float32)
    times: dict[str, list[float]] = {"sync (caller's thread)": [], "async_op + wait (service thread)": []}
    for _ in range(200):
        fastcoll.all_reduce(x)
    for _ in range(10):
        for label in times:
            fastcoll.barrier()
            for _ in range(300):
                t = time.perf_counter()
                if label.startswith("sync"):
                    fastcoll.all_reduce(x)
                else:
                    fastcoll.all_reduce(x, async_op=True).wait()
                times[label].append(time.perf_counter() - t)
    if g.rank() == 0:
        for label, ts in times.items():
            print(f"{label:34s} median {np.median(ts) * 1e6:6.1f} us  p90 {np.percentile(ts, 90) * 1e6:6.1f} us  ({len(ts)} calls)")
    fastcoll.finalize()


if __name__ == "__main__":
    if "--rank" in sys.argv:
        rank_main()
        sys.exit()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank"],
            env=dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE="2", FASTCOLL_TOKEN=token,
                     FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", PYTHONPATH=ROOT),
        )
        for r in range(2)
    ]
    sys.exit(max(p.wait() for p in procs))
