"""Where the direct (one-hop) all-reduce stops beating the pipelined ring, and which ring piece
size moves large messages fastest. Two (or --world N) ranks on localhost, TCP.

    python bench/crossover.py [--world 2] [--reps 7]

Each size is timed with both algorithms forced (FASTCOLL_TUNING), one job per variant and
repetition, the variants alternating, and the median of the per-call times is reported; the
defaults of Config.direct_max_bytes(_two_ranks) and Config.piece_bytes come from this script
(see bench/NOTES.md).
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


# FASTCOLL_TUNING for each variant: the direct algorithm forced, the ring forced, ring pieces.
FORCE = {"direct": "direct_max_bytes=1099511627776,direct_max_bytes_two_ranks=1099511627776",
         "ring": "direct_max_bytes=0,direct_max_bytes_two_ranks=0"}


def rank_main(mode: str) -> None:
    import numpy as np

    import fastcoll

    g = fastcoll.init()

    def per_call(x: np.ndarray, calls: int) -> float:
        fastcoll.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fastcoll.all_reduce(x)
        return (time.perf_counter() - t0) / calls

    out: dict = {"world": g.size()}
    if mode == "sizes":
        out["t"] = {size: per_call(np.ones(size // 4, np.float32), max(3, min(200, (8 << 20) // size)))
                    for size in SIZES}
    else:
        x = np.ones(BIG // 4, np.float32)
        per_call(x, 1)
        out["t"] = per_call(x, 1)
    if g.rank() == 0:
        print(json.dumps(out))
    fastcoll.finalize()


def job(world: int, mode: str, tuning: str) -> dict:
    """One job of `world` ranks on localhost with FASTCOLL_TUNING=tuning; rank 0's result."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    procs = []
    for r in range(world):
        env = dict(os.environ, FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE=str(world),
                   FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN=token, FASTCOLL_TUNING=tuning,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", mode],
                                      env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rank-main", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        rank_main(a.rank_main)
        return
    times: dict = {"direct": {s: [] for s in SIZES}, "ring": {s: [] for s in SIZES}}
    for _ in range(a.reps):
        for algo in ("direct", "ring"):
            for size, t in job(a.world, "sizes", FORCE[algo])["t"].items():
                times[algo][int(size)].append(t)
    rows = [{"bytes": s, "direct": _median(times["direct"][s]), "ring": _median(times["ring"][s])} for s in SIZES]
    piece_t: dict = {p: [] for p in PIECES}
    for _ in range(max(3, a.reps // 2)):
        for piece in PIECES:
            piece_t[piece].append(job(a.world, "pieces", f"{FORCE['ring']},piece_bytes={piece}")["t"])
    res = {"world": a.world, "rows": rows, "pieces": [{"piece": p, "t": _median(v)} for p, v in piece_t.items()]}
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
