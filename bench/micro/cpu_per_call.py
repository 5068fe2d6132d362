"""Wall time and CPU time (time.process_time, this rank's own) per small all-reduce, per rank:
with more ranks than cores, the sum of the ranks' CPU time over the cores bounds the wall time.

    fastcoll-launch -n 4 python bench/micro/cpu_per_call.py [--bytes 16] [--calls 3000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fastcoll


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=16)
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    g = fastcoll.init()
    x = np.ones(max(1, args.bytes // 4), np.float32)
    for _ in range(300):
        fastcoll.all_reduce(x)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(args.calls):
        fastcoll.all_reduce(x)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"rank {g.rank()}/{g.size()}: {args.bytes} B all_reduce: wall {wall / args.calls * 1e6:.0f} us, "
          f"CPU {cpu / args.calls * 1e6:.0f} us per call", flush=True)
    fastcoll.finalize()


if __name__ == "__main__":
    main()
