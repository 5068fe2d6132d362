"""Data-parallel training: a small MLP, each rank a slice of every batch, gradients averaged.

    fastcoll-launch -n 2 python examples/dp_training.py
    python examples/dp_training.py                        # a world of one

Every rank builds the same model (seeded) and the same synthetic regression data; each step,
rank r computes the gradient of the mean loss over its slice of the batch (rows r*B/n ..
(r+1)*B/n), `fastcoll.average_gradients` averages the gradient trees over the ranks (small
arrays fused into buckets, one collective per bucket), and every rank applies the same
optimizer update. The average of the slices' mean gradients is the full batch's mean gradient,
so after N steps the weights must match single-process training on the full batch up to
float32 rounding: each rank checks that against its own single-process run. `--mlx-average`
uses `mlx.nn.average_gradients` through `fastcoll.mlx_compat` instead.

Rank 0 shows a progress bar (a `\\r` bar on a terminal, a line per tenth of the run otherwise).
The last line is `RESULT weights_match=0|1 max_diff=...`; the exit status is 0 only when the
weights match on every rank.
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

import fastcoll


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--batch", type=int, default=256, help="global batch size, divisible by the world size (default 256)")
    p.add_argument("--inputs", type=int, default=32, help="input features (default 32)")
    p.add_argument("--hidden", type=int, default=128, help="hidden width (default 128)")
    p.add_argument("--outputs", type=int, default=8, help="output features (default 8)")
    p.add_argument("--depth", type=int, default=2, help="hidden layers (default 2)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    p.add_argument("--bucket-bytes", type=int, default=None, help="average_gradients bucket size (default: fastcoll's)")
    p.add_argument("--mlx-average", action="store_true", help="use mlx.nn.average_gradients through fastcoll.mlx_compat")
    p.add_argument("--rtol", type=float, default=1e-4, help="weights tolerance, relative to max |w| (default 1e-4)")
    p.add_argument("--progress", choices=("auto", "bar", "lines", "off"), default="auto")
    return p.parse_args(argv)


class MLP(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int, depth: int = 2):
        super().__init__()
        widths = [n_in] + [hidden] * depth
        self.layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])] + [nn.Linear(widths[-1], n_out)]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = nn.relu(layer(x))
        return self.layers[-1](x)


def build(a):
    mx.random.seed(a.seed)
    model = MLP(a.inputs, a.hidden, a.outputs, a.depth)
    mx.eval(model.parameters())
    return model, optim.SGD(learning_rate=a.lr, momentum=0.9)


def data(a) -> tuple[np.ndarray, np.ndarray]:
    """Every step's batch, the same on every rank: y = tanh(x @ W) + noise."""
    rng = np.random.default_rng(a.seed)
    w = rng.normal(size=(a.inputs, a.outputs)).astype(np.float32) / np.sqrt(a.inputs)
    x = rng.normal(size=(a.steps, a.batch, a.inputs)).astype(np.float32)
    y = np.tanh(x @ w) + 0.05 * rng.normal(size=(a.steps, a.batch, a.outputs)).astype(np.float32)
    return x, y.astype(np.float32)


def loss_fn(model, x, y):
    return nn.losses.mse_loss(model(x), y, reduction="mean")


class Progress:
    """Rank 0's progress: a `\\r` bar on a terminal, else a line every tenth of the run."""

    def __init__(self, total: int, mode: str, enabled: bool):
        self.total, self.enabled = total, enabled
        self.bar = mode == "bar" or (mode == "auto" and sys.stdout.isatty())
        self.enabled = enabled and mode != "off"
        self.start = time.perf_counter()
        self.next_line = 0

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        done = step + 1
        rate = done / max(1e-9, time.perf_counter() - self.start)
        if self.bar:
            width = 30
            fill = width * done // self.total
            sys.stdout.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} loss {loss:.4f} {rate:.0f} steps/s")
            if done == self.total:
                sys.stdout.write("\n")
            sys.stdout.flush()
        elif done >= self.next_line or done == self.total:
            print(f"step {done}/{self.total} loss {loss:.4f} ({rate:.0f} steps/s)", flush=True)
            self.next_line = done + max(1, self.total // 10)


def train(model, opt, xs, ys, average, progress: Progress | None) -> tuple[float, float]:
    """Run the steps; (total seconds, seconds spent averaging gradients)."""
    step_fn = nn.value_and_grad(model, loss_fn)
    t0, in_average = time.perf_counter(), 0.0
    for step in range(len(xs)):
        loss, grads = step_fn(model, mx.array(xs[step]), mx.array(ys[step]))
        if average is not None:
            mx.eval(grads)  # so that the averaging time below is communication, not backprop
            t = time.perf_counter()
            grads = average(grads)
            mx.eval(grads)
            in_average += time.perf_counter() - t
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
        if progress is not None:
            progress.update(step, loss.item())
    return time.perf_counter() - t0, in_average


def main(argv=None) -> int:
    a = parse_args(argv)
    group = fastcoll.init()
    rank, size = group.rank(), group.size()
    if a.batch % size:
        raise SystemExit(f"--batch {a.batch} must divide by the world size {size}")
    xs, ys = data(a)
    per = a.batch // size
    mine = slice(rank * per, (rank + 1) * per)

    if a.mlx_average:
        from fastcoll import mlx_compat

        mlx_compat.install()
        average = nn.average_gradients  # MLX's own function, its all_sum routed to fastcoll
    else:
        kw = {} if a.bucket_bytes is None else {"bucket_bytes": a.bucket_bytes}

        def average(grads):
            return fastcoll.average_gradients(grads, group=group, **kw)

    model, opt = build(a)
    progress = Progress(a.steps, a.progress, rank == 0)
    dp_time, avg_time = train(model, opt, xs[:, mine], ys[:, mine], average, progress)

    # The single-process run on the full batch, from the same initial weights: every rank makes
    # it (to check its own weights), rank 0 first and alone, so that its timing is fair.
    ref, ref_opt = build(a)
    single_time = train(ref, ref_opt, xs, ys, None, None)[0] if rank == 0 else float("nan")
    fastcoll.barrier()
    if rank != 0:
        train(ref, ref_opt, xs, ys, None, None)
    ours = dict(tree_flatten(model.parameters()))
    theirs = dict(tree_flatten(ref.parameters()))
    diff = max(float(np.max(np.abs(np.array(ours[k]) - np.array(theirs[k])))) for k in ours)
    scale = max(float(np.max(np.abs(np.array(v)))) for v in theirs.values())
    tol = a.rtol * max(1.0, scale)
    match = int(diff <= tol)
    final_loss = float(loss_fn(model, mx.array(xs[-1]), mx.array(ys[-1])))

    everyone = int(fastcoll.all_reduce(np.array([match], dtype=np.int32), op="min")[0])
    if rank == 0:
        how = "mlx.nn.average_gradients via mlx_compat" if a.mlx_average else "fastcoll.average_gradients"
        n_arrays = len(tree_flatten(model.parameters()))
        print(
            f"dp_training: world {size}, MLP {a.inputs}-{'-'.join([str(a.hidden)] * a.depth)}-{a.outputs} "
            f"({n_arrays} arrays), batch {a.batch} ({per} per rank), {a.steps} steps, {how}"
        )
        print(f"final loss (full batch, last step's data): {final_loss:.5f}")
        print(f"max |w - w_single| = {diff:.3g} (tolerance {tol:.3g}): {'OK' if everyone else 'MISMATCH'}")
        print(f"steps/s: data-parallel {a.steps / dp_time:.1f}, single process on the full batch {a.steps / single_time:.1f}")
        buckets = "" if a.mlx_average else f", bucket_bytes={a.bucket_bytes if a.bucket_bytes is not None else 'default'}"
        print(f"gradient averaging: {1e3 * avg_time / a.steps:.3f} ms/step ({n_arrays} arrays, {how}{buckets})")
        print(f"RESULT weights_match={everyone} max_diff={diff:.3g} world={size}", flush=True)
    if a.mlx_average:
        from fastcoll import mlx_compat

        mlx_compat.uninstall()
    fastcoll.finalize()
    return 0 if everyone else 1


if __name__ == "__main__":
    sys.exit(main())
