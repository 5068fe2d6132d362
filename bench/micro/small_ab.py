"""Small collectives with and without the yielding reads and recursive doubling, in one job.

The variants alternate in blocks on every rank alike, so machine drift hits them all; rank 0
prints the median time per call of each.

    fastcoll-launch -n 4 python bench/micro/small_ab.py [--op all_gather] [--bytes 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fastcoll
from fastcoll.algorithms import doubling
from fastcoll.transport import tcp

VARIANTS = {  # name: (YIELD_READS, recursive doubling on)
    "neither": (0, False),
    "yield": (tcp.YIELD_READS, False),
    "doubling": (0, True),
    "both": (tcp.YIELD_READS, True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--bytes", type=int, default=16, help="buffer size (all_gather: per rank)")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--iters", type=int, default=150, help="timed calls per variant and block")
    args = ap.parse_args()
    g = fastcoll.init()
    op = getattr(fastcoll, args.op)
    x = np.ones(max(g.size(), args.bytes // 4), np.float32)
    applies = doubling.applies
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(200):
        op(x)
    for _ in range(args.blocks):
        for name, (reads, rd) in VARIANTS.items():
            tcp.YIELD_READS = reads
            doubling.applies = applies if rd else (lambda size: False)
            fastcoll.barrier()
            for _ in range(20):
                op(x)
            for _ in range(args.iters):
                t0 = time.perf_counter()
                op(x)
                times[name].append(time.perf_counter() - t0)
    if g.rank() == 0:
        cells = " | ".join(f"{v} {np.median(t) * 1e6:.1f}" for v, t in times.items())
        print(f"{args.op} {x.nbytes} B, {g.size()} ranks, median us: {cells}")
    fastcoll.finalize()


if __name__ == "__main__":
    main()
