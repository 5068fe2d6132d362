"""Every collective x dtype x shape against a numpy reference, on mx.array and numpy inputs.

Inputs are small integers derived from (rank, case), so every rank can compute every other
rank's input, and sums and products are exact in every dtype whatever the reduction order.
Each result is also checked to be bit-identical on every rank (all_gather of its digest).
Run as one rank of a job; exits non-zero on the first wrong result. Its last line gives the
sha256 of every result it checked, in order, so that two jobs over different transports can be
compared bit for bit (tests/test_rdma.py).
"""

from __future__ import annotations

import hashlib
import sys

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll import dtypes

MX_NAMES = [n for n in dtypes.names()]
NP_NAMES = [n for n in dtypes.names() if n != "bfloat16"]
SHAPES = [(), (0,), (1,), (7, 3), (5, 2, 2)]
BIG = (300_001,)  # over the direct/ring crossover (1 MiB for two ranks) for 4-byte and wider dtypes


def values(name: str, shape: tuple, rank: int, case: int) -> np.ndarray:
    """Small integers (or booleans), different on each rank and case; float64 holder."""
    n = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(1000 * case + rank)
    if name == "bool":
        return rng.integers(0, 2, size=n).astype(np.float64).reshape(shape)
    v = rng.integers(1, 4, size=n).astype(np.float64)
    if name.startswith("complex"):
        v = v + 1j * rng.integers(0, 3, size=n)
    return v.reshape(shape)


def make(name: str, v: np.ndarray, use_mx: bool):
    if name == "bool":
        a = v.astype(np.bool_)
        return mx.array(a, dtype=mx.bool_) if use_mx else a
    if name == "bfloat16":
        return mx.array(v.astype(np.float32)).astype(mx.bfloat16)
    a = v.astype(dtypes.host_dtype(name))
    return mx.array(a, dtype=getattr(mx, name)) if use_mx else a


def to_np(y, name: str) -> np.ndarray:
    if isinstance(y, mx.array):
        if name == "bfloat16":
            y = y.astype(mx.float32)
        return np.array(y)
    return y


def reference(name: str, op: str, vs: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(vs)
    if np.issubdtype(dtypes.host_dtype(name), np.integer):
        stack = stack.astype(dtypes.host_dtype(name))  # integer sums and products wrap around
    if op in ("sum", "mean"):
        r = stack.sum(axis=0, dtype=stack.dtype)
        if op == "mean":
            r = r / len(vs)
    elif op == "prod":
        r = stack.prod(axis=0, dtype=stack.dtype)
    elif op == "min":
        r = stack.min(axis=0)
    else:
        r = stack.max(axis=0)
    return r


def same_everywhere(y, name: str) -> None:
    raw = np.array(y.view(mx.uint16) if name == "bfloat16" else y) if isinstance(y, mx.array) else y
    digest = np.frombuffer(hashlib.sha256(np.ascontiguousarray(raw).tobytes()).digest(), np.uint8)
    every = fastcoll.all_gather(digest).reshape(-1, 32)
    assert (every == every[0]).all(), f"ranks got different bits: {every[:, :4]}"


RESULTS = hashlib.sha256()  # every checked result's bytes, in order


def check(got, want: np.ndarray, name: str, what: str, exact: bool = True) -> None:
    g = to_np(got, name)
    RESULTS.update(f"{what} {g.dtype} {g.shape}".encode())
    RESULTS.update(np.ascontiguousarray(g).tobytes())
    assert g.shape == want.shape, f"{what}: shape {g.shape} != {want.shape}"
    if exact:
        ok = np.array_equal(g.astype(np.complex128), want.astype(np.complex128))
    else:
        tol = 1e-2 if name in ("float16", "bfloat16") else 1e-6
        ok = np.allclose(g.astype(np.complex128), want, rtol=tol, atol=tol)
    assert ok, f"{what}: got {g.reshape(-1)[:6]} want {want.reshape(-1)[:6]}"


def main() -> int:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    count = 0
    case = 0
    for use_mx in (True, False):
        for name in MX_NAMES if use_mx else NP_NAMES:
            kind = "mx" if use_mx else "np"
            shapes = SHAPES + [BIG] if name in ("float32", "int64", "bfloat16", "uint8") else SHAPES
            for shape in shapes:
                case += 1
                vs = [values(name, shape, k, case) for k in range(n)]
                x = make(name, vs[r], use_mx)
                what = f"{kind} {name} {shape}"
                want_dtype = x.dtype
                # all_gather and broadcast take every dtype
                ag = fastcoll.all_gather(x)
                want = np.concatenate([v.reshape((1,) if v.ndim == 0 else v.shape) for v in vs])
                check(ag, want, name, "all_gather " + what)
                assert ag.dtype == want_dtype, (what, ag.dtype)
                same_everywhere(ag, name)
                root = case % n
                b = fastcoll.broadcast(x, root=root)
                check(b, vs[root], name, f"broadcast(root={root}) " + what)
                count += 2
                if name == "bool":
                    try:
                        fastcoll.all_reduce(x)
                    except TypeError:
                        pass
                    else:
                        raise AssertionError("all_reduce on bool did not raise TypeError")
                    continue
                for op in dtypes.OPS:
                    try:
                        dtypes.check_reduction(name, op)
                    except TypeError:
                        try:
                            fastcoll.all_reduce(x, op=op)
                        except TypeError:
                            continue
                        raise AssertionError(f"all_reduce({op}) on {name} did not raise TypeError")
                    y = fastcoll.all_reduce(x, op=op)
                    assert y.dtype == want_dtype and tuple(y.shape) == tuple(shape), (what, op, y.dtype, y.shape)
                    # A float16/bfloat16 product of more than four ranks' 1-3s is rounded (3**8 has
                    # more bits than they hold), so its order of operations shows.
                    rounded = op == "mean" or (op == "prod" and n > 4 and name in ("float16", "bfloat16"))
                    check(y, reference(name, op, vs), name, f"all_reduce({op}) " + what, exact=not rounded)
                    same_everywhere(y, name)
                    count += 1
                    if shape and shape[0] % n == 0 and op in ("sum", "max"):
                        rs = fastcoll.reduce_scatter(x, op=op)
                        full = reference(name, op, vs)
                        k = shape[0] // n
                        check(rs, full[r * k : (r + 1) * k], name, f"reduce_scatter({op}) " + what)
                        count += 1
    # reduce_scatter over n rows of a size not divisible otherwise, and async handles
    x = np.arange(n * 5, dtype=np.int32) * (r + 1)
    works = [fastcoll.all_reduce(x, async_op=True) for _ in range(5)]
    for w in works:
        assert np.array_equal(w.wait(), np.arange(n * 5) * sum(range(1, n + 1)))
    rs = fastcoll.reduce_scatter(x.reshape(n, 5))
    assert np.array_equal(rs, (np.arange(n * 5).reshape(n, 5) * sum(range(1, n + 1)))[r : r + 1])
    if n > 1:
        try:
            fastcoll.reduce_scatter(np.ones(n + 1))
        except ValueError:
            pass
        else:
            raise AssertionError("reduce_scatter of an indivisible axis did not raise ValueError")
        # send/recv around the ring, mx and numpy, the group still usable after the errors above
        right, left = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            fastcoll.send(mx.arange(6, dtype=mx.float16) + r, right)
            got = fastcoll.recv((6,), mx.float16, left)
        else:
            got = fastcoll.recv((6,), mx.float16, left)
            fastcoll.send(mx.arange(6, dtype=mx.float16) + r, right)
        assert isinstance(got, mx.array) and np.array_equal(np.array(got), np.arange(6) + left)
        big = np.arange(3_000_000, dtype=np.float32)
        if r == 0:
            fastcoll.send(big, 1)
        elif r == 1:
            assert np.array_equal(fastcoll.recv(big.shape, np.float32, 0), big)
    fastcoll.barrier()
    fastcoll.finalize()
    print(f"rank {r}: {count} checks passed; results sha256 {RESULTS.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
