"""The pure-Python engine's all_to_all, gather, scatter and reduce, and the uneven bounds, at 2-8
ranks that are threads of this process, against numpy (as test_algorithms.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fastcoll import dtypes
from fastcoll.algorithms import blocks, reference, select
from fastcoll.config import Config
from fastcoll.errors import MismatchError
from test_algorithms import PIECES, WORLDS, data, rank_order, run_ranks


def _cut(counts, row=1):
    out, s = [], 0
    for c in counts:
        out.append((s, s + c * row))
        s += c * row
    return out


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("rows", [1, 3, 50])
def test_all_to_all(n, rows):
    xs = data(n, n * rows, np.int32)
    bounds = blocks(n * rows, n)

    def body(call):
        out = np.full(n * rows, -1, np.int32)
        reference.all_to_all(call, xs[call.rank], out, bounds, bounds)
        return out

    for piece in PIECES:
        for r, got in enumerate(run_ranks(n, body, piece_bytes=piece)):
            a, b = bounds[r]
            want = np.concatenate([xs[i][a:b] for i in range(n)])
            assert np.array_equal(got, want), r


@pytest.mark.parametrize("n", WORLDS)
def test_uneven_all_to_all(n):
    """Counts differ by pair (zeros too), in several pieces a block."""
    rng = np.random.default_rng(n)
    counts = rng.integers(0, 5, size=(n, n))  # counts[i, j]: rows i sends to j
    counts[0, :] = 0  # a rank that sends nothing
    row = 3
    xs = [np.arange(counts[i].sum() * row, dtype=np.float64) + 1000 * i for i in range(n)]

    def body(call):
        r = call.rank
        recv = counts[:, r]
        out = np.empty(recv.sum() * row)
        reference.all_to_all(call, xs[r], out, _cut(counts[r], row), _cut(recv, row))
        return out

    got = run_ranks(n, body, piece_bytes=16)
    for r in range(n):
        want = np.concatenate([xs[i][_cut(counts[i], row)[r][0]:_cut(counts[i], row)[r][1]] for i in range(n)])
        assert np.array_equal(got[r], want), r


@pytest.mark.parametrize("n", WORLDS)
def test_gather_and_scatter_from_every_root(n):
    k = 37
    xs = data(n, k, np.int16)
    bounds = blocks(n * k, n)
    full = np.concatenate(xs)
    for root in range(n):
        def gbody(call):
            out = np.zeros(n * k, np.int16) if call.rank == root else None
            reference.gather(call, out, xs[call.rank], bounds, root)
            return out

        got = run_ranks(n, gbody, piece_bytes=20)
        assert np.array_equal(got[root], full)
        assert all(got[r] is None for r in range(n) if r != root)

        def sbody(call):
            out = np.zeros(k, np.int16)
            reference.scatter(call, full if call.rank == root else None, out, bounds, root)
            return out

        for r, got in enumerate(run_ranks(n, sbody, piece_bytes=20)):
            assert np.array_equal(got, xs[r]), (root, r)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("count", [0, 1, 100, 1000])
def test_reduce_onto_every_root(n, count):
    xs = [x * np.float32(1.1) for x in data(n, count)]  # rounding depends on the order
    want = rank_order(xs, "float32", "sum")
    for root in range(n):
        def body(call):
            buf = np.empty(count, np.float32) if call.rank == root else None
            reference.reduce(call, xs[call.rank], buf, root, dtypes.reducer("float32", "sum"))
            return buf

        got = run_ranks(n, body, piece_bytes=40)
        assert got[root].tobytes() == want.tobytes(), root
        assert all(got[r] is None for r in range(n) if r != root)


@pytest.mark.parametrize("n", WORLDS)
def test_uneven_all_gather_bounds(n):
    """all_gather_v runs the ordinary all_gather algorithms on uneven bounds (empty ones too)."""
    sizes = [(3 * r) % 5 for r in range(n)]
    bounds = _cut(sizes, 2)
    total = bounds[-1][1]
    parts = [np.arange(b - a, dtype=np.int64) + 100 * r for r, (a, b) in enumerate(bounds)]

    def body(call):
        out = np.full(total, -1, np.int64)
        a, b = bounds[call.rank]
        out[a:b] = parts[call.rank]
        reference.all_gather(call, out, bounds)
        return out

    for got in run_ranks(n, body, piece_bytes=24):
        assert np.array_equal(got, np.concatenate(parts))


def test_all_to_all_against_all_gather_is_a_mismatch():
    def body(call):
        if call.rank == 0:
            call.sig = "all_to_all(float32,(4,))"
            reference.all_to_all(call, np.zeros(4, np.float32), np.zeros(4, np.float32), blocks(4, 2), blocks(4, 2))
        else:
            call.sig = "all_gather(float32,(2,))"
            reference.all_gather(call, np.zeros(4, np.float32), blocks(4, 2))

    with pytest.raises(MismatchError, match=r"all_to_all.*all_gather|all_gather.*all_to_all"):
        run_ranks(2, body)


def test_the_selection_rule_for_the_new_collectives():
    c = Config()
    assert select.algorithm("all_to_all", 4, 4, c) == "direct"
    assert select.algorithm("all_to_all", c.direct_max_bytes + 1, 4, c) == "pairwise"
    assert select.algorithm("reduce", 4, 3, c) == "direct"
    assert select.algorithm("reduce", c.direct_max_bytes_two_ranks + 1, 2, c) == "chain"
    assert select.algorithm("gather", 1 << 30, 4, c) == "direct"
    assert select.algorithm("scatter", 4, 8, c) == "direct"
