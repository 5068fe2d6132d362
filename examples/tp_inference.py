"""Tensor-parallel inference: mlx-lm's llama, sharded with model.shard(group), on fastcoll.

    fastcoll-launch -n 2 python examples/tp_inference.py
    python examples/tp_inference.py                       # a world of one

mlx-lm's code is used unchanged: `fastcoll.mlx_compat.install()` routes the `mx.distributed`
calls it makes (mx.distributed.init, and the all_sum inside mlx.nn's ShardedToAllLinear) to
fastcoll. The model is built from a small ModelArgs config with seeded random weights, so no
download is needed and every rank builds the same model.

What it checks and prints (rank 0):
- the sharded model's logits for the prompt equal the single-process model's within float32
  tolerance (checked on every rank: each builds the unsharded model from the same seed);
- greedy generation gives the same tokens sharded and single-process;
- tokens per second of the sharded generation, beside the single-process figure (measured on
  rank 0 alone while the other ranks wait, so that it has the machine to itself); each is the
  median of `--repeat` generations, and counts the tokens after the first (the first token's
  time is the prompt's prefill).
The last line is `RESULT logits_ok=0|1 tokens_equal=0|1 ...`; the exit status is 0 only when
both hold on every rank.
Needs mlx-lm (`pip install "mlx-lm>=0.28"`, or `pip install ".[lm]"` in fastcoll's clone).
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

import fastcoll
from fastcoll import mlx_compat


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads (default 4)")
    p.add_argument("--intermediate", type=int, default=1408, help="MLP size (default 1408)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (default 16)")
    p.add_argument("--tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt seed (default 0)")
    p.add_argument("--repeat", type=int, default=3, help="timed generations of each kind; the median is printed (default 3)")
    p.add_argument("--rtol", type=float, default=1e-4, help="logits tolerance, relative to max |logit|")
    p.add_argument("--no-single", action="store_true", help="skip the timed single-process run")
    return p.parse_args(argv)


def build_model(a: argparse.Namespace):
    """The llama model of this config with seeded random weights (the same on every rank)."""
    from mlx_lm.models import llama

    config = llama.ModelArgs(
        model_type="llama",
        hidden_size=a.hidden,
        num_hidden_layers=a.layers,
        intermediate_size=a.intermediate,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=a.vocab,
        tie_word_embeddings=False,
    )
    mx.random.seed(a.seed)
    model = llama.Model(config)
    mx.eval(model.parameters())
    return model


def generate(model, prompt: mx.array, n: int) -> tuple[list[int], float]:
    """Greedy tokens and the decode rate (tokens/s after the first, which includes the prefill)."""
    from mlx_lm.generate import generate_step

    tokens, t_first = [], None
    for token, _ in generate_step(prompt, model, max_tokens=n):
        tokens.append(int(token))
        if t_first is None:
            t_first = time.perf_counter()
    elapsed = time.perf_counter() - t_first
    return tokens, (len(tokens) - 1) / elapsed if elapsed > 0 and len(tokens) > 1 else float("nan")


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import mlx_lm  # noqa: F401
    except ImportError:
        print("tp_inference needs mlx-lm: pip install 'mlx-lm>=0.28' (or, in fastcoll's clone, "
              "pip install '.[lm]')", file=sys.stderr)
        return 2
    mlx_compat.install()
    group = mx.distributed.init()  # fastcoll's group, seen as an mx.distributed.Group
    rank, size = group.rank(), group.size()
    if a.heads % size or a.kv_heads % size:
        raise SystemExit(f"--heads {a.heads} and --kv-heads {a.kv_heads} must divide by the world size {size}")

    prompt = mx.array(np.random.default_rng(a.seed).integers(0, a.vocab, size=a.prompt_len), dtype=mx.uint32)

    # The single-process reference: the whole model, on every rank (for the logits check).
    full = build_model(a)
    params = sum(v.size for _, v in tree_flatten(full.parameters()))
    ref_logits = full(prompt[None])
    mx.eval(ref_logits)

    # The sharded model: the same weights, then mlx-lm's own shard(), over fastcoll.
    model = build_model(a)
    model.shard(group)
    mx.eval(model.parameters())
    logits = model(prompt[None])
    mx.eval(logits)
    ref = np.array(ref_logits, dtype=np.float64)
    diff = float(np.max(np.abs(np.array(logits, dtype=np.float64) - ref)))
    tol = a.rtol * max(1.0, float(np.max(np.abs(ref))))
    logits_ok = diff <= tol

    # Timed single-process generation on rank 0 while the others wait.
    single_tokens, single_tps = None, float("nan")
    if not a.no_single and rank == 0:
        runs = [generate(full, prompt, a.tokens) for _ in range(max(1, a.repeat))]
        single_tokens, single_tps = runs[0][0], float(np.median([tps for _, tps in runs]))
    del full
    fastcoll.barrier()

    runs = [generate(model, prompt, a.tokens) for _ in range(max(1, a.repeat))]
    tp_tokens, tp_tps = runs[0][0], float(np.median([tps for _, tps in runs]))
    tokens_equal = single_tokens is None or single_tokens == tp_tokens

    # Every rank's verdict, so that every rank exits with the same status.
    ok = mx.distributed.all_min(mx.array([int(logits_ok), int(tokens_equal)], dtype=mx.int32))
    logits_all, tokens_all = (int(v) for v in np.array(ok))
    if rank == 0:
        # Worded as examples/allreduce.py words it: what carries the messages, shared memory too.
        transport = group.fastcoll_group.transport_info() if size > 1 else "none (world of one)"
        print(
            f"tp_inference: world {size}, llama hidden={a.hidden} layers={a.layers} heads={a.heads}/{a.kv_heads} "
            f"intermediate={a.intermediate} vocab={a.vocab}, {params / 1e6:.1f}M parameters (float32), "
            f"transport {transport}"
        )
        print(f"logits max |sharded - single| = {diff:.3g} (tolerance {tol:.3g}): {'OK' if logits_all else 'MISMATCH'}")
        if single_tokens is not None:
            print(f"tokens equal: {tokens_equal} ({len(tp_tokens)} greedy tokens)")
        print(f"tokens/s (median of {max(1, a.repeat)}): sharded over {size} rank(s) {tp_tps:.1f}, single process {single_tps:.1f}")
        print(
            f"RESULT logits_ok={logits_all} tokens_equal={tokens_all} max_diff={diff:.3g} "
            f"tp_tps={tp_tps:.2f} single_tps={single_tps:.2f} world={size}",
            flush=True,
        )
    mlx_compat.uninstall()
    fastcoll.finalize()
    return 0 if logits_all and tokens_all else 1


if __name__ == "__main__":
    sys.exit(main())
