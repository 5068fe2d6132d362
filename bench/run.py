"""Benchmark fastcoll beside its peers on localhost: `python bench/run.py --help`.

Examples:
    python bench/run.py --quick                      # smoke run: 2 ranks, 4 B and 4 KiB
    python bench/run.py                              # the full sweep: 4 B..64 MiB, 2 and 4 ranks
    python bench/run.py --ops all_reduce --world 2 --sizes 4KiB,64MiB --systems mlx-ring,gloo

Writes results.json, results.md, latency.png and busbw.png into --out (default bench/out/, which
git ignores; runs of record are copied into a dated folder under bench/records/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, metrics, report  # noqa: E402
from bench.systems import DEFAULT_SYSTEMS, REPO_ROOT, parse_system  # noqa: E402
from bench.workers.timing import ALL_OPS, OPS  # noqa: E402

QUICK_SIZES = [4, 4096]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Run fastcoll and its peers side by side on localhost.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS),
                   help=f"collectives to measure, of {','.join(ALL_OPS)}")
    p.add_argument("--world", default=None, help="world sizes (default 2,4; --quick: 2)")
    p.add_argument("--min-bytes", default="4", help="smallest size (powers of 4 from here)")
    p.add_argument("--max-bytes", default="64MiB", help="largest size")
    p.add_argument("--sizes", default=None,
                   help="explicit sizes instead of the powers of 4, e.g. 4KiB,64MiB")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help="systems; variants: /cN connections, /aN loopback addresses, /mx mx.array inputs (fastcoll)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds (default 3; --quick: 1)")
    p.add_argument("--iters", type=int, default=None,
                   help="fixed timed iterations per point and round (default: --budget)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations (default 3)")
    p.add_argument("--budget", type=float, default=0.25,
                   help="seconds per point and round when --iters is not given")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one job (system x world x round) may take (default 600; "
                        "--quick: 60)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "out"), help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--busy", type=int, default=0,
                   help="processes that keep a core busy (a spinning loop each) for the whole run, "
                        "as another program on a shared machine would")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 ranks, 4 B and 4 KiB, 5 iterations, 1 round")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> harness.Config:
    """The harness configuration from the command line (--quick changes only the defaults)."""
    systems = [parse_system(s) for s in _csv(args.systems)]
    ops = _csv(args.ops)
    for op in ops:
        if op not in ALL_OPS:
            raise SystemExit(f"unknown op {op!r}; known: {', '.join(ALL_OPS)}")
    if args.sizes:
        sizes = sorted({metrics.parse_size(s) for s in _csv(args.sizes)})
    elif args.quick:
        sizes = QUICK_SIZES
    else:
        sizes = metrics.sizes_pow4(metrics.parse_size(args.min_bytes),
                                   metrics.parse_size(args.max_bytes))
    worlds = [int(w) for w in _csv(args.world or ("2" if args.quick else "2,4"))]
    iters = args.iters if args.iters is not None else (5 if args.quick else 0)
    return harness.Config(
        systems=systems, ops=ops, worlds=worlds, sizes=sizes,
        rounds=args.rounds if args.rounds is not None else (1 if args.quick else 3),
        iters=iters,
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 3),
        budget_s=args.budget, min_iters=args.min_iters, max_iters=args.max_iters,
        timeout_s=args.timeout if args.timeout is not None else (60.0 if args.quick else 600.0),
    )


def assemble(raw: dict[str, Any]) -> dict[str, Any]:
    """The results document: metadata, points, ratios, targets, failures, versions, jobs."""
    jobs: list[harness.Job] = raw["jobs"]
    points = harness.points_table(jobs)
    ratio_recs = report.ratios(points)
    versions: dict[str, Any] = {}
    for job in jobs:
        if job.doc and job.system not in versions:
            meta = {k: v for k, v in job.doc.get("meta", {}).items() if k != "pid"}
            versions[job.system] = ", ".join(f"{k} {v}" for k, v in meta.items())
    return {
        "meta": raw["meta"],
        "skipped": raw["skipped"],
        "failures": [{"system": j.system, "world": j.world, "round": j.round, "error": j.error}
                     for j in jobs if j.error],
        "versions": versions,
        "points": points,
        "ratios": ratio_recs,
        "targets": report.targets(ratio_recs),
        "jobs": [{"system": j.system, "world": j.world, "round": j.round,
                  "wall_s": round(j.wall_s, 2), "error": j.error,
                  "incomplete": bool(j.doc and j.doc.get("incomplete"))} for j in jobs],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ValueError as e:
        raise SystemExit(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with harness.busy(args.busy):
        raw = harness.run(config, progress=lambda msg: print(msg, flush=True))
    raw["meta"]["busy_processes"] = args.busy
    doc = assemble(raw)
    report.write_json(out / "results.json", doc)
    (out / "results.md").write_text(report.markdown(doc))
    written = [out / "results.json", out / "results.md"]
    if not args.no_plots:
        try:
            written += report.plot(doc, out)
        except ImportError:
            print("plots skipped: matplotlib not installed (pip install matplotlib)")
    for t in doc["targets"]:
        parts = [f"{t['fastcoll']} vs {t['peer']} ({t['world']} ranks):"]
        if "small_min_speedup" in t:
            parts.append(f"small min {t['small_min_speedup']:.2f}x (target {t['small_target']:g}x)")
        if "large_busbw_ratio" in t:
            parts.append(f"64 MiB all-reduce busbw {t['large_busbw_ratio']:.2f}x "
                         f"(target {t['large_target']:g}x)")
        print(" ".join(parts))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0 if any(p["status"] == "ok" for p in doc["points"]) else 1


if __name__ == "__main__":
    sys.exit(main())
