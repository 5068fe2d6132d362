"""mlx.nn code, unchanged, on fastcoll (through mlx_compat), each against its single-process
result: `nn_clients.py QUANTIZED_MODEL_DIR` as every rank of a job.

- mlx.nn.fully_shard training: each rank holds a shard of every parameter and trains on its
  slice of each batch; after the steps the gathered parameters (and every step's loss) equal
  single-process training on the whole batch.
- A quantized model sharded with shard_linear: QuantizedLinear through shard_linear both ways,
  and mlx-lm's 4-bit qwen2 (tests/progs/lm_model.py --quantize) sharded with its own
  model.shard(group), whose logits equal the unsharded model's.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from checks import check, run
from fastcoll import mlx_compat


def mlp() -> nn.Module:
    mx.random.seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def loss_fn(model, x, y):
    return mx.mean((model(x) - y) ** 2)


def fully_shard_training(group) -> None:
    r, n = group.rank(), group.size()
    rng = np.random.default_rng(0)
    X = mx.array(rng.standard_normal((32, 8)).astype(np.float32))
    Y = mx.array(rng.standard_normal((32, 4)).astype(np.float32))
    ref, model = mlp(), mlp()
    sharded = nn.fully_shard(model, group=group)
    check(isinstance(sharded, nn.FullyShardedModule), f"fully_shard wrapped it: {type(sharded)}")
    shard_shapes = {k: v.shape for k, v in tree_flatten(sharded.parameters())}
    check(shard_shapes["module.layers.0.weight"] == (16 // n, 8), f"a shard of axis 0: {shard_shapes}")
    opt_ref, opt = optim.SGD(learning_rate=0.1), optim.SGD(learning_rate=0.1)
    step_ref = nn.value_and_grad(ref, loss_fn)
    step = nn.value_and_grad(sharded, loss_fn)
    rows = 32 // n
    for i in range(5):
        loss_ref, g_ref = step_ref(ref, X, Y)
        opt_ref.update(ref, g_ref)
        loss, grads = step(sharded, X[r * rows:(r + 1) * rows], Y[r * rows:(r + 1) * rows])
        opt.update(sharded, grads)
        mx.eval(ref.parameters(), sharded.parameters())
        mean_loss = mx.distributed.all_sum(loss, group=group) / n
        check(abs(mean_loss.item() - loss_ref.item()) < 1e-5, f"step {i}: loss {mean_loss.item()} vs {loss_ref.item()}")
    full = dict(tree_flatten(ref.parameters()))
    for path, shard in tree_flatten(sharded.module.parameters()):
        gathered = mx.distributed.all_gather(shard, group=group)
        diff = mx.max(mx.abs(gathered - full[path])).item()
        check(diff < 1e-5, f"fully_shard parameter {path} differs by {diff}")


def quantized_shard_linear(group) -> None:
    r, n = group.rank(), group.size()
    mx.random.seed(5)
    x = mx.random.normal((3, 64))
    for how in ("all-to-sharded", "sharded-to-all"):
        q = nn.QuantizedLinear.from_linear(nn.Linear(64, 128), group_size=32, bits=4)
        s = nn.layers.distributed.shard_linear(q, how, group=group)
        check(type(s).__name__.startswith("Quantized"), f"shard_linear({how}) gave {type(s).__name__}")
        want = q(x)
        if how == "all-to-sharded":
            got, want = s(x), want[:, r * 128 // n:(r + 1) * 128 // n]
        else:
            got = s(x[:, r * 64 // n:(r + 1) * 64 // n])
        diff = mx.max(mx.abs(got - want)).item()
        check(diff < 1e-4, f"quantized shard_linear({how}) differs by {diff}")


def quantized_model(group, path: str) -> None:
    from mlx_lm import load

    single, tokenizer = load(path)
    model, _ = load(path)
    check(any("Quantized" in type(m).__name__ for _, m in model.named_modules()), "the model is quantized")
    model.shard(group)
    check(any(type(m).__name__ == "QuantizedAllToShardedLinear" for _, m in model.named_modules()),
          "model.shard made quantized sharded layers")
    tokens = mx.array([tokenizer.encode("the red cat is in the old house")])
    a, b = model(tokens), single(tokens)
    diff = mx.max(mx.abs(a - b)).item()
    check(diff < 1e-3 * max(1.0, mx.max(mx.abs(b)).item()), f"sharded quantized logits differ by {diff}")
    check(bool(mx.all(mx.argmax(a, -1) == mx.argmax(b, -1)).item()), "same greedy tokens")


def main() -> None:
    mlx_compat.install()
    group = mx.distributed.init()
    fully_shard_training(group)
    quantized_shard_linear(group)
    quantized_model(group, sys.argv[1])
    import checks

    print(f"rank {group.rank()}: {checks.passed} checks passed", flush=True)


if __name__ == "__main__":
    run(main)
