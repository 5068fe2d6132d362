"""One rank of tests/test_collectives.py's repeated-calls test: the same small calls many times
(the native engine plans them after the first: Group.prepare), interleaved with calls that take
the ordinary way (async, a timeout, another shape), every result checked exactly."""

from __future__ import annotations

import numpy as np

import fastcoll
from checks import check, run


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
    s = fastcoll.all_gather(np.array(r, np.float32))  # a 0-d array: shape (n,)
    check(np.array_equal(s, np.arange(n, dtype=np.float32)), "all_gather of a scalar")
    fastcoll.finalize()
    print("OK", flush=True)


run(main)
