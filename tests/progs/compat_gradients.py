"""fastcoll.average_gradients as one rank of a job: bucketed == per-array, bit for bit.

Leaves are random floats (not small integers), different on every rank, so that rounding and
the order of the ranks in a sum matter. The reference for every array is
fastcoll.all_reduce(x, op="mean") on that array alone. Prints "rank R: N checks passed".
"""

from __future__ import annotations

import collections

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll import collectives  # where average_gradients finds all_reduce
import checks
from checks import check, run

Pair = collections.namedtuple("Pair", "w b")


def bits(x) -> np.ndarray:
    if isinstance(x, mx.array):
        x = np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def same(a, b) -> bool:
    return type(a) is type(b) and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def tree(rank: int, big: int):
    rng = np.random.default_rng(100 + rank)

    def f(shape, dt=mx.float32):
        return mx.array(rng.normal(size=shape).astype(np.float32)).astype(dt)

    layers = [
        {"weight": f((16, 8)), "bias": f((16,)), "norm": f((16,), mx.bfloat16)} for _ in range(12)
    ]
    return {
        "layers": layers,
        "head": Pair(w=f((big,)), b=f((3,))),  # one large array among small ones
        "misc": (f(()), f((0, 4)), f((5,), mx.float16), f((4,), mx.complex64) * (1 + 2j), None, 7),
        "numpy": [rng.normal(size=(6,)), rng.normal(size=(2, 3)).astype(np.float32)],
        "strided": [f((4, 6)).T, f((10,))[::2]],  # views: packed through their strides
        "f64": [mx.array(rng.normal(size=(9,)), dtype=mx.float64), rng.normal(size=(9,))],
    }


def leaves(t, out=None):
    out = [] if out is None else out
    if isinstance(t, dict):
        for v in t.values():
            leaves(v, out)
    elif isinstance(t, (list, tuple)):
        for v in t:
            leaves(v, out)
    else:
        out.append(t)
    return out


def counted(fn):
    calls = []
    orig = collectives.all_reduce

    def spy(*a, **k):
        calls.append(a[0].nbytes)
        return orig(*a, **k)

    collectives.all_reduce = spy
    try:
        return fn(), calls
    finally:
        collectives.all_reduce = orig


def main() -> None:
    g = fastcoll.init()
    n, r = g.size(), g.rank()
    big = 100_000  # 400 KB of float32: over the default bucket size, so it goes alone
    grads = tree(r, big)
    flat_in = leaves(grads)

    if n == 1:
        check(fastcoll.average_gradients(grads) is grads, "a group of one returns the tree itself")
        print(f"rank {r}: {checks.passed} checks passed", flush=True)
        return

    # References: every array alone.
    refs = [
        collectives.all_reduce(x, op="mean") if isinstance(x, (mx.array, np.ndarray)) else x for x in flat_in
    ]
    arrays_in = [x for x in flat_in if isinstance(x, (mx.array, np.ndarray))]

    for bucket in (fastcoll.gradients.DEFAULT_BUCKET_BYTES, 0, 64, 8 << 20):
        out, calls = counted(lambda: fastcoll.average_gradients(grads, bucket_bytes=bucket))
        # the structure: dicts, lists, tuples, the namedtuple, non-array leaves
        check(isinstance(out["head"], Pair) and isinstance(out["misc"], tuple), "tuple types kept")
        check(isinstance(out["layers"], list) and isinstance(out["numpy"], list), "list types kept")
        check(out["misc"][4] is None and out["misc"][5] == 7, "non-array leaves pass through")
        flat_out = leaves(out)
        check(len(flat_out) == len(flat_in), "same number of leaves")
        exact = bucket <= g.config.direct_max_bytes or n == 2
        for i, (x, y, ref) in enumerate(zip(flat_in, flat_out, refs)):
            if not isinstance(x, (mx.array, np.ndarray)):
                continue
            if exact:
                check(same(y, ref), f"bucket {bucket}: leaf {i} {x.dtype} {x.shape} differs from averaging it alone")
            else:
                check(tuple(y.shape) == tuple(x.shape) and y.dtype == x.dtype, f"leaf {i} shape/dtype: {type(x)} {x.shape} {x.dtype} -> {type(y)} {y.shape} {y.dtype}")
                yy = np.array(y.astype(mx.float32) if isinstance(y, mx.array) and y.dtype == mx.bfloat16 else y)
                rr = np.array(ref.astype(mx.float32) if isinstance(ref, mx.array) and ref.dtype == mx.bfloat16 else ref)
                check(np.allclose(yy, rr, rtol=1e-2, atol=1e-3), f"bucket {bucket}: leaf {i} far from its mean")
        if bucket == 0:
            check(len(calls) == len(arrays_in), f"no fusion: {len(calls)} collectives for {len(arrays_in)} arrays")
        elif bucket == fastcoll.gradients.DEFAULT_BUCKET_BYTES:
            # one bucket per dtype (mx.array and numpy leaves together) + the big array alone
            kinds = {fastcoll.arrays.name_of(x) for x in arrays_in if x.nbytes < bucket}
            check(len(calls) == len(kinds) + 1, f"fusion: {len(calls)} collectives, expected {len(kinds) + 1}")
            check(max(calls) == big * 4, "the large array went alone")
        elif bucket == 64:
            check(len(arrays_in) > len(calls) > len({fastcoll.arrays.name_of(x) for x in arrays_in}), f"64-byte buckets: {len(calls)}")
            check(all(c <= 64 or c in [x.nbytes for x in arrays_in] for c in calls), "a bucket over its size")

    # Against the arithmetic mean (sanity: the reference itself is a mean).
    everyone = [tree(q, big) for q in range(n)]
    out = fastcoll.average_gradients(grads, group=g)
    w = np.mean([np.array(t["layers"][3]["weight"]) for t in everyone], axis=0)
    check(np.allclose(np.array(out["layers"][3]["weight"]), w, rtol=1e-6, atol=1e-6), "the mean itself")

    # An mlx_compat group works too.
    from fastcoll import mlx_compat

    out2 = fastcoll.average_gradients(grads, group=mlx_compat.Group(g))
    check(same(leaves(out2)[0], leaves(out)[0]), "mlx_compat.Group accepted")

    # Non-float gradients are refused before anything is sent (on every rank alike).
    try:
        fastcoll.average_gradients({"a": mx.ones(3), "i": mx.array([1, 2])})
    except TypeError as e:
        check("int32" in str(e), f"TypeError names the dtype: {e}")
    else:
        raise AssertionError("int gradients accepted")
    check(collectives.all_reduce(np.array([1.0]))[0] == n, "the group still works after the refusal")

    fastcoll.finalize()
    print(f"rank {r}: {checks.passed} checks passed", flush=True)


if __name__ == "__main__":
    run(main)
