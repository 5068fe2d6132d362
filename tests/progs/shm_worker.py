"""Prints, as JSON, what each of this rank's connections became (shared memory or TCP), after
checking a small and a large all-reduce through them, and broadcasts of odd lengths from unaligned
buffers (large messages take the native engine's streaming copy into a ring). The shm test reads it."""

from __future__ import annotations

import json

import numpy as np
from checks import check, run

import fastcoll


def main() -> None:
    g = fastcoll.init()
    n = g.size()
    for count in (1, 3000, 700_000):  # 700k float32: larger than a ring, so it streams through
        x = np.arange(count, dtype=np.float32) + g.rank()
        y = fastcoll.all_reduce(x)
        check(np.array_equal(y, n * np.arange(count, dtype=np.float32) + sum(range(n))), f"all_reduce of {count}")
    for nbytes in (256 * 1024 + 13, (1 << 20) + 7, 3 * (1 << 20) + 1):  # odd lengths, unaligned views
        want = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        x = np.zeros(nbytes + 1, np.uint8)[1:]
        if g.rank() == 0:
            x[:] = want
        y = fastcoll.broadcast(x, root=0)
        check(np.array_equal(y, want), f"broadcast of {nbytes} bytes from an unaligned buffer")
    kinds = sorted({kind for _, _, kind, _, _ in g._job.engine.transport.connections()})  # "shm" or "tcp"
    info = g.transport_info()
    fastcoll.finalize()
    print(json.dumps({"rank": g.rank(), "links": kinds, "info": info}))


run(main)
