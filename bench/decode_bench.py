"""Tensor-parallel decode through mlx-lm's own generation loop, on a llama of random weights made
here (no download): one process unsharded, two ranks on fastcoll's host path, two ranks through
the fence gate, in one run.

    python bench/decode_bench.py [--shape 8b] [--tokens 64] [--runs single,host,gate] [--out DIR]

The loop is `mlx_lm.generate.generate_step` (greedy), which builds the next token's graph while
this one runs (mx.async_eval). Ranks run `model.shard(group)` under `fastcoll.mlx_compat`, as a
user would. Two ranks on one GPU need CUDA MPS running. Prints ms per token and tokens/s for
each run, and checks that the gate and the host path generated the same tokens.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    # Llama 3 8B's shape
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    "2b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=16,
               num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000),  # a smoke test, on any machine
}
PROMPT = 16  # prompt tokens
WARMUP = 8  # tokens left out of the timing (the prompt's step, compilation, first gates)


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


def decode(model, n: int) -> dict:
    """Greedy decode of n tokens from a fixed random prompt; the tokens and ms between them."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = mx.array(np.random.default_rng(1).integers(0, model.args.vocab_size, PROMPT), dtype=mx.uint32)
    stamps, tokens = [], []
    for token, _ in generate_step(prompt, model, max_tokens=n):
        stamps.append(time.perf_counter())
        tokens.append(int(token))
    gaps = np.diff(stamps[WARMUP:]) * 1e3
    return {"tokens": tokens, "ms_per_token": {"median": float(np.median(gaps)), "p10": float(np.percentile(gaps, 10)),
                                               "p90": float(np.percentile(gaps, 90)), "n": int(gaps.size)}}


def rank_main(args) -> None:
    """One rank (or the single process): build, shard, evaluate the weights, decode."""
    import mlx.core as mx

    if os.environ.get("DECODE_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["DECODE_SWITCH_INTERVAL"]))
    model = make_model(args.shape)
    rank, info = 0, "single process"
    if args.run != "single":
        from fastcoll import mlx_compat

        mlx_compat.install()
        group = mx.distributed.init()
        model.shard(group)
        rank, info = group.rank(), group.fastcoll_group.transport_info()
    t0 = time.perf_counter()
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    res = decode(model, args.tokens)
    res.update(run=args.run, shape=args.shape, rank=rank, transport=info, load_s=load_s,
               gated=os.environ.get("FASTCOLL_FAST_SYNC") == "1", mlx=mx.__version__,
               device=str(mx.default_device()), switch_interval_s=sys.getswitchinterval())
    if args.run != "single":
        import fastcoll

        fastcoll.check()
        gate = fastcoll.lifecycle.resolve(None)._job.gate
        res["gate_used"] = gate is not None
        if gate is not None and gate.profile() is not None:
            res["profile"] = gate.profile().summary()
        fastcoll.finalize()
    if rank == 0:
        Path(args.result).write_text(json.dumps(res))
    print(f"rank {rank} {args.run}: {res['ms_per_token']['median']:.2f} ms per token", flush=True)


RUNS = {
    "single": {},
    "host": {"FASTCOLL_FAST_SYNC": "0"},
    "gate": {"FASTCOLL_FAST_SYNC": "1"},
    "gate_profile": {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_GATE_PROFILE": "1"},
    # the host mode of the gate where the direct mode would apply (ranks of one host)
    "gate_host_mode": {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_TUNING": "gate_direct=0"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", default="single,host,gate")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    ap.add_argument("--rank-main", dest="run", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        rank_main(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for i, run in enumerate(args.runs.split(",")):
        name = run.split("@")[0]  # gate@0.0002: the gate with sys.setswitchinterval(0.0002)
        result = out / f"decode_{args.shape}_{run.replace('@', '_si')}.json"
        world = 1 if name == "single" else args.world
        port = 29600 + (os.getpid() % 200) + i
        procs = []
        for r in range(world):
            env = dict(os.environ, PYTHONUNBUFFERED="1", **RUNS[name])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            if "@" in run:
                env["DECODE_SWITCH_INTERVAL"] = run.split("@")[1]
            if world > 1:
                env.update(FASTCOLL_RANK=str(r), FASTCOLL_WORLD_SIZE=str(world), FASTCOLL_TIMEOUT="120",
                           FASTCOLL_COORDINATOR=f"127.0.0.1:{port}", FASTCOLL_TOKEN="decode-bench")
            cmd = [sys.executable, __file__, "--rank-main", name, "--result", str(result),
                   "--shape", args.shape, "--tokens", str(args.tokens)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        codes = []
        for r, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            codes.append(p.returncode)
            print(f"--- {run} rank {r} (exit {p.returncode}) ---\n{text[-1500:]}", flush=True)
        if result.exists() and not any(codes):
            results[run] = json.loads(result.read_text())
    print(f"\nDecode, llama {args.shape} shape, bf16, random weights, {args.tokens} tokens (median of the last "
          f"{args.tokens - WARMUP - 1} gaps), mlx_lm.generate.generate_step, greedy:\n")
    print("| run | ranks | ms per token (median) | p90 | tokens/s |")
    print("| --- | --- | --- | --- | --- |")
    for run, r in results.items():
        m = r["ms_per_token"]
        print(f"| {run} | {1 if r['run'] == 'single' else args.world} | {m['median']:.2f} | {m['p90']:.2f} | "
              f"{1000 / m['median']:.1f} |")
    host = results.get("host", {}).get("tokens")
    for run, r in results.items():
        if r["run"].startswith("gate") and host is not None:
            same = r["tokens"] == host
            print(f"\n{run} generated the same {len(host)} tokens as the host path: {same}")
            r["same_tokens_as_host"] = same
    (out / f"decode_{args.shape}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
