"""Where the direct (one-hop) all-reduce stops beating the pipelined ring, and which ring piece
size moves large messages fastest: the thresholds' source (Config.direct_max_bytes(_two_ranks),
Config.piece_bytes; bench/NOTES.md 9).

    python bench/crossover.py [--world 2] [--reps 7] [--out DIR]

Each algorithm is forced through FASTCOLL_TUNING (a `fastcoll-tcp/KEY=VALUE` system of
bench/compare.py), one job per variant and round, the variants alternating; the tables give the
medians over all rounds. The full reports are in DIR/sizes and DIR/pieces.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, report, systems  # noqa: E402

SIZES = [4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]
PIECES = [256 << 10, 1 << 20, 4 << 20]
BIG = 64 << 20
FORCE = {"direct": "fastcoll-tcp/direct_max_bytes=1099511627776/direct_max_bytes_two_ranks=1099511627776",
         "ring": "fastcoll-tcp/direct_max_bytes=0/direct_max_bytes_two_ranks=0"}


def medians(names: list[str], sizes: list[int], args: argparse.Namespace, out: Path) -> dict:
    """(system name, size) -> median seconds per all_reduce, from one run of bench/compare.py's harness."""
    config = harness.Config(systems=[systems.parse_system(n) for n in names], ops=["all_reduce"],
                            worlds=[args.world], sizes=sizes, rounds=args.reps, budget_s=args.budget)
    doc = systems.measure(config)
    report.write(doc, out, plots=False)
    return {(p["system"], p["size"]): p["median_s"] for p in doc["points"] if p["status"] == "ok"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.25, help="seconds per point and round")
    ap.add_argument("--out", default=str(harness.REPO_ROOT / "bench" / "out" / "crossover"))
    a = ap.parse_args()
    t = medians(list(FORCE.values()), SIZES, a, Path(a.out) / "sizes")
    print(f"all_reduce float32, {a.world} ranks on localhost over TCP: median us per call\n"
          "| bytes | direct (us) | ring (us) | ring / direct |\n| ---: | ---: | ---: | ---: |")
    for s in SIZES:
        d, r = t.get((FORCE["direct"], s)), t.get((FORCE["ring"], s))
        if d and r:
            print(f"| {s} | {d * 1e6:.0f} | {r * 1e6:.0f} | {r / d:.2f} |")
    names = {p: f"{FORCE['ring']}/piece_bytes={p}" for p in PIECES}
    t = medians(list(names.values()), [BIG], argparse.Namespace(**{**vars(a), "reps": max(3, a.reps // 2)}),
                Path(a.out) / "pieces")
    n = a.world
    print("\nring piece size, 64 MiB all_reduce:\n| piece bytes | ms per call | busbw GB/s |\n| ---: | ---: | ---: |")
    for p, name in names.items():
        if (name, BIG) in t:
            print(f"| {p} | {t[(name, BIG)] * 1e3:.1f} | {BIG / t[(name, BIG)] * 2 * (n - 1) / n / 1e9:.2f} |")


if __name__ == "__main__":
    main()
