"""fastcoll.mlx_compat against mx.distributed's documented semantics, as one rank of a job.

Inputs are small integers derived from (rank, case), so every rank can compute every other
rank's input and sums are exact in every dtype. Exits non-zero on the first failure; prints
"rank R: N checks passed" at the end.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np

import fastcoll
from fastcoll import mlx_compat
import checks
from checks import check, raises, run

def values(shape, rank: int, case: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * case + rank)
    return rng.integers(1, 4, size=shape).astype(np.float64)


DTYPES = {
    "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "float64": mx.float64,
    "int8": mx.int8, "int32": mx.int32, "int64": mx.int64, "uint8": mx.uint8, "uint64": mx.uint64,
    "complex64": mx.complex64,
}


def make(v: np.ndarray, dt) -> mx.array:
    if dt == mx.complex64:
        return mx.array((v + 1j * v[::-1] if v.ndim else v + 1j).astype(np.complex64))
    return mx.array(v.astype(np.float32)).astype(dt)


def as_np(y: mx.array) -> np.ndarray:
    if y.dtype == mx.bfloat16:
        y = y.astype(mx.float32)
    return np.array(y)


def main() -> None:
    originals = {name: getattr(mx.distributed, name) for name in mlx_compat.PATCHED}
    mlx_group_before = mx.distributed.init()  # MLX's own group of one (no MLX backend here)

    # ---------------------------------------------------------------- install / uninstall
    mlx_compat.install()
    mlx_compat.install()  # idempotent
    for name in mlx_compat.PATCHED:
        check(getattr(mx.distributed, name) is getattr(mlx_compat, name), f"{name} not patched")
    with mlx_compat.patched():
        pass
    check(mlx_compat.installed(), "patched() inside install() must leave it installed")
    mlx_compat.uninstall()
    for name in mlx_compat.PATCHED:
        check(getattr(mx.distributed, name) is originals[name], f"{name} not restored")
    with mlx_compat.patched():
        check(mx.distributed.all_sum is mlx_compat.all_sum, "patched() did not install")
    check(mx.distributed.all_sum is originals["all_sum"], "patched() did not restore")
    mlx_compat.install()

    d = mx.distributed
    g = d.init()
    n, r = g.size(), g.rank()
    check(n == int(os.environ["FASTCOLL_WORLD_SIZE"]), "size")
    check(r == int(os.environ["FASTCOLL_RANK"]), "rank")
    check(d.init() is g and d.init(backend="ring") is g and d.init(strict=True) is g, "init caches its group")
    check(d.is_available() and d.is_available("fastcoll") and not d.is_available("bogus"), "is_available")
    raises(ValueError, lambda: d.init(backend="bogus"), "bad backend", "bogus")
    check(g.fastcoll_group is fastcoll.init(), "the compat group wraps fastcoll's default group")

    # ---------------------------------------------------------------- reductions
    for case, (name, dt) in enumerate(DTYPES.items()):
        for shape in [(), (5,), (3, 4)]:
            vs = [make(values(shape, q, case), dt) for q in range(n)]
            x = vs[r]
            ref = {"sum": sum(as_np(v) for v in vs), "max": None, "min": None}
            stack = np.stack([as_np(v) for v in vs])
            if name == "complex64":
                # lexicographic, as mx.maximum orders complex numbers
                mx_max, mx_min = vs[0], vs[0]
                for v in vs[1:]:
                    mx_max, mx_min = mx.maximum(mx_max, v), mx.minimum(mx_min, v)
                ref["max"], ref["min"] = as_np(mx_max), as_np(mx_min)
            else:
                ref["max"], ref["min"] = stack.max(axis=0), stack.min(axis=0)
            if name in ("int8", "uint8"):
                ref["sum"] = stack.astype(np.int64).sum(axis=0).astype(as_np(x).dtype)
            for op, fn in (("sum", d.all_sum), ("max", d.all_max), ("min", d.all_min)):
                y = fn(x, group=g, stream=mx.cpu)
                check(isinstance(y, mx.array), f"{op} {name} type")
                check(y.dtype == x.dtype and y.shape == x.shape, f"{op} {name} {shape}: {y.dtype} {y.shape}")
                check(np.array_equal(as_np(y), ref[op]), f"{op} {name} {shape}: {as_np(y)} != {ref[op]}")
        # all_gather and sum_scatter on the same dtype
        vs = [make(values((2, 3), q, case), dt) for q in range(n)]
        y = d.all_gather(vs[r])
        check(y.dtype == dt and y.shape == (2 * n, 3), f"all_gather {name} shape {y.shape}")
        check(np.array_equal(as_np(y), np.concatenate([as_np(v) for v in vs])), f"all_gather {name}")
        vs = [make(values((2 * n, 3), q, case), dt) for q in range(n)]
        y = d.sum_scatter(vs[r], group=g)
        full = sum(as_np(v) for v in vs)
        if name in ("int8", "uint8"):
            full = np.stack([as_np(v) for v in vs]).astype(np.int64).sum(axis=0).astype(as_np(vs[0]).dtype)
        check(y.dtype == dt and y.shape == (2, 3), f"sum_scatter {name} shape {y.shape}")
        check(np.array_equal(as_np(y), full[2 * r : 2 * r + 2]), f"sum_scatter {name}")

    # bool: sum and max are or, min is and (as MLX's backends)
    bits = [np.array([True, q == 0, False, q % 2 == 1]) for q in range(n)]
    b = mx.array(bits[r])
    anyv, allv = np.logical_or.reduce(bits), np.logical_and.reduce(bits)
    for fn, ref in ((d.all_sum, anyv), (d.all_max, anyv), (d.all_min, allv)):
        y = fn(b)
        check(y.dtype == mx.bool_ and np.array_equal(np.array(y), ref), f"bool {fn.__name__}: {y}")
    y = d.all_gather(b)
    check(y.dtype == mx.bool_ and np.array_equal(np.array(y), np.concatenate(bits)), "bool all_gather")

    # scalars, as MLX converts them
    for v, dt, want in ((1, mx.int32, n), (1.5, mx.float32, 1.5 * n), (True, mx.bool_, True), (np.float32(2), mx.float32, 2.0 * n)):
        y = d.all_sum(v)
        check(y.dtype == dt and y.shape == () and y.item() == want, f"all_sum({v!r}) = {y}")
    y = d.all_gather(mx.array(r))
    want_shape = () if n == 1 else (n,)
    check(y.shape == want_shape, f"all_gather of a scalar: shape {y.shape}")
    raises(ValueError, lambda: d.all_sum([1, 2]), "a list", "Invalid type list")
    raises(TypeError, lambda: d.all_sum(mx.ones(2), g), "group is keyword-only")
    check(d.all_sum(mx.zeros((0, 3))).shape == (0, 3), "an empty array")

    if n == 1:
        # ------------------------------------------------------------ the group of one
        x = mx.arange(4)
        for fn in (d.all_sum, d.all_max, d.all_min, d.all_gather, d.sum_scatter):
            check(fn(x) is x, f"{fn.__name__} on a group of one returns its input")
        check(d.all_gather(mx.array(3)).shape == (), "all_gather of a scalar stays a scalar on one rank")
        raises(ValueError, lambda: d.send(x, 0), "send", "singleton")
        raises(ValueError, lambda: d.recv((4,), mx.int32, 0), "recv", "singleton")
        raises(ValueError, lambda: d.recv_like(x, 0), "recv_like", "singleton")
        raises(RuntimeError, lambda: g.split(0), "split", "Cannot split")
        check(d.all_sum(x, group=mlx_group_before) is x, "MLX's own group of one")
    else:
        # ------------------------------------------------------------ point to point
        right, left = (r + 1) % n, (r - 1) % n
        mine = mx.arange(6, dtype=mx.float16).reshape(2, 3) + r
        if r == 0:
            check(d.send(mine, right) is mine, "send returns its input")
            got = d.recv_like(mine, left)
        else:
            got = d.recv((2, 3), mx.float16, left, group=g)
            d.send(mine, right, group=g, stream=mx.cpu)
        check(got.dtype == mx.float16 and np.array_equal(np.array(got), np.array(mine - r + left)), f"recv {got}")
        raises(ValueError, lambda: d.send(mine, n), "send to a rank outside the group")

        # ------------------------------------------------------------ split
        sub = g.split(r % 2)
        members = [q for q in range(n) if q % 2 == r % 2]
        check(sub.size() == len(members) and sub.rank() == members.index(r), f"split: {sub}")
        y = d.all_sum(mx.array([r + 1.0]), group=sub)
        check(y.item() == sum(q + 1.0 for q in members), f"all_sum on a sub-group: {y}")
        rev = g.split(0, key=n - 1 - r)
        check(rev.size() == n and rev.rank() == n - 1 - r, f"split with key: {rev}")
        y = d.all_gather(mx.array([r]), group=rev)
        check(np.array_equal(np.array(y), np.arange(n)[::-1]), f"all_gather in key order: {y}")
        check(d.all_sum(mx.array(1), group=g).item() == n, "the parent still works after split")

        # ------------------------------------------------------------ gradients
        x = mx.array([1.0, 2.0]) * (r + 1)
        w = mx.array([1.0, 10.0])
        gs = mx.grad(lambda x: (d.all_sum(x) * w).sum())(x)
        check(np.array_equal(np.array(gs), np.array(w)), f"vjp of all_sum is the cotangent: {gs}")
        gg = mx.grad(lambda x: (d.all_gather(x) * mx.arange(2.0 * n)).sum())(x)
        check(np.array_equal(np.array(gg), np.arange(2.0 * n)[2 * r : 2 * r + 2]), f"vjp of all_gather: {gg}")
        raises(RuntimeError, lambda: mx.eval(mx.compile(lambda x: d.all_sum(x))(x)), "compile", "eagerly")

        # ------------------------------------------------------------ mlx.nn's sharded layers
        mx.random.seed(7)
        l1, l2 = nn.Linear(16, 8 * n), nn.Linear(8 * n, 12)
        inp = mx.random.normal((5, 16))
        mx.eval(l1.parameters(), l2.parameters(), inp)
        ref = l2(nn.gelu(l1(inp)))
        from mlx.nn.layers.distributed import shard_linear

        s1 = shard_linear(l1, "all-to-sharded", group=g)
        s2 = shard_linear(l2, "sharded-to-all")  # group=None: the global group, through init()
        out = s2(nn.gelu(s1(inp)))
        check(out.shape == ref.shape, "sharded output shape")
        check(np.allclose(np.array(out), np.array(ref), rtol=1e-5, atol=1e-5), "sharded layers == unsharded")

        def loss_ref(x):
            return (l2(nn.gelu(l1(x))) ** 2).sum()

        def loss_sharded(x):
            return (s2(nn.gelu(s1(x))) ** 2).sum()

        g_ref, g_sh = mx.grad(loss_ref)(inp), mx.grad(loss_sharded)(inp)
        check(np.allclose(np.array(g_sh), np.array(g_ref), rtol=1e-4, atol=1e-5), "input gradient through sharded layers")

        # ------------------------------------------------------------ mlx.nn.average_gradients
        tree = {"a": mx.array([1.0, 2.0]) * (r + 1), "b": [mx.ones((2, 2)) * r]}
        avg = nn.average_gradients(tree)
        mean = sum(range(1, n + 1)) / n
        check(np.allclose(np.array(avg["a"]), np.array([1.0, 2.0]) * mean), "nn.average_gradients a")
        check(np.allclose(np.array(avg["b"][0]), np.full((2, 2), (n - 1) / 2)), "nn.average_gradients b")

    mlx_compat.uninstall()
    check(mx.distributed.all_sum is originals["all_sum"], "uninstall at the end")
    fastcoll.finalize()
    print(f"rank {r}: {checks.passed} checks passed", flush=True)


if __name__ == "__main__":
    run(main)
