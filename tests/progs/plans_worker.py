"""One rank of tests/test_collectives.py's repeated-calls test: the same small calls many times
(the native engine plans them after the first: Group.prepare), interleaved with calls that take
the ordinary way (async, a timeout, another shape), every result checked exactly."""

from __future__ import annotations

import numpy as np

import fastcoll
from checks import check, run


def mlx_repeated(r: int, n: int) -> None:
    """mx.array all_reduces repeated (planned after the first), of every reducible dtype an
    mx.array takes, a strided one among them: each result an mx.array of the input's dtype and
    shape, and exact."""
    try:
        import mlx.core as mx
    except ImportError:
        print("mx.array calls not checked: MLX is not installed", flush=True)
        return
    kinds = [mx.float32, mx.bfloat16, mx.float16, mx.int32, mx.uint8, mx.float64, mx.complex64]
    base = np.arange(12).reshape(3, 4) % 5
    for i in range(63):
        dt = kinds[i % len(kinds)]
        x = mx.array(base + r).astype(dt)
        want = sum(base + p for p in range(n))
        if i % 5 == 0:  # a transposed (strided) one
            x, want = x.T, want.T
        y = fastcoll.all_reduce(x)
        ok = isinstance(y, mx.array) and y.dtype == dt and tuple(y.shape) == tuple(x.shape)
        got = np.array(y.astype(mx.float32) if dt in (mx.bfloat16, mx.complex64) else y).real
        check(ok and np.array_equal(got, want), f"mx all_reduce #{i} {dt}: {got} != {want}")


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    shapes = [(1,), (3, 5), (1024,)]
    dtypes = [np.float32, np.int64, np.float16, np.uint8]
    for i in range(240):
        shape, dt = shapes[i % 3], dtypes[(i // 3) % 4]
        x = (np.arange(int(np.prod(shape))) % 11 + r + i % 7).astype(dt).reshape(shape)
        want = sum((np.arange(int(np.prod(shape))) % 11 + p + i % 7).astype(dt) for p in range(n)).astype(dt)
        if i % 13 == 0:
            y = fastcoll.all_reduce(x, async_op=True).wait()
        elif i % 17 == 0:
            y = fastcoll.all_reduce(x, timeout=30)
        else:
            y = fastcoll.all_reduce(x)
        check(y.dtype == x.dtype and y.shape == x.shape and np.array_equal(y.reshape(-1), want), f"all_reduce #{i}")
        z = fastcoll.all_gather(x)
        parts = [(np.arange(int(np.prod(shape))) % 11 + p + i % 7).astype(dt).reshape(shape) for p in range(n)]
        check(np.array_equal(z, np.concatenate(parts, axis=0)), f"all_gather #{i}")
        root = i % n
        b = fastcoll.broadcast(x, root=root)
        check(np.array_equal(b, parts[root]) and (b is x) == (r == root), f"broadcast #{i}")
    mlx_repeated(r, n)
    s = fastcoll.all_gather(np.array(r, np.float32))  # a 0-d array: shape (n,)
    check(np.array_equal(s, np.arange(n, dtype=np.float32)), "all_gather of a scalar")
    fastcoll.finalize()
    print("OK", flush=True)


run(main)
