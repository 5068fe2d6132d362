"""all_to_all(_v), gather, scatter, reduce, all_gather_v, the object collectives, new_group,
isend/irecv and monitored_barrier against a numpy reference, every dtype, mx.array and numpy.

`exchange_worker.py` checks everything (exits non-zero on the first wrong result);
`exchange_worker.py mismatch` has rank 0 call all_to_all while the others call all_gather;
`exchange_worker.py monitor` has the last rank skip a monitored_barrier.
Inputs come from collectives_worker.values(), so every rank can compute every rank's input.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx
import numpy as np

import fastcoll
from checks import check as ok, raises, run
from collectives_worker import MX_NAMES, NP_NAMES, check, make, reference, same_everywhere, values
from fastcoll import dtypes

SHAPES = [(0,), (1,), (3, 2), (2, 2, 2)]
BIG = (300_001,)  # past the direct/pairwise and direct/chain crossovers for 4-byte dtypes


def rows_of(shape: tuple, n: int) -> tuple:
    """shape with its first axis made a multiple of n."""
    return (shape[0] * n,) + tuple(shape[1:])


def collectives(r: int, n: int) -> int:
    count = 0
    case = 0
    for use_mx in (True, False):
        for name in MX_NAMES if use_mx else NP_NAMES:
            shapes = SHAPES + ([BIG] if name in ("float32", "bfloat16") else [])
            for base in shapes:
                case += 1
                shape = rows_of(base, n)
                vs = [values(name, shape, k, case) for k in range(n)]
                x = make(name, vs[r], use_mx)
                what = f"{'mx' if use_mx else 'np'} {name} {shape}"
                k = shape[0] // n
                # all_to_all: block r of every rank, in rank order
                y = fastcoll.all_to_all(x)
                check(y, np.concatenate([v[r * k:(r + 1) * k] for v in vs]), name, "all_to_all " + what)
                assert y.dtype == x.dtype and type(y) is type(x), what
                root = case % n
                # gather onto root
                gt = fastcoll.gather(x, root=root)
                if r == root:
                    check(gt, np.concatenate(vs), name, f"gather(root={root}) " + what)
                else:
                    assert gt is None
                # scatter root's x
                sc = fastcoll.scatter(x, root=root)
                check(sc, vs[root][r * k:(r + 1) * k], name, f"scatter(root={root}) " + what)
                # uneven: rank i sends (i + j) % 3 rows of `base` to rank j
                counts = [(r + j) % 3 for j in range(n)]
                rest = tuple(base[1:])
                xv_all = [values(name, (sum((i + j) % 3 for j in range(n)),) + rest, i, case + 7) for i in range(n)]
                xv = make(name, xv_all[r], use_mx)
                y2, got_counts = fastcoll.all_to_all_v(xv, counts)
                want_counts = [(i + r) % 3 for i in range(n)]
                assert got_counts == want_counts, (got_counts, want_counts)
                parts = []
                for i in range(n):
                    start = sum((i + j) % 3 for j in range(r))
                    parts.append(xv_all[i][start:start + (i + r) % 3])
                check(y2, np.concatenate(parts), name, "all_to_all_v " + what)
                w = fastcoll.all_to_all_v(xv, counts, recv_counts=want_counts, async_op=True)
                check(w.wait()[0], np.concatenate(parts), name, "all_to_all_v(recv_counts) " + what)
                # all_gather_v: rank i has i % 3 + (1 if base[0] else 0) rows
                sizes = [i % 3 for i in range(n)]
                av_all = [values(name, (sizes[i],) + rest, i, case + 11) for i in range(n)]
                y3, got_sizes = fastcoll.all_gather_v(make(name, av_all[r], use_mx))
                assert got_sizes == sizes
                check(y3, np.concatenate(av_all), name, "all_gather_v " + what)
                same_everywhere(y3, name)
                count += 7
                if name == "bool":
                    raises(TypeError, lambda: fastcoll.reduce(x), "reduce(bool)")
                    continue
                for op in ("sum", "max", "min", "prod", "mean"):
                    try:
                        dtypes.check_reduction(name, op)
                    except TypeError:
                        raises(TypeError, lambda: fastcoll.reduce(x, op=op), f"reduce({op}) on {name}")
                        continue
                    if op in ("prod", "mean") and base == BIG:
                        continue
                    rd = fastcoll.reduce(x, root=root, op=op)
                    if r == root:
                        check(rd, reference(name, op, vs), name, f"reduce({op}, root={root}) " + what,
                              exact=op != "mean")
                        assert rd.dtype == x.dtype
                    else:
                        assert rd is None
                    count += 1
    return count


def objects_and_groups(r: int, n: int) -> int:
    value = {"rank": r, "s": "é" * r, "b": bytes([r]) * 3, "l": [1, 2.5, None, True, [r]],
             "t": (1, 2), 7: -(1 << 63), "big": (1 << 64) - 1}
    for root in range(n):
        got = fastcoll.broadcast_object(value if r == root else None, root=root)
        want = dict(value, rank=root, s="é" * root, b=bytes([root]) * 3, l=[1, 2.5, None, True, [root]], t=[1, 2])
        ok(got == want, f"broadcast_object from {root}: {got!r}")
    every = fastcoll.all_gather_object({"r": r, "pad": "x" * (1000 * r)})
    ok(every == [{"r": i, "pad": "x" * (1000 * i)} for i in range(n)], "all_gather_object")
    big = fastcoll.broadcast_object(b"\x01" * (3 << 20) if r == 0 else None)  # the ring's path
    ok(big == b"\x01" * (3 << 20), "broadcast_object of 3 MiB")
    # Refused on the caller, before any byte moves; the group stays usable.
    raises(TypeError, lambda: fastcoll.all_gather_object({"s": {1, 2}}), "a set", match="obj['s'] is a builtins.set")
    raises(TypeError, lambda: fastcoll.all_gather_object([np.float32(1)]), "a numpy scalar", match="never pickles")
    raises(TypeError, lambda: fastcoll.all_gather_object(1 << 64), "too large an int", match="outside msgpack")
    raises(TypeError, lambda: fastcoll.all_gather_object({(1, 2): 3}), "a tuple key", match="key of type tuple")
    raises(TypeError, lambda: fastcoll.broadcast_object(object(), root=r), "an object on its root")
    # new_group: every rank calls it; members use it
    evens = [i for i in range(n) if i % 2 == 0]
    sub = fastcoll.new_group(evens)
    if r in evens:
        ok(sub.size() == len(evens) and sub.rank() == evens.index(r), f"new_group rank {sub}")
        s = fastcoll.all_reduce(np.array([r + 1.0]), group=sub)
        ok(s[0] == sum(i + 1 for i in evens), "all_reduce on new_group")
        t, c = fastcoll.all_to_all_v(np.arange(len(evens), dtype=np.int64) + 10 * r, [1] * len(evens), group=sub)
        ok(t.tolist() == [10 * i + evens.index(r) for i in evens], f"all_to_all_v on new_group {t}")
    else:
        raises(ValueError, lambda: fastcoll.all_reduce(np.ones(2), group=sub), "non-member", match="not a member")
    raises(ValueError, lambda: fastcoll.new_group([0, 0]), "repeated rank", match="distinct")
    raises(ValueError, lambda: fastcoll.new_group([n]), "rank past the end", match="distinct")
    raises(TypeError, lambda: fastcoll.new_group("01"), "strings")
    # bad arguments elsewhere: errors before any byte, the group still usable
    if n > 1:
        raises(ValueError, lambda: fastcoll.all_to_all(np.ones(n + 1)), "indivisible all_to_all", match="divisible")
        raises(ValueError, lambda: fastcoll.all_to_all_v(np.ones(n + 1), [1] * n), "counts that do not add up",
           match="add up")
    raises(ValueError, lambda: fastcoll.all_to_all_v(np.ones(n), [1] * (n + 1)), "too many counts", match="entries")
    raises(TypeError, lambda: fastcoll.all_to_all_v(np.ones(n), [1.0] * n), "float counts", match="ints")
    raises(ValueError, lambda: fastcoll.gather(np.ones(2), root=n), "root past the end", match="not a rank")
    raises(ValueError, lambda: fastcoll.reduce(np.ones(2), op="avg"), "unknown op", match="unknown reduction")
    # counts as an mx.array (what a router computes)
    y, c = fastcoll.all_to_all_v(mx.arange(n), mx.ones(n, dtype=mx.int32))
    ok(np.array(y).tolist() == [r] * n and c == [1] * n, "all_to_all_v with mx counts")
    if n == 1:
        return 30
    # isend/irecv around the ring (small: both may send first), and in order
    right, left = (r + 1) % n, (r - 1) % n
    works = [fastcoll.isend(np.full(5, r, np.int32), right), fastcoll.irecv((5,), np.int32, left)]
    works += [fastcoll.isend(mx.full((3,), r, dtype=mx.float16), right), fastcoll.irecv((3,), mx.float16, left)]
    got = [w.wait() for w in works]
    ok(got[0] is None and got[1].tolist() == [left] * 5, "isend/irecv numpy")
    ok(isinstance(got[3], mx.array) and np.array(got[3]).tolist() == [left] * 3, "isend/irecv mx")
    big = np.arange(2_000_000, dtype=np.float32)  # several pieces: one side sends first
    if r == 0:
        fastcoll.isend(big, right).wait()
    elif r == 1:
        ok(np.array_equal(fastcoll.irecv(big.shape, np.float32, 0).wait(), big), "large irecv")
    fastcoll.monitored_barrier(timeout=30)
    return 30


def mismatch(r: int, n: int) -> None:
    try:
        if r == 0:
            fastcoll.all_to_all(np.zeros(n * 2, np.float32))
        else:
            fastcoll.all_gather(np.zeros(2, np.float32))
    except fastcoll.MismatchError as e:
        print(f"rank {r}: MismatchError: {e}", flush=True)
        return
    raise AssertionError("no MismatchError")


def monitor(r: int, n: int) -> None:
    if r == n - 1:
        time.sleep(4)  # never calls monitored_barrier; the others give up after 1 s
        return
    began = time.monotonic()
    try:
        fastcoll.monitored_barrier(timeout=1)
    except fastcoll.CollectiveTimeoutError as e:
        print(f"rank {r}: after {time.monotonic() - began:.1f}s: {e}", flush=True)
        return
    raise AssertionError("no CollectiveTimeoutError")


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    mode = sys.argv[1] if len(sys.argv) > 1 else "all"
    if mode == "mismatch":
        mismatch(r, n)
    elif mode == "monitor":
        monitor(r, n)
    else:
        count = collectives(r, n) + objects_and_groups(r, n)
        fastcoll.finalize()
        print(f"rank {r}: {count} checks passed", flush=True)
        return
    fastcoll.finalize()  # the job is broken by design; finalize still delivers this rank's notice


if __name__ == "__main__":
    run(main)
