"""One rank of a long randomized run (tests/test_soak.py).

    soak_worker.py OPS SEED

Every rank draws the same sequence of OPS operations from SEED (collective, op, dtype, shape,
MLX or numpy input, sync or async), and per-rank inputs from (SEED, op index, rank), so each
rank knows every rank's input and checks every result exactly: inputs are small integers whose
sums, products, minima, maxima and means are exact in every dtype. The resident size is sampled
at every tenth of the run, with the number of live Python objects. Prints
`SOAK <rank> <ops> <seconds> <rss KiB,...> <objects,...>` and `OK <counts>`.
"""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import gc
import sys
import time

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll import dtypes

faulthandler.dump_traceback_later(1800, exit=True)

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
ALL = INTS + FLOATS + ["complex64", "bool"]
KINDS = ["all_reduce"] * 6 + ["all_gather"] * 2 + ["reduce_scatter"] * 2 + ["broadcast"] * 2 + [
    "barrier", "sendrecv", "async"
]


_LIBC = ctypes.CDLL(None)


def rss_kib() -> int:
    """Resident size once freed memory is really free: garbage collected, MLX's buffer cache
    emptied, and glibc's free lists trimmed, so that only live memory counts."""
    gc.collect()
    mx.clear_cache()
    if hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def draw_shape(rng: np.random.Generator, n: int, divisible: bool) -> tuple:
    """Mostly small arrays; about one in twenty over the direct/ring crossover (256 KiB)."""
    u = rng.random()
    if u < 0.05:
        count = int(rng.integers(70_000, 300_000))
    elif u < 0.15:
        count = 0 if rng.random() < 0.3 else int(rng.integers(1, 8))
    else:
        count = int(np.exp(rng.uniform(0, np.log(20_000))))
    if divisible:
        count = max(n, count - count % n)
    if rng.random() < 0.3 and count % 4 == 0 and count:
        return (count // 4, 4)
    if not divisible and rng.random() < 0.05:
        return ()
    return (count,)


def values(name: str, op: str, shape: tuple, seed: int, i: int, r: int) -> np.ndarray:
    """This rank's input as exact small numbers (float64 or complex128 holder)."""
    rng = np.random.default_rng((seed, i, r))
    size = int(np.prod(shape)) if shape else 1
    if name == "bool":
        v = rng.integers(0, 2, size)
    elif op == "prod":
        v = rng.integers(1, 3, size)  # 1 or 2: at most 2**n, exact in int8 for n <= 6
    elif op == "mean":
        v = 3 * rng.integers(0, 3, size)  # multiples of 3 (= the world size): exact mean
    elif op in ("min", "max"):
        v = rng.integers(0, 100, size)
    else:
        v = rng.integers(0, 4, size)
    v = v.astype(np.float64)
    if name == "complex64":
        v = v + 1j * rng.integers(0, 3, size) * (3 if op == "mean" else 1)
    return v.reshape(shape)


def make(name: str, v: np.ndarray, use_mx: bool):
    if name == "bool":
        a = v.astype(np.bool_)
        return mx.array(a) if use_mx else a
    if name == "bfloat16":
        return mx.array(v.astype(np.float32)).astype(mx.bfloat16)
    a = v.astype(dtypes.host_dtype(name))
    return mx.array(a, dtype=getattr(mx, name)) if use_mx else a  # (mx.array makes float64 float32)


def as_f64(y, name: str) -> np.ndarray:
    if isinstance(y, mx.array):
        if name == "bfloat16":
            y = y.astype(mx.float32)
        y = np.array(y)
    return y.astype(np.complex128 if name == "complex64" else np.float64)


def reduce_ref(op: str, vs: list[np.ndarray]) -> np.ndarray:
    s = np.stack(vs)
    if op == "sum":
        return s.sum(0)
    if op == "mean":
        return s.sum(0) / len(vs)
    if op == "prod":
        return s.prod(0)
    return s.min(0) if op == "min" else s.max(0)


def check(got, want: np.ndarray, name: str, what: str, shape: tuple) -> None:
    assert tuple(got.shape) == tuple(shape), f"{what}: shape {tuple(got.shape)} != {shape}"
    g = as_f64(got, name)
    assert np.array_equal(g, want.astype(g.dtype)), f"{what}: got {g.reshape(-1)[:6]} want {want.reshape(-1)[:6]}"


def main() -> int:
    ops, seed = int(sys.argv[1]), int(sys.argv[2])
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    plan = np.random.default_rng(seed)
    counts: collections.Counter = collections.Counter()
    samples, objects = [], []
    start = time.monotonic()
    for i in range(ops):
        if i % max(1, ops // 10) == 0:
            samples.append(rss_kib())
            objects.append(len(gc.get_objects()))
        kind = KINDS[plan.integers(len(KINDS))]
        name = ALL[plan.integers(len(ALL))]
        use_mx = bool(plan.integers(2)) or name == "bfloat16"
        if kind in ("all_reduce", "reduce_scatter", "async") and name == "bool":
            name = "int32"
        ops_ok = [o for o in dtypes.OPS if _allowed(name, o)]
        op = ops_ok[plan.integers(len(ops_ok))] if ops_ok else "sum"  # bool: no reduction
        shape = draw_shape(plan, n, divisible=kind == "reduce_scatter")
        vs = [values(name, op, shape, seed, i, k) for k in range(n)]
        x = make(name, vs[r], use_mx)
        what = f"op {i}: {kind}({op}) {name} {shape} {'mx' if use_mx else 'np'}"
        if kind == "all_reduce":
            check(fastcoll.all_reduce(x, op=op), reduce_ref(op, vs), name, what, shape)
        elif kind == "async":
            works = [fastcoll.all_reduce(x, op=op, async_op=True) for _ in range(3)]
            want = reduce_ref(op, vs)
            for w in works:
                check(w.wait(), want, name, what, shape)
        elif kind == "all_gather":
            full = [v.reshape((1,) if v.ndim == 0 else v.shape) for v in vs]
            want = np.concatenate(full)
            check(fastcoll.all_gather(x), want, name, what, want.shape)
        elif kind == "reduce_scatter":
            k = shape[0] // n
            want = reduce_ref(op, vs)[r * k : (r + 1) * k]
            check(fastcoll.reduce_scatter(x, op=op), want, name, what, want.shape)
        elif kind == "broadcast":
            root = int(plan.integers(n))
            check(fastcoll.broadcast(x, root=root), vs[root], name, what, shape)
        elif kind == "barrier":
            fastcoll.barrier()
        else:  # a ring of send/recv: even ranks send first
            right, left = (r + 1) % n, (r - 1) % n
            dt = mx.bfloat16 if name == "bfloat16" else (
                getattr(mx, "bool_" if name == "bool" else name) if use_mx else dtypes.host_dtype(name))
            if r % 2 == 0:
                fastcoll.send(x, right)
                got = fastcoll.recv(shape, dt, left)
            else:
                got = fastcoll.recv(shape, dt, left)
                fastcoll.send(x, right)
            check(got, vs[left], name, what, shape)
        counts[kind] += 1
    samples.append(rss_kib())
    objects.append(len(gc.get_objects()))
    fastcoll.barrier()
    seconds = time.monotonic() - start
    fastcoll.finalize()
    print("SOAK", r, ops, f"{seconds:.2f}", ",".join(map(str, samples)), ",".join(map(str, objects)), flush=True)
    print("OK", dict(counts), flush=True)
    return 0


def _allowed(name: str, op: str) -> bool:
    try:
        dtypes.check_reduction(name, op)
        return True
    except TypeError:
        return False


if __name__ == "__main__":
    sys.exit(main())
