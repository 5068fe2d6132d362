"""Small collectives with and without the yielding reads and recursive doubling (bench/NOTES.md,
entries 11 and 12), the variants alternating in blocks on every rank alike, so that machine drift
hits them all; rank 0 prints the median time per call of each.

    fastcoll-launch -n 4 python bench/ab/small_ab.py [--op all_gather] [--bytes 16]
    fastcoll-launch -n 2 python bench/ab/small_ab.py --bytes 67108864 --blocks 3 --iters 8

A variant is a FASTCOLL_TUNING value, which init() reads once, so every block is a fastcoll job
of its own: init() with that variant's FASTCOLL_TUNING, a warm-up, the timed calls, finalize().
(Until the restructure of 2026-12-01 the variants were module globals, tcp.YIELD_READS and
doubling.applies, switched inside one job.)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import fastcoll
from fastcoll.config import Config

# name: FASTCOLL_TUNING (the defaults, yield_reads=20 and doubling=1, are in fastcoll/config.py)
VARIANTS = {
    "neither": "yield_reads=0,doubling=0",
    "yield": "doubling=0",
    "doubling": "yield_reads=0",
    "both": "",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--bytes", type=int, default=16, help="buffer size (all_gather: per rank)")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--iters", type=int, default=150, help="timed calls per variant and block")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in names:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    if os.environ.get("FASTCOLL_TUNING"):
        print("small_ab: FASTCOLL_TUNING is set by each variant; the value in the environment is ignored")
    op = getattr(fastcoll, args.op)
    times: dict[str, list[float]] = {v: [] for v in names}
    rank = size = nbytes = 0
    for _ in range(args.blocks):
        for name in names:
            g = fastcoll.init(Config.from_env({**os.environ, "FASTCOLL_TUNING": VARIANTS[name]}))
            rank, size = g.rank(), g.size()
            x = np.ones(max(size, args.bytes // 4), np.float32)
            nbytes = x.nbytes
            for _ in range(20):
                op(x)
            fastcoll.barrier()
            for _ in range(args.iters):
                t0 = time.perf_counter()
                op(x)
                times[name].append(time.perf_counter() - t0)
            fastcoll.finalize()
    if rank == 0:
        cells = " | ".join(f"{v} {np.median(t) * 1e6:.1f}" for v, t in times.items())
        print(f"{args.op} {nbytes} B, {size} ranks, median us: {cells}")


if __name__ == "__main__":
    main()
