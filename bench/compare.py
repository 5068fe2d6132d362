"""Benchmark fastcoll beside its peers on localhost (bench/README.md has the commands; `--help`).
Writes results.json, results.md, latency.png and busbw.png into --out (default bench/out/, which
git ignores; runs of record are copied into a dated folder under bench/records/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, metrics, report, systems  # noqa: E402
from bench.workers.timing import ALL_OPS, OPS  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run fastcoll and its peers side by side on localhost.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS), help=f"collectives to measure, of {','.join(ALL_OPS)}")
    p.add_argument("--world", default=None, help="world sizes (default 2,4; --quick: 2)")
    p.add_argument("--sizes", default=None, help="sizes, e.g. 4KiB,64MiB (default 4 B..64 MiB, powers of 4; --quick: 4,4KiB)")
    p.add_argument("--systems", default=",".join(systems.DEFAULT_SYSTEMS),
                   help="systems and variants (bench/systems.py): /cN connections, /aN loopback addresses, "
                        "/mx mx.array inputs, /noshm, /rdma verbs on the test fabric, /py the Python engine, /KEY=VALUE a FASTCOLL_TUNING knob")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick: 1)")
    p.add_argument("--iters", type=int, default=None,
                   help="fixed timed iterations per point and round (default: --budget)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations (default 3; --quick: 1)")
    p.add_argument("--settle", type=float, default=None,
                   help="untimed seconds at each job's start, before the first point (default 0.5; --quick: 0)")
    p.add_argument("--budget", type=float, default=0.25,
                   help="seconds per point and round when --iters is not given")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one job (system x world x round) may take (default 600; --quick: 60)")
    p.add_argument("--out", default=str(harness.REPO_ROOT / "bench" / "out"), help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--busy", type=int, default=0,
                   help="processes that keep a core busy (a spinning loop each) for the whole run, "
                        "as another program on a shared machine would")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 ranks, 4 B and 4 KiB, 5 iterations, 1 round")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> harness.Config:
    """The harness configuration from the command line (--quick changes only the defaults)."""
    ops = metrics.csv(args.ops)
    unknown = [op for op in ops if op not in ALL_OPS]
    if unknown:
        raise ValueError(f"unknown op {unknown[0]!r}; known: {', '.join(ALL_OPS)}")
    if args.sizes:
        sizes = sorted({metrics.parse_size(s) for s in metrics.csv(args.sizes)})
    else:
        sizes = [4, 4096] if args.quick else metrics.sizes_pow4(4, 64 << 20)
    quick = lambda value, given, normal: given if given is not None else (value if args.quick else normal)
    return harness.Config(
        systems=[systems.parse_system(s) for s in metrics.csv(args.systems)], ops=ops,
        worlds=[int(w) for w in metrics.csv(quick("2", args.world, "2,4"))], sizes=sizes,
        rounds=quick(1, args.rounds, 3), iters=quick(5, args.iters, 0), warmup=quick(1, args.warmup, 3),
        settle_s=quick(0.0, args.settle, harness.Config.settle_s),
        budget_s=args.budget, timeout_s=quick(60.0, args.timeout, 600.0))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ValueError as e:
        raise SystemExit(str(e))
    doc = systems.measure(config, args.busy)
    written = report.write(doc, Path(args.out), plots=not args.no_plots)
    print("\n".join(report.targets_table(doc)))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0 if any(p["status"] == "ok" for p in doc["points"]) else 1


if __name__ == "__main__":
    sys.exit(main())
