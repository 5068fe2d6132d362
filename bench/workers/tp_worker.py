"""One rank of bench/hostbed.py's decode part and bench/decode_bench.py: mlx-lm's own generation loop
(`generate_step`, greedy) over a model of random weights from `--seed` (nothing downloaded).

`--mode tp`: mlx-lm's llama with `model.shard(group)`; `--mode pp`: its qwen2 with
`model.model.pipeline(group)`; `--mode single`: the whole model in this process. Started by
`fastcoll-launch ... -m fastcoll.mlx_compat` or MLX's ring; rank 0 prints `RESULT {json}`: the
first run's tokens and the median over `--repeat` runs of ms per token after the first.
`--no-exchange` (tp only) leaves the model's all-reduces out: each rank's own share of a token,
the floor under any backend's time (its tokens are wrong by design).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
import numpy as np


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("single", "tp", "pp"), required=True)
    p.add_argument("--model", choices=("llama", "qwen2"), default=None,
                   help="default: llama for single and tp, qwen2 for pp")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--no-exchange", action="store_true", help="tp: the all-reduces left out (a floor)")
    a = p.parse_args()
    if a.no_exchange and a.mode != "tp":
        p.error("--no-exchange is for --mode tp (the pipeline's sends order its stages)")
    return a


def build(a: argparse.Namespace, kind: str):
    """mlx-lm's `kind` model of this shape with random weights from `a.seed`."""
    from mlx_lm.models import llama, qwen2

    module = {"llama": llama, "qwen2": qwen2}[kind]
    args = module.ModelArgs(model_type=kind, hidden_size=a.hidden, num_hidden_layers=a.layers,
                            intermediate_size=a.intermediate, num_attention_heads=a.heads,
                            num_key_value_heads=a.kv_heads, rms_norm_eps=1e-5, vocab_size=a.vocab,
                            tie_word_embeddings=False)
    mx.random.seed(a.seed)
    model = module.Model(args)
    model.set_dtype(getattr(mx, a.dtype))  # before the weights exist: an 8B shape never in float32
    return model


def decode(model, prompt: mx.array, n: int) -> tuple[list[int], float]:
    """Greedy tokens and ms per token after the first."""
    from mlx_lm.generate import generate_step

    tokens, first = [], None
    for token, _ in generate_step(prompt, model, max_tokens=n):
        tokens.append(int(token))
        if first is None:
            first = time.perf_counter()
    ms = (time.perf_counter() - first) * 1e3 / max(1, len(tokens) - 1)
    return tokens, ms


def main() -> None:
    a = parse_args()
    if a.device == "cpu":
        mx.set_default_device(mx.cpu)
    kind = a.model or ("qwen2" if a.mode == "pp" else "llama")
    group = None if a.mode == "single" else mx.distributed.init(strict=True)
    model = build(a, kind)
    if a.mode == "tp":
        model.shard(group)
    elif a.mode == "pp":
        model.model.pipeline(group)
    mx.eval(model.parameters())
    prompt = mx.array(np.random.default_rng(a.seed).integers(0, a.vocab, size=a.prompt_len), dtype=mx.uint32)
    all_sum = mx.distributed.all_sum
    if a.no_exchange:  # mlx.nn's sharded layers look all_sum up at each call
        mx.distributed.all_sum = lambda x, *args, **kwargs: x
    decode(model, prompt, 4)  # warm up: the kernels compiled, the connections used
    runs = [decode(model, prompt, a.tokens) for _ in range(a.repeat)]
    mx.distributed.all_sum = all_sum
    if group is not None:  # no rank leaves while another still needs it (generate_step runs a step ahead)
        from mlx_lm.generate import generation_stream

        mx.synchronize(generation_stream)  # that step's collectives first, on every rank (graph mode)
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
    if group is None or group.rank() == 0:
        backend = "none" if group is None else type(group).__module__.split(".")[0]
        # What carries fastcoll's exchange (bench/hostbed.py's gate part refuses shared memory across hosts).
        transport = __import__("fastcoll").init().transport_info() if backend == "fastcoll" else None
        print("RESULT " + json.dumps({"mode": a.mode, "model": kind, "world": 1 if group is None else group.size(),
                                      "backend": backend, "transport": transport, "device": str(mx.default_device()), "tokens": runs[0][0],
                                      "ms_per_token": statistics.median(ms for _, ms in runs),
                                      "runs_ms": [round(ms, 3) for _, ms in runs]}), flush=True)


if __name__ == "__main__":
    main()
