"""Where the direct (one-hop) all-reduce stops beating the pipelined ring, and which ring piece
size moves large messages fastest. Two (or --world N) ranks on localhost, TCP.

    python bench/crossover.py [--world 2] [--reps 7]

Each size is timed with both algorithms forced, alternating, in one job, and the median of the
per-call times is reported; the numbers behind fastcoll.collectives.DIRECT_MAX_BYTES(_TWO_RANKS)
and PIECE_BYTES come from this script (see bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]
PIECES = [256 << 10, 1 << 20, 4 << 20]
BIG = 64 << 20


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def rank_main(reps: int) -> None:
    import numpy as np

    import fastcoll
    from fastcoll import collectives

    g = fastcoll.init()

    def per_call(x: np.ndarray, calls: int) -> float:
        fastcoll.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fastcoll.all_reduce(x)
        return (time.perf_counter() - t0) / calls

    rows = []
    for size in SIZES:
        x = np.ones(size // 4, np.float32)
        calls = max(3, min(200, (8 << 20) // size))
        times = {"direct": [], "ring": []}
        for _ in range(reps):
            for algo in ("direct", "ring"):
                bound = 1 << 40 if algo == "direct" else 0
                collectives.DIRECT_MAX_BYTES = collectives.DIRECT_MAX_BYTES_TWO_RANKS = bound
                times[algo].append(per_call(x, calls))
        rows.append({"bytes": size, **{k: _median(v) for k, v in times.items()}})
    collectives.DIRECT_MAX_BYTES = collectives.DIRECT_MAX_BYTES_TWO_RANKS = 0
    pieces = []
    x = np.ones(BIG // 4, np.float32)
    per_call(x, 1)
    for piece in PIECES:
        collectives.PIECE_BYTES = piece
        pieces.append({"piece": piece, "t": _median([per_call(x, 1) for _ in range(max(3, reps // 2))])})
    if g.rank() == 0:
        print(json.dumps({"world": g.size(), "rows": rows, "pieces": pieces}))
    fastcoll.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        rank_main(a.reps)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    procs = []
    for r in range(a.world):
        env = dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE=str(a.world),
                   FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN=token,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", "--reps", str(a.reps)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    res = json.loads(out.strip().splitlines()[-1])
    print(f"all_reduce float32, {res['world']} ranks on localhost over TCP: median seconds per call")
    print("| bytes | direct (us) | ring (us) | ring / direct |")
    print("| ---: | ---: | ---: | ---: |")
    for row in res["rows"]:
        print(f"| {row['bytes']} | {row['direct'] * 1e6:.0f} | {row['ring'] * 1e6:.0f} | {row['ring'] / row['direct']:.2f} |")
    print("\nring piece size, 64 MiB all_reduce:")
    print("| piece bytes | ms per call | busbw GB/s |")
    print("| ---: | ---: | ---: |")
    n = res["world"]
    for p in res["pieces"]:
        print(f"| {p['piece']} | {p['t'] * 1e3:.1f} | {BIG / p['t'] * 2 * (n - 1) / n / 1e9:.2f} |")


if __name__ == "__main__":
    main()
