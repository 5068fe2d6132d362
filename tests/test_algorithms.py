"""The algorithms on their own, at 2-8 ranks that are threads of this process (an in-process
transport), against numpy: milliseconds a case. The multi-process tests (test_collectives.py)
run the same algorithms over real sockets and shared memory."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from fastcoll import dtypes
from fastcoll.algorithms import Call, blocks, direct, doubling, ring, select
from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, MismatchError
from fastcoll.transport.inproc import mesh

WORLDS = range(2, 9)


def algorithms_for(collective: str, n: int):
    found = [direct, ring]
    if doubling.applies(n) and hasattr(doubling, collective):
        found.append(doubling)
    return [a for a in found if hasattr(a, collective)]


def run_ranks(n: int, fn, ranks=None, piece_bytes: int = 64, timeout: float = 10.0) -> list:
    """fn(call) on n threads, one per rank of an in-process mesh; each rank's return value.
    `ranks`: the mesh ranks that form the group (a sub-group), default all of them."""
    members = list(range(n)) if ranks is None else list(ranks)
    transports = mesh(n if ranks is None else max(members) + 1)
    out: list = [None] * len(members)
    errors: list = []

    def one(r: int) -> None:
        call = Call(transports[members[r]], 0, "test()", time.monotonic() + timeout, r, len(members),
                    members, piece_bytes)
        try:
            out[r] = fn(call)
        except BaseException as e:  # reported below, with the rank
            errors.append((r, e))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    if errors:
        raise errors[0][1]
    return out


def data(n: int, count: int, dtype=np.float32) -> list[np.ndarray]:
    rng = np.random.default_rng(count * 31 + n)
    return [rng.integers(-50, 50, size=count).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("count", [0, 1, 7, 100, 1000])
def test_all_reduce(n, count):
    xs = data(n, count)
    want = np.sum(xs, axis=0, dtype=np.float32)
    for algo in algorithms_for("all_reduce", n):
        def body(call):
            buf = np.empty_like(xs[call.rank])
            algo.all_reduce(call, xs[call.rank], buf, dtypes.reducer("float32", "sum"))
            return buf

        got = run_ranks(n, body)
        for r in range(n):
            assert np.array_equal(got[r], want), (algo.__name__, r)
            assert got[r].tobytes() == got[0].tobytes()  # bit-identical on every rank


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("count", [1, 5, 64])
def test_all_gather(n, count):
    xs = data(n, count, np.int32)
    want = np.concatenate(xs)
    for algo in algorithms_for("all_gather", n):
        def body(call):
            out = np.empty(n * count, np.int32)
            bounds = blocks(out.size, n)
            a, b = bounds[call.rank]
            out[a:b] = xs[call.rank]
            algo.all_gather(call, out, bounds)
            return out

        for r, got in enumerate(run_ranks(n, body)):
            assert np.array_equal(got, want), (algo.__name__, r)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_reduce_scatter(n, rows):
    xs = data(n, n * rows, np.int64)
    total = np.sum(xs, axis=0)
    bounds = blocks(n * rows, n)
    for algo in algorithms_for("reduce_scatter", n):
        def body(call):
            return algo.reduce_scatter(call, xs[call.rank], bounds, dtypes.reducer("int64", "sum"))

        for r, got in enumerate(run_ranks(n, body)):
            a, b = bounds[r]
            assert np.array_equal(got, total[a:b]), (algo.__name__, r)


@pytest.mark.parametrize("n", WORLDS)
def test_broadcast_from_every_root(n):
    for root in range(n):
        x = data(n, 300)[root]
        for algo in algorithms_for("broadcast", n):
            def body(call):
                buf = x.copy() if call.rank == root else np.zeros_like(x)
                algo.broadcast(call, buf, root)
                return buf

            for r, got in enumerate(run_ranks(n, body)):
                assert np.array_equal(got, x), (algo.__name__, root, r)


@pytest.mark.parametrize("n", WORLDS)
def test_barrier(n):
    assert run_ranks(n, direct.barrier) == [None] * n


def test_a_sub_group_maps_its_ranks_to_the_mesh():
    """Group ranks 0, 1, 2 are mesh ranks 5, 1, 3 of six: the algorithms see only the group."""
    xs = data(3, 50)

    def body(call):
        buf = np.empty_like(xs[call.rank])
        ring.all_reduce(call, xs[call.rank], buf, dtypes.reducer("float32", "sum"))
        return buf

    for got in run_ranks(6, body, ranks=[5, 1, 3]):
        assert np.array_equal(got, np.sum(xs, axis=0))


def test_a_rank_that_calls_something_else_is_a_mismatch():
    def body(call):
        if call.rank == 1:
            call.sig = "other()"
        direct.barrier(call)

    with pytest.raises(MismatchError, match="other"):
        run_ranks(2, body)


def test_a_missing_rank_is_a_timeout():
    def body(call):
        if call.rank == 0:
            direct.barrier(call)

    with pytest.raises(CollectiveTimeoutError):
        run_ranks(2, body, timeout=0.2)


def test_the_selection_rule():
    c = Config()
    assert select.choose("all_reduce", 4, 2, c) is direct
    assert select.choose("all_reduce", c.direct_max_bytes_two_ranks, 2, c) is direct
    assert select.choose("all_reduce", c.direct_max_bytes_two_ranks + 1, 2, c) is ring
    assert select.choose("all_reduce", 4, 4, c) is doubling
    assert select.choose("all_reduce", 4, 3, c) is direct
    assert select.choose("broadcast", 4, 4, c) is direct  # doubling has no broadcast
    assert select.choose("all_gather", c.direct_max_bytes + 1, 4, c) is ring
    off = Config(doubling=False, direct_max_bytes=0)
    assert select.choose("all_reduce", 4, 4, off) is ring
    with pytest.raises(ValueError, match="no algorithm"):
        select.choose("scan", 4, 2, c)


def test_tuning_comes_from_the_environment_and_is_checked():
    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}
    c = Config.from_env({**base, "FASTCOLL_TUNING": "spin_reads=0, doubling=0,piece_bytes=4096"})
    assert (c.spin_reads, c.doubling, c.piece_bytes) == (0, False, 4096)
    for bad in ("spin=3", "doubling=maybe", "piece_bytes=-1", "yield_reads"):
        with pytest.raises(ValueError, match="FASTCOLL_TUNING"):
            Config.from_env({**base, "FASTCOLL_TUNING": bad})
