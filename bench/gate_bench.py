"""The fence gate through fastcoll's public API: chains of dependent all-reduces beside the host
path, the gate's own per-gate timings, and a peer killed mid-token (docs/gate.md).

    python bench/gate_bench.py ranks [--world 2] [--gpus 0,0] [--tokens 20] [--rows 4096:bfloat16]
                                     [--exact N] [--out DIR]
    python bench/gate_bench.py profile [--world 2] [--gpus 0,0] [--tokens 10] [--out DIR]
    python bench/gate_bench.py kill [--timeout 20] [--out DIR]

A token is LAYERS dependent all-reduces y = all_reduce(y + 1, "mean") of a row, checked to give
LAYERS; "serial" builds it, then evaluates it, "pipelined" builds token t + 1 while t runs. Runs,
each a job of --world ranks here: `host` (FASTCOLL_FAST_SYNC=0), `gate` (=1: the direct mode where
the GPUs share memory), `gatehost` (also FASTCOLL_TUNING=gate_direct=0: the host mode); `profile`
runs both gates with FASTCOLL_GATE_PROFILE=1 and keeps the summary they log. Without a GPU the
gate is off and every run takes the host path. Two ranks on one GPU (--gpus 0,0) need CUDA MPS.
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
from bench.systems import fastcoll_ranks  # noqa: E402

LAYERS = 64  # all-reduces per token
ROW = 4096  # elements of a row: bf16 hidden size 4096 = 8 KiB
HOST_MODE = {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1"}
RUNS = {"host": {"FASTCOLL_FAST_SYNC": "0"}, "gate": {"FASTCOLL_FAST_SYNC": "1"}, "gatehost": HOST_MODE}
OUT = harness.REPO_ROOT / "bench" / "out"


def ms(samples: list[float]) -> dict:
    """Median, p90 and count of durations in seconds, in milliseconds."""
    s = metrics.summarize(samples)
    return {"median": s["median_s"] * 1e3, "p90": s["p90_s"] * 1e3, "n": len(samples)}


def chain(y, op: str = "mean"):
    """One token: LAYERS dependent all-reduces."""
    import fastcoll

    for _ in range(LAYERS):
        y = fastcoll.all_reduce(y + 1, op=op)
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
            ys = [fastcoll.all_reduce(mx.full((1024,), float(rank + 1 + (t * 64 + j) % 7), dtype=mx.float32))
                  for j in range(64)]
            mx.eval(*ys)
            wrong += sum(not np.all(np.array(y) == sum(p + 1 + (t * 64 + j) % 7 for p in range(size)))
                         for j, y in enumerate(ys))
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


def use_gpu(gpus: str) -> None:
    """Before MLX starts: this rank on GPU gpus[local rank] (MLX takes device 0 of those visible)."""
    listed = [g for g in gpus.split(",") if g]
    if listed:
        os.environ["CUDA_VISIBLE_DEVICES"] = listed[int(os.environ.get("FASTCOLL_LOCAL_RANK", "0")) % len(listed)]


def worker(args: argparse.Namespace) -> None:
    """One rank of a run: its rows' chains (and --exact gates); every rank prints its document."""
    use_gpu(args.gpus)
    import mlx.core as mx

    import fastcoll

    profile = ProfileLines()
    g = fastcoll.init()
    res = {"gate_run": args.run, "rank": g.rank(), "size": g.size(), "transport": g.transport_info(),
           "device": str(mx.default_device()), "mlx": mx.__version__,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("FASTCOLL_FAST", "FASTCOLL_TUN", "CUDA_VIS"))}}
    for row, name in rows(args.rows):
        y, times = mx.zeros((row,), getattr(mx, name)), []
        for _ in range(args.ops + 20):  # each all-reduce evaluated, as the host path always is
            t0 = time.perf_counter()
            y = fastcoll.all_reduce(y + 1, op="mean")
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
    res["profile"] = profile.lines[-1] if profile.lines else None
    print(json.dumps(res), flush=True)


def killworker(args: argparse.Namespace) -> None:
    """Rank 1 dies (SIGKILL) halfway through a token; rank 0 reports how long its error took and
    whether its GPU still runs."""
    import mlx.core as mx

    import fastcoll

    g = fastcoll.init()
    y = chain(mx.zeros((ROW,), dtype=mx.bfloat16))
    mx.eval(y)  # one whole token first: both ranks are up
    for _ in range(LAYERS // 2):
        y = fastcoll.all_reduce(y + 1, op="mean")
    mx.eval(y)
    if g.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # rank 0 waits for it in the second half
    res = {"gate_run": args.run, "timeout_s": float(os.environ["FASTCOLL_TIMEOUT"]), "error": None}
    t0 = time.perf_counter()
    try:
        for _ in range(LAYERS // 2):  # the host path raises here, the gate at the evaluation
            y = fastcoll.all_reduce(y + 1, op="mean")
        mx.eval(y)
        fastcoll.check()
    except fastcoll.FastcollError as e:
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds_to_error"] = time.perf_counter() - t0
    z = mx.arange(1024, dtype=mx.float32) * 2
    res["device_runs_after"] = bool(float(z[3].item()) == 6.0)
    print(json.dumps(res), flush=True)
    fastcoll.finalize()


def job(run: str, env: dict, args: argparse.Namespace, more: list[str], timeout: float, grace: float = 5) -> list[dict]:
    """One run's job of args.world ranks; every rank's document, rank 0's first."""
    argv = [sys.executable, __file__, "kill" if "kill" in run else "ranks", "--rank-of", run, *more]
    cmds = fastcoll_ranks(args.world, argv, env | {"FASTCOLL_TIMEOUT": str(args.timeout)})
    res = harness.run_job(cmds, timeout, key="gate_run", grace=grace)
    docs = sorted(harness.documents(res.output, "gate_run"), key=lambda d: d.get("rank", 0))
    print(f"--- {run}: {res.error or 'ok'} in {res.wall_s:.1f} s", flush=True)
    if res.error and not docs:
        print(res.output[-3000:], flush=True)
    return docs


def save(out: Path, name: str, data: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))


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
    return lines


def cmd_ranks(args: argparse.Namespace, runs: dict[str, dict]) -> dict[str, list[dict]]:
    """Each run's job (the profile runs: FASTCOLL_GATE_PROFILE=1, 8 KiB rows); their documents."""
    docs = {}
    for run, env in runs.items():
        more = ["--gpus", args.gpus, "--rows", args.rows, "--ops", str(args.ops), "--tokens", str(args.tokens)]
        if run == "gatehost" and args.exact:
            more += ["--exact", str(args.exact)]
        docs[run] = job(run, env, args, more, args.timeout * 5)
        save(Path(args.out), f"{args.tag_prefix}{run}", docs[run])
    lines = table(docs, [f"{name}_{n}" for n, name in rows(args.rows)])
    for run, d in ((run, d) for run, ds in docs.items() for d in ds):
        if d.get("exact"):
            lines.append(f"\n{run} rank {d['rank']}: {d['exact']['gates']} gates checked one by one, "
                         f"{d['exact']['wrong']} wrong, error {d['exact']['error']}")
        if "FASTCOLL_GATE_PROFILE" in runs[run]:
            lines.append(f"\n{run} rank {d['rank']}: {d.get('profile') or 'no gate profile was logged (no gate ran)'}")
    print("\n".join(lines), flush=True)
    (Path(args.out) / f"{args.tag_prefix}results.md").write_text("\n".join(lines) + "\n")
    return docs


def cmd_kill(args: argparse.Namespace) -> None:
    """A peer SIGKILLed mid-token, in the gate's direct mode and in its host mode."""
    for run, env in (("kill_direct", RUNS["gate"]), ("kill_hostmode", HOST_MODE)):
        docs = job(run, env, args, [], 3 * args.timeout + 60, grace=3 * args.timeout)
        save(Path(args.out), run, docs[0] if docs else {"error": "no result"})
        print(f"{run}: {json.dumps(docs[0]) if docs else 'no result'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("ranks", "profile", "kill"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--gpus", default="", help="GPU of each rank, e.g. 0,1 (default: what CUDA gives)")
    ap.add_argument("--ops", type=int, default=300, help="evaluated all-reduces per row, timed one by one")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--rows", default=f"16:float32,{ROW}:bfloat16,8192:bfloat16",
                    help="elements:dtype of each row to measure, comma-separated")
    ap.add_argument("--exact", type=int, default=0, help="host-mode gates checked one by one")
    ap.add_argument("--timeout", type=float, help="FASTCOLL_TIMEOUT of the ranks (default 60; kill: 20)")
    ap.add_argument("--tag-prefix", default="gate_ranks_", help="the names of the JSON files written")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.timeout = args.timeout or (20.0 if args.what == "kill" else 60.0)
    if args.rank_of:
        args.run = args.rank_of
        (killworker if args.what == "kill" else worker)(args)
    elif args.what == "kill":
        cmd_kill(args)
    elif args.what == "profile":
        args.rows, args.ops, args.tag_prefix = f"{ROW}:bfloat16", 100, "gate_profile_"
        profiled = {k: v | {"FASTCOLL_GATE_PROFILE": "1"} for k, v in RUNS.items() if k != "host"}
        cmd_ranks(args, {"host": RUNS["host"]} | profiled)
    else:
        cmd_ranks(args, RUNS)


if __name__ == "__main__":
    main()
