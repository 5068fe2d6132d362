"""The fence gate through fastcoll's public API: chains of dependent all-reduces beside the host
path, the gate's own per-gate timings, and a peer killed mid-token (docs/gate.md).

    python bench/gate_bench.py ranks|profile [--world 2] [--gpus 0,0] [--tokens 20] [--rows 4096:bfloat16]
                                             [--exact N] [--out DIR]
    python bench/gate_bench.py kill [--timeout 20] [--out DIR]

A token is LAYERS dependent all-reduces y = all_reduce(y + 1, "mean") of a row, checked to give
LAYERS; "serial" builds it, then evaluates it, "pipelined" builds token t + 1 while t runs. Runs
(RUNS): `host` (FASTCOLL_FAST_SYNC=0), `gate` (the direct mode where the GPUs share memory),
`gatehost` (the host mode); `profile` runs the gates with FASTCOLL_GATE_PROFILE=1 and keeps the
summary they log. Without a GPU every run takes the host path; two ranks on one GPU need CUDA MPS.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness, metrics  # noqa: E402
from bench.report import save  # noqa: E402
from bench.systems import fastcoll_ranks  # noqa: E402

LAYERS = 64  # all-reduces per token
ROW = 4096  # elements of a row: bf16 hidden size 4096 = 8 KiB
HOST_MODE = {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1"}
RUNS = {"host": {"FASTCOLL_FAST_SYNC": "0"}, "gate": {"FASTCOLL_FAST_SYNC": "1"}, "gatehost": HOST_MODE}


def ms(samples: list[float]) -> dict:
    """Median, p90 and count of durations in seconds, in milliseconds."""
    s = metrics.summarize(samples)
    return {"median": s["median_s"] * 1e3, "p90": s["p90_s"] * 1e3, "n": len(samples)}


def chain(y, steps: int = LAYERS):
    """One token: `steps` dependent all-reduces."""
    import fastcoll

    for _ in range(steps):
        y = fastcoll.all_reduce(y + 1, op="mean")
    return y


def tokens(n: int, dtype, row: int, pipelined: bool) -> dict:
    """ms per token of `chain` over n tokens (after 3 more), each token's value checked."""
    import mlx.core as mx

    def check(y) -> None:
        if float(y[0].item()) != LAYERS:
            raise AssertionError(f"a token gave {y[0].item()}, not {LAYERS}")

    times, prev = [], None
    for t in range(n + 3):
        x = mx.zeros((row,), dtype=dtype)
        mx.eval(x)
        t0 = time.perf_counter()
        y = chain(x)
        if pipelined:  # evaluate the previous token while this one is queued
            mx.async_eval(y)
            y, prev = prev, y
        if y is not None:
            mx.eval(y)
            check(y)
        if t >= 3:
            times.append(time.perf_counter() - t0)
    if prev is not None:
        mx.eval(prev)
        check(prev)
    return ms(times)


def exact_gates(count: int, rank: int, size: int) -> dict:
    """`count` all-reduces (sum of 1024 float32), 64 to a token, each compared with the exact sum."""
    import mlx.core as mx

    import fastcoll

    wrong, error = 0, None
    try:
        for t in range(count // 64):
            value = [(t * 64 + j) % 7 for j in range(64)]
            ys = [fastcoll.all_reduce(mx.full((1024,), float(rank + 1 + v), dtype=mx.float32)) for v in value]
            mx.eval(*ys)
            want = [sum(p + 1 + v for p in range(size)) for v in value]
            wrong += sum(not np.all(np.array(y) == w) for y, w in zip(ys, want))
        fastcoll.check()
    except fastcoll.FastcollError as e:
        error = f"{type(e).__name__}: {e}"
    return {"gates": count // 64 * 64, "wrong": wrong, "error": error}


class ProfileLines(logging.Handler):
    """The summary that FASTCOLL_GATE_PROFILE=1 logs under the `fastcoll` logger when the gate closes."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        logging.getLogger("fastcoll").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("gate profile"):
            self.lines.append(record.getMessage())


def rows(text: str) -> list[tuple[int, str]]:
    """'16:float32,4096:bfloat16' -> [(16, 'float32'), (4096, 'bfloat16')]."""
    return [(int(n), d) for n, d in (part.split(":") for part in text.split(",") if part)]


def worker(args: argparse.Namespace) -> dict:
    """One rank of a run: its rows' chains (and --exact gates)."""
    import mlx.core as mx

    import fastcoll

    profile, g = ProfileLines(), fastcoll.init()
    res = {"rank": g.rank(), "size": g.size(), "transport": g.transport_info(), "device": str(mx.default_device())}
    for row, name in rows(args.rows):
        y, times = mx.zeros((row,), getattr(mx, name)), []
        for _ in range(args.ops + 20):  # each all-reduce evaluated, as the host path always is
            t0 = time.perf_counter()
            y = chain(y, 1)
            mx.eval(y)
            times.append(time.perf_counter() - t0)
        res[f"{name}_{row}"] = {"us_per_allreduce_evaluated": ms(times[20:])["median"] * 1e3,
                                "serial": tokens(args.tokens, getattr(mx, name), row, False)}
        if args.run != "host":
            res[f"{name}_{row}"]["pipelined"] = tokens(args.tokens, getattr(mx, name), row, True)
    if args.exact:
        res["exact"] = exact_gates(args.exact, g.rank(), g.size())
    fastcoll.check()
    fastcoll.finalize()
    return res | {"profile": profile.lines[-1] if profile.lines else None}


def killworker(args: argparse.Namespace) -> dict:
    """Rank 1 dies (SIGKILL) halfway through a token; rank 0 reports how long its error took and
    whether its GPU still runs."""
    import mlx.core as mx

    import fastcoll

    g = fastcoll.init()
    y = chain(mx.zeros((ROW,), dtype=mx.bfloat16))
    mx.eval(chain(y, LAYERS // 2))  # one token and a half first: both ranks are up
    if g.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # rank 0 waits for it in the second half
    res, t0 = {"rank": 0, "timeout_s": float(os.environ["FASTCOLL_TIMEOUT"]), "error": None}, time.perf_counter()
    try:  # the host path raises inside the chain, the gate at the evaluation
        mx.eval(chain(y, LAYERS // 2))
        fastcoll.check()
    except fastcoll.FastcollError as e:
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds_to_error"] = time.perf_counter() - t0
    res["device_runs_after"] = bool(float((mx.arange(1024, dtype=mx.float32) * 2)[3].item()) == 6.0)
    fastcoll.finalize()
    return res


def job(run: str, env: dict, args: argparse.Namespace, more: list[str], timeout: float, grace: float = 5) -> list[dict]:
    """One run's job of args.world ranks; every rank's document, rank 0's first; saved as JSON."""
    argv = [sys.executable, __file__, "kill" if "kill" in run else "ranks", "--rank-of", run, *more]
    res = harness.run_job(fastcoll_ranks(args.world, argv, env | {"FASTCOLL_TIMEOUT": str(args.timeout)}),
                          timeout, key="gate_run", grace=grace)
    docs = sorted(harness.documents(res.output, "gate_run"), key=lambda d: d.get("rank", 0))
    print(f"--- {run}: {res.error or 'ok'} in {res.wall_s:.1f} s", flush=True)
    if res.error and not docs:
        print(res.output[-3000:], flush=True)
    name = run if "kill" in run else f"gate_{args.what}_{run}"
    save(Path(args.out), name, (docs or [{"error": "no result"}])[0] if "kill" in run else docs)
    return docs


def table(docs: dict[str, list[dict]], keys: list[str]) -> list[str]:
    """Markdown: per row and run, ms per token (median / p90) of each rank; the host path's us
    per evaluated all-reduce."""
    cell = lambda d: f"{d['median']:.2f} / {d['p90']:.2f}" if d else "-"
    lines = ["ms per token of 64 dependent all-reduces, median / p90, rank 0; rank 1:", "",
             "| row | run | us per evaluated all-reduce | serial | pipelined |", "| --- | --- | --- | --- | --- |"]
    for key in keys:
        for run, ranks in docs.items():
            got = [d[key] for d in ranks if key in d]
            if got:
                times = ["; ".join(cell(g.get(what)) for g in got) for what in ("serial", "pipelined")]
                lines.append(f"| {key} | {run} | {got[0]['us_per_allreduce_evaluated']:.1f} | {' | '.join(times)} |")
    for run, d in ((run, d) for run, ds in docs.items() for d in ds):
        if d.get("exact"):
            lines.append(f"\n{run} rank {d['rank']}: {d['exact']['gates']} gates checked one by one, "
                         f"{d['exact']['wrong']} wrong, error {d['exact']['error']}")
        if d.get("profile"):
            lines.append(f"\n{run} rank {d['rank']}: {d['profile']}")
    return lines


def cmd_ranks(args: argparse.Namespace) -> None:
    """Each run's job (profile: the gates with FASTCOLL_GATE_PROFILE=1); the table of their documents."""
    docs = {}
    for run, env in RUNS.items():
        more = ["--gpus", args.gpus, "--rows", args.rows, "--ops", str(args.ops), "--tokens", str(args.tokens)]
        if run == "gatehost" and args.exact:
            more += ["--exact", str(args.exact)]
        if args.what == "profile" and run != "host":
            env = env | {"FASTCOLL_GATE_PROFILE": "1"}
        docs[run] = job(run, env, args, more, args.timeout * 5)
    lines = table(docs, [f"{name}_{n}" for n, name in rows(args.rows)])
    print("\n".join(lines), flush=True)
    save(Path(args.out), f"gate_{args.what}_results", "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("ranks", "profile", "kill"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--gpus", default="", help="GPU of each rank, e.g. 0,1 (default: what CUDA gives)")
    ap.add_argument("--ops", type=int, default=300, help="evaluated all-reduces per row, timed one by one")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--rows", help=f"elements:dtype of each row, comma-separated (profile: {ROW}:bfloat16)",
                    default=f"16:float32,{ROW}:bfloat16,8192:bfloat16")
    ap.add_argument("--exact", type=int, default=0, help="host-mode gates checked one by one")
    ap.add_argument("--timeout", type=float, help="FASTCOLL_TIMEOUT of the ranks (default 60; kill: 20)")
    ap.add_argument("--out", default=str(harness.REPO_ROOT / "bench" / "out"))
    ap.add_argument("--rank-of", dest="run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.timeout = args.timeout or (20.0 if args.what == "kill" else 60.0)
    if args.run:  # a rank: this rank on GPU gpus[local rank] before MLX starts, as CUDA_VISIBLE_DEVICES says
        gpus = [g for g in args.gpus.split(",") if g]
        if gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(os.environ.get("FASTCOLL_LOCAL_RANK", "0")) % len(gpus)]
        doc = (killworker if args.what == "kill" else worker)(args)
        print(json.dumps({"gate_run": args.run, **doc}), flush=True)
    elif args.what == "kill":
        for run, env in (("kill_direct", RUNS["gate"]), ("kill_hostmode", HOST_MODE)):
            docs = job(run, env, args, [], 3 * args.timeout + 60, grace=3 * args.timeout)
            print(f"{run}: {json.dumps(docs[0]) if docs else 'no result'}", flush=True)
    else:
        if args.what == "profile":
            args.rows, args.ops = f"{ROW}:bfloat16", 100
        cmd_ranks(args)


if __name__ == "__main__":
    main()
