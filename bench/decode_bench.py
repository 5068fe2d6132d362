"""Tensor-parallel decode through mlx-lm's own generation loop (generate_step, greedy), on a llama
of random weights made here: one process unsharded, ranks on fastcoll's host path, ranks through
the fence gate, in one run (docs/gate.md has every option and environment variable).

    python bench/decode_bench.py [--shape 8b] [--tokens 64] [--runs single,host,gate] [--out DIR]

Ranks start through `fastcoll-launch` and run `model.shard(group)` under `fastcoll.mlx_compat`,
as a user would. Prints each run's ms per token against the single process, and whether the
gated runs generated the host path's tokens. Runs: RUNS; NAME_bound is NAME under
`fastcoll-launch --bind-to cores`, NAME#2 NAME again.
Without a GPU the gate is off (its runs take the host path); `--shape tiny` runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpus, harness  # noqa: E402
from bench.gate_bench import ProfileLines  # noqa: E402
from bench.systems import tool  # noqa: E402

SHAPES = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),  # Llama 3 8B's shape
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000),  # a smoke test, on any machine
}
PROMPT, WARMUP = 16, 8  # prompt tokens; tokens left out of the timing (prompt, compilation, first gates)
GATE, TUNE = {"FASTCOLL_FAST_SYNC": "1"}, "FASTCOLL_TUNING"
RUNS = {"single": {}, "single_pair": {}, "host": {"FASTCOLL_FAST_SYNC": "0"}, "gate": GATE,
        "gate_profile": GATE | {"FASTCOLL_GATE_PROFILE": "1"}, "gate_host_mode": GATE | {TUNE: "gate_direct=0"},
        "gate_watch1": GATE | {TUNE: "gate_watch_ms=1"},
        **{f"floor_{k}": {"FASTCOLL_FAST_SYNC": "0", "DECODE_FLOOR": k} for k in ("identity", "kernel", "custom")}}


def make_model(shape: str, seed: int = 0):
    """The same random bf16 llama in every process (one seed, one construction order)."""
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                           tie_word_embeddings=False, **SHAPES[shape])
    mx.random.seed(seed)
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    return model


def timed(fn, into: list[float]):
    """fn, appending the ms each call takes to `into`."""
    def call(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        into.append((time.perf_counter() - t) * 1e3)
        return out

    return call


class HostTimes:
    """The model, with the host's time per token measured: building its graph (the model call)
    and handing it to the GPU (mx.async_eval, which mlx_lm.generate calls by name)."""

    def __init__(self, model):
        import mlx.core as mx

        self.build, self.submit = [], []
        self._model, self._call = model, timed(model, self.build)
        mx.async_eval = timed(mx.async_eval, self.submit)

    def __call__(self, *a, **k):
        return self._call(*a, **k)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def summary(self) -> dict:
        med = lambda v: float(np.median(v[WARMUP:])) if len(v) > WARMUP else None
        return {"build_median": med(self.build), "async_eval_median": med(self.submit)}


def decode(model, n: int, after_warmup=None) -> dict:
    """Greedy decode of n tokens from a fixed random prompt: the tokens and the ms between them."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = mx.array(np.random.default_rng(1).integers(0, model.args.vocab_size, PROMPT), dtype=mx.uint32)
    host = HostTimes(model) if os.environ.get("DECODE_HOST_TIMES") == "1" else None
    stamps, tokens, threads = [], [], None
    for token, _ in generate_step(prompt, host or model, max_tokens=n):
        stamps.append(time.perf_counter())
        tokens.append(int(token))
        if len(tokens) == WARMUP:
            if after_warmup is not None:
                after_warmup()
            if os.environ.get("DECODE_THREADS") == "1" and Path("/proc/self/task").is_dir():
                threads = cpus.Threads()
    gaps = np.diff(stamps[WARMUP:]) * 1e3
    res = {"tokens": tokens, "ms_per_token": {"median": float(np.median(gaps)), "n": int(gaps.size),
                                              "p90": float(np.percentile(gaps, 90))}}
    if host is not None:
        res["host_ms"] = host.summary()
    if threads is not None:
        res["threads"] = threads.summary(stamps[-1] - stamps[WARMUP - 1])
    return res


def host_costs(sharded: bool, n: int = 64, reps: int = 12) -> dict:
    """The host's cost of one call (its build, us) and of evaluating n dependent ones (ms), for
    y + 1, a copy kernel (CUDA), fastcoll.all_reduce, mx.distributed.all_sum and mlx.nn's
    sum_gradients of a (1, 1, 4096) bf16 row, a decode step's all-reduce; medians over `reps`."""
    import mlx.core as mx

    x = mx.zeros((1, 1, 4096), dtype=mx.bfloat16)
    mx.eval(x)

    def per(fn) -> dict:
        builds, evals = [], []
        for _ in range(reps + 2):
            t0, y = time.perf_counter(), x
            for _ in range(n):
                y = fn(y)
            t1 = time.perf_counter()
            mx.eval(y)
            builds.append((t1 - t0) / n * 1e6)
            evals.append((time.perf_counter() - t1) * 1e3)
        return {"build_us_per_call": round(float(np.median(builds[2:])), 2),
                f"eval_ms_per_{n}": round(float(np.median(evals[2:])), 3)}

    out = {"plus_one": per(lambda y: y + 1)}
    if mx.cuda.is_available():
        out["custom_kernel_copy"] = per(floor_all_sum("kernel"))
    if sharded:
        import fastcoll
        from mlx.nn.layers.distributed import sum_gradients

        out["fastcoll_all_reduce"] = per(lambda y: fastcoll.all_reduce(y, op="sum"))
        out["mx_distributed_all_sum"] = per(lambda y: mx.distributed.all_sum(y))
        out["sum_gradients"] = per(sum_gradients(mx.distributed.init()))  # mlx.nn's sharded linears' wrapper
    return out


def floor_all_sum(kind: str):
    """An all_sum that exchanges nothing (wrong values: a floor, never a result), to stand in for
    mx.distributed.all_sum in a sharded rank: it costs (identity) nothing, (kernel) one bare
    mx.fast.cuda_kernel copy in threadgroups of 256, or (custom) that call inside an
    mx.custom_function with a vjp, as any differentiable collective made through MLX's API has."""
    import mlx.core as mx

    if kind not in ("identity", "kernel", "custom"):
        raise ValueError(f"DECODE_FLOOR={kind!r}: identity, kernel or custom")
    if kind == "identity":
        return lambda x, *, group=None, stream=None: x
    if not mx.cuda.is_available():
        raise RuntimeError(f"DECODE_FLOOR={kind}: the copy kernel needs MLX's CUDA backend")
    copy = mx.fast.cuda_kernel(name="decode_bench_floor_copy", input_names=["y"], output_names=["out"],
                               source="const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\nout[i] = y[i];\n")

    def kernel(x, *, group=None, stream=None):
        if x.size % 256:
            raise ValueError(f"the floor's copy kernel needs a multiple of 256 elements, not {x.size}")
        return copy(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                    output_dtypes=[x.dtype])[0]

    if kind == "kernel":
        return kernel
    differentiable = mx.custom_function(lambda x: kernel(x))
    differentiable.vjp(lambda primals, cotangent, output: cotangent)
    return lambda x, *, group=None, stream=None: differentiable(x)


def sharded(model) -> tuple[int, str]:
    """Shard the model over fastcoll under mx.distributed (and a DECODE_FLOOR's all_sum)."""
    import mlx.core as mx

    from fastcoll import mlx_compat

    mlx_compat.install()
    group = mx.distributed.init()
    model.shard(group)
    if os.environ.get("DECODE_FLOOR"):  # after install(): mlx.nn's layers call it by name
        mx.distributed.all_sum = floor_all_sum(os.environ["DECODE_FLOOR"])
    return group.rank(), group.fastcoll_group.transport_info()


def rank_main(args: argparse.Namespace) -> None:
    """One rank (or the single process): build, shard, evaluate the weights, decode; print the result."""
    import mlx.core as mx

    profile, model = ProfileLines(), make_model(args.shape)
    rank, info = int(os.environ.get("FASTCOLL_RANK", "0")), "single process"  # (a rank of single_pair)
    if args.run != "single":
        rank, info = sharded(model)
    t0 = time.perf_counter()
    mx.eval(model.parameters())
    res = {"decode_run": args.run, "rank": rank, "transport": info, "load_s": time.perf_counter() - t0}
    if os.environ.get("DECODE_HOST_COSTS") == "1":
        res["host_costs"] = host_costs(args.run != "single")
    def warmed_up() -> None:  # from the end of the warm-up (not the prompt's step, not compiling)
        spy = os.environ.get("DECODE_PYSPY")
        if spy and rank == 0:
            how = ["--native"] if os.environ.get("DECODE_PYSPY_NATIVE") == "1" else ["--nonblocking"]
            subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--duration", "3", "--rate", "400", "--idle",
                              "--threads", *how, "--format", "raw", "-o", f"{args.pyspy}.rank{rank}.txt"])

    res |= decode(model, args.tokens, warmed_up)
    if args.run != "single":
        import fastcoll

        fastcoll.check()
        fastcoll.finalize()
    res |= {"profile": profile.lines[-1] if profile.lines else None, "mlx": mx.__version__,
            "device": str(mx.default_device())}
    print(json.dumps(res), flush=True)


def command(run: str, name: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The run's processes: the single process itself, or its ranks through fastcoll-launch."""
    cmd = [sys.executable, __file__, "--rank-main", "single" if name == "single_pair" else name,
           "--shape", args.shape, "--tokens", str(args.tokens), "--pyspy", str(out / f"decode_{args.shape}_{run}.pyspy")]
    if name == "single":
        return cmd
    return [tool("fastcoll-launch") or "fastcoll-launch", "-n", str(args.world), "--timeout", str(args.timeout),
            "--bind-to", "cores" if run.split("#")[0].endswith("_bound") else "none", *cmd]


def one_run(run: str, args: argparse.Namespace, out: Path) -> list[dict]:
    """One run (see RUNS); every rank's result, rank 0's first."""
    name = run.split("#")[0].removesuffix("_bound")
    ticks = cpus.cpu_ticks()
    res = harness.run_job([(command(run, name, args, out), dict(RUNS[name], FASTCOLL_TIMEOUT="120"))],
                          args.timeout + 30, key="decode_run")
    stolen = cpus.steal_share(ticks, cpus.cpu_ticks(), sorted(ticks))
    print(f"--- {run}: {res.error or 'ok'} in {res.wall_s:.0f} s; the most any CPU lost to the hypervisor: "
          f"{max(stolen.values(), default=0)}\n{res.output[-2000:] if res.error else ''}", flush=True)
    docs = sorted(harness.documents(res.output, "decode_run"), key=lambda d: d["rank"])
    (out / f"decode_{args.shape}_{run.replace('#', '_')}.json").write_text(json.dumps(docs))
    return docs


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> list[str]:
    """The table of every run against the single process, and the gated runs' tokens."""
    single = results.get("single", [{}])[0].get("ms_per_token", {}).get("median")
    lines = [f"Decode, llama {args.shape} shape, bf16, random weights, {args.tokens} tokens (median of the last "
             f"{args.tokens - WARMUP - 1} gaps), mlx_lm.generate.generate_step, greedy:", "",
             "| run | ranks | ms per token, rank 0 (rank 1) | p90 | tokens/s | against single |",
             "| --- | --- | --- | --- | --- | --- |"]
    for run, docs in results.items():
        m = docs[0]["ms_per_token"]
        others = "".join(f" ({d['ms_per_token']['median']:.2f})" for d in docs[1:2])
        lines.append(f"| {run} | {len(docs)} | {m['median']:.2f}{others} | {m['p90']:.2f} | {1000 / m['median']:.1f} | "
                     + (f"{m['median'] / single:.2f}x |" if single else "- |"))
    host = results.get("host", [{}])[0].get("tokens")
    for run, docs in results.items():
        if run.startswith("gate") and host:
            lines.append(f"\n{run} generated the same {len(host)} tokens as the host path: {docs[0]['tokens'] == host}")
        for d in docs:
            for key in ("host_ms", "host_costs", "profile"):
                if d.get(key):
                    lines.append(f"\n{run} rank {d['rank']} {key}: {d[key]}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", default="single,host,gate")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(harness.REPO_ROOT / "bench" / "out"))
    ap.add_argument("--rank-main", dest="run", help=argparse.SUPPRESS)
    ap.add_argument("--pyspy", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        return rank_main(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    unknown = [r for r in args.runs.split(",") if r.split("#")[0].removesuffix("_bound") not in RUNS]
    if unknown:
        sys.exit(f"unknown run {unknown[0]!r}; known: {', '.join(RUNS)} (and NAME_bound, NAME#N)")
    results = {run: docs for run in args.runs.split(",") if (docs := one_run(run, args, out))}
    lines = report(results, args)
    print("\n".join(lines))
    (out / f"decode_{args.shape}.md").write_text("\n".join(lines) + "\n")
    (out / f"decode_{args.shape}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
