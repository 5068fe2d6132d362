"""Tensor-parallel decode on one host: mlx-lm's own generation loop (`generate_step`, greedy) on a
llama of random weights, one process beside ranks through fastcoll, in one run (docs/gate.md).

    python bench/decode_bench.py [--shape 8b] [--tokens 64] [--runs single,host,gate] [--out DIR]

Each run is `bench/workers/tp_worker.py` on MLX's default device (bfloat16): `single` the whole
model in one process; the others its ranks, started by `fastcoll-launch` under
`-m fastcoll.mlx_compat` with `model.shard(group)`, as a user would, with the environment in
RUNS (NAME#2 runs NAME again); `floor` is those ranks with the model's all-reduces left out
(`tp_worker.py --no-exchange`, wrong tokens by design): what two ranks cost before any exchange.
Without a GPU the gate is off and its runs take the host path.
Prints ms per token against the single process and whether each run made the host path's tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness  # noqa: E402
from bench.report import save  # noqa: E402
from bench.systems import launcher  # noqa: E402

WORKER = harness.REPO_ROOT / "bench" / "workers" / "tp_worker.py"
SHAPES = {  # tp_worker's model arguments: Llama 3 8B's shape, a smoke test for any machine, and the
    # three of bench/hostbed.py's decode part (on the bed's CPUs); each names its layers second
    "8b": "--hidden 4096 --layers 32 --intermediate 14336 --heads 32 --kv-heads 8 --vocab 128256",
    "tiny": "--hidden 256 --layers 2 --intermediate 512 --heads 4 --kv-heads 2 --vocab 1000",
    "small": "--hidden 256 --layers 4 --heads 8 --kv-heads 8 --intermediate 688 --vocab 4096",
    "smaller": "--hidden 128 --layers 4 --heads 4 --kv-heads 4 --intermediate 344 --vocab 1024",
    "large": "--hidden 512 --layers 8 --heads 8 --kv-heads 8 --intermediate 1408 --vocab 8192",
}
# Every run of ranks takes the eager path (FASTCOLL_MLX_GRAPH=0), which the gate is part of: `host`
# is the host path, not graph mode (the default under fastcoll.mlx_compat).
EAGER = {"FASTCOLL_MLX_GRAPH": "0"}
GATE = EAGER | {"FASTCOLL_FAST_SYNC": "1"}
RUNS = {"single": {}, "host": EAGER | {"FASTCOLL_FAST_SYNC": "0"}, "gate": GATE,
        "gate_host_mode": GATE | {"FASTCOLL_TUNING": "gate_direct=0"},
        "gate_profile": GATE | {"FASTCOLL_GATE_PROFILE": "1"}, "floor": EAGER}


def command(name: str, args: argparse.Namespace, launch: list[str] | None = None) -> list[str]:
    """One run's processes: the single process itself, or its ranks through fastcoll-launch
    (`launch`: its command line across hosts, bench/hostbed.py's gate part)."""
    worker = [str(WORKER), "--mode", "single" if name == "single" else "tp", *SHAPES[args.shape].split(),
              "--dtype", "bfloat16", "--device", "gpu", "--tokens", str(args.tokens), "--repeat", str(args.repeat)]
    if name == "single":
        return [sys.executable, *worker]
    if name == "floor":
        worker.append("--no-exchange")
    launch = launch or [*launcher(), "-n", str(args.world), "--timeout", str(args.timeout)]
    return [*launch, sys.executable, "-m", "fastcoll.mlx_compat", *worker]


def one_run(run: str, args: argparse.Namespace) -> dict:
    """One run's RESULT document (rank 0's), or {"error": ...}."""
    name = run.split("#")[0]
    res = harness.run_job([(command(name, args), dict(RUNS[name], FASTCOLL_TIMEOUT="120"))],
                          args.timeout + 30, key="ms_per_token")
    print(f"--- {run}: {res.error or 'ok'} in {res.wall_s:.0f} s\n{res.output[-2000:] if res.error else ''}", flush=True)
    return res.doc if res.doc is not None else {"error": res.error}


def report(results: dict[str, dict], args: argparse.Namespace) -> list[str]:
    """The table of every run against the single process, and whose tokens match the host path's."""
    single = results.get("single", {}).get("ms_per_token")
    host = results.get("host", results.get("single", {})).get("tokens")  # one process's where the host path did not run
    lines = [f"Decode, llama {args.shape} shape, bf16, random weights, {args.tokens} tokens a run (ms per "
             f"token after the first, median of {args.repeat} runs), mlx_lm.generate.generate_step, greedy:", "",
             "| run | ms per token | tokens/s | against single | the host path's (else single's) tokens |",
             "| --- | --- | --- | --- | --- |"]
    for run, doc in results.items():
        if "ms_per_token" not in doc:
            lines.append(f"| {run} | failed: {doc.get('error')} | | | |")
            continue
        ms = doc["ms_per_token"]
        against = f"{ms / single:.2f}x" if single else "-"
        same = "-" if host is None or run == "host" else str(doc["tokens"] == host)
        same += " (a floor)" if run.startswith("floor") else ""
        lines.append(f"| {run} | {ms:.2f} | {1000 / ms:.1f} | {against} | {same} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2, help="runs of --tokens in each process")
    ap.add_argument("--runs", default="single,host,gate")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(harness.REPO_ROOT / "bench" / "out"))
    args = ap.parse_args()
    unknown = [r for r in args.runs.split(",") if r.split("#")[0] not in RUNS]
    if unknown:
        sys.exit(f"unknown run {unknown[0]!r}; known: {', '.join(RUNS)} (and NAME#N)")
    results = {run: one_run(run, args) for run in args.runs.split(",")}
    text = "\n".join(report(results, args)) + "\n"
    print(text, end="")
    save(Path(args.out), f"decode_{args.shape}", text)
    save(Path(args.out), f"decode_{args.shape}", results)


if __name__ == "__main__":
    main()
