"""One rank of tests/test_collectives.py's large ring calls: blocks of 4 MiB in many pieces
(FASTCOLL_TUNING's piece_bytes), so that what a rank sends before it receives outnumbers what its
link holds; a reduce_scatter and an all_reduce, each result exact."""

from __future__ import annotations

import numpy as np

import fastcoll
from checks import check, run

BLOCK = 1 << 20  # float32 elements of each rank's block: 4 MiB


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    base = np.arange(n * BLOCK, dtype=np.float32) % 7
    total = n * base + sum(range(n))  # every rank's base + rank, summed
    got = fastcoll.reduce_scatter(base + r)
    check(np.array_equal(got, total[r * BLOCK : (r + 1) * BLOCK]), f"reduce_scatter gave {got[:4]}")
    summed = fastcoll.all_reduce(base + r)
    check(np.array_equal(summed, total), f"all_reduce gave {summed[:4]}")
    print(f"rank {r}: reduce_scatter and all_reduce of {base.nbytes >> 20} MiB exact", flush=True)
    fastcoll.finalize()


if __name__ == "__main__":
    run(main)
