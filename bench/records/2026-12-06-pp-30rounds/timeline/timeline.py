"""Reads rank0.txt and rank1.txt (one line a call of fastcoll's MPI library in MLX's graph: S send,
R recv, G all_gather; entry and return, CLOCK_MONOTONIC ns; both ranks share the clock) and prints
the medians of the last 300 calls of each rank: each call's length, each gap between calls, the
time from rank 1's send to rank 0's receive returning, and from the later all_gather entry to
each rank's return."""
import collections
import statistics as st
import sys
from pathlib import Path

HERE = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent


def load(r: int) -> list[tuple[int, int, str]]:
    rows = (line.split() for line in (HERE / f"rank{r}.txt").read_text().splitlines())
    return sorted((int(a), int(b), k) for k, a, b in rows)[-300:]


def ms(xs) -> float:
    return round(st.median(xs) / 1000, 1)


r0, r1 = load(0), load(1)
for r, ev in ((0, r0), (1, r1)):
    gaps, lengths = collections.defaultdict(list), collections.defaultdict(list)
    for (a0, b0, k0), (a1, b1, k1) in zip(ev, ev[1:]):
        gaps[f"{k0} return -> {k1} entry"].append(a1 - b0)
    for a, b, k in ev:
        lengths[k].append(b - a)
    print(f"rank {r} call (us):", {k: ms(v) for k, v in lengths.items()})
    print(f"rank {r} gap (us):", {k: ms(v) for k, v in gaps.items()})
sends = [a for a, b, k in r1 if k == "S"]
latency = [b - max(s for s in sends if s < b) for a, b, k in r0 if k == "R" and any(s < b for s in sends)]
print("rank 1 send entry -> rank 0 recv return (us):", ms(latency))
g0 = [(a, b) for a, b, k in r0 if k == "G"]
g1 = [(a, b) for a, b, k in r1 if k == "G"]
m = min(len(g0), len(g1))
pairs = list(zip(g0[-m:], g1[-m:]))
print("all_gather, later entry -> return (us): rank 0", ms(p[1] - max(p[0], q[0]) for p, q in pairs),
      "rank 1", ms(q[1] - max(p[0], q[0]) for p, q in pairs))
