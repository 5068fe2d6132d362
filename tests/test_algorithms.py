"""The pure-Python engine's schedules (fastcoll/algorithms/reference.py) on their own, at 2-8
ranks that are threads of this process (an in-process transport), against numpy: milliseconds a
case; and the rule that names the native engine's algorithm. The multi-process tests
(test_collectives.py) run both engines over real sockets and shared memory, the native engine's
algorithms on either side of each crossover."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from fastcoll import dtypes
from fastcoll.algorithms import Call, blocks, reference, select
from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, MismatchError
from fastcoll.transport.inproc import mesh

WORLDS = range(2, 9)
# Message sizes: one piece for everything, and a few bytes a piece (several pieces a block).
PIECES = [1 << 20, 12]


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


def rank_order(xs: list[np.ndarray], dtype: str, op: str) -> np.ndarray:
    """((x0 op x1) op x2) ...: the order every schedule combines contributions in."""
    combine = dtypes.reducer(dtype, op)
    out = xs[0].copy()
    for x in xs[1:]:
        combine(out, x, out)
    return out


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("count", [0, 1, 7, 100, 1000])
@pytest.mark.parametrize("piece", PIECES)
@pytest.mark.parametrize("small", [True, False])
def test_all_reduce(n, count, piece, small):
    """Both of the reference all_reduce's shapes: one round (a small call), or a reduce_scatter
    then an all_gather."""
    xs = data(n, count)
    want = np.sum(xs, axis=0, dtype=np.float32)

    def body(call):
        buf = np.empty_like(xs[call.rank])
        reference.all_reduce(call, xs[call.rank], buf, dtypes.reducer("float32", "sum"), small)
        return buf

    got = run_ranks(n, body, piece_bytes=piece)
    for r in range(n):
        assert np.array_equal(got[r], want), r
        assert got[r].tobytes() == got[0].tobytes()  # bit-identical on every rank


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
@pytest.mark.parametrize("small", [True, False])
def test_reductions_combine_in_rank_order(n, op, small):
    """Floats whose sum depends on the order: every rank gets ((x0 op x1) op x2) ..., bit for
    bit, as the native engine's direct exchange computes it (and float16 through float32)."""
    rng = np.random.default_rng(n)
    for dtype in ("float32", "float16"):
        scale = 1.0 if op == "prod" else 10.0 ** rng.integers(-2, 3, (n, 301))  # (no product overflows)
        xs = list((rng.uniform(0.5, 1.5, (n, 301)) * rng.choice([-1.0, 1.0], (n, 301)) * scale).astype(dtype))
        want = rank_order(xs, dtype, op)
        assert want.tobytes() != rank_order(xs[::-1], dtype, op).tobytes()  # the order shows in the bits
        if op == "mean":
            dtypes.finish_mean(dtype, want, n)

        def body(call):
            buf = np.empty_like(xs[call.rank])
            reference.all_reduce(call, xs[call.rank], buf, call.traced(dtypes.reducer(dtype, op)), small)
            if op == "mean":
                dtypes.finish_mean(dtype, buf, n)
            return buf

        for got in run_ranks(n, body, piece_bytes=64):
            assert got.tobytes() == want.tobytes(), (dtype, op)


@pytest.mark.parametrize("small", [True, False])
def test_all_reduce_in_place(small):
    """src and buf the same array: the contribution is read before the result overwrites it."""
    xs = data(3, 50)

    def body(call):
        buf = xs[call.rank].copy()
        reference.all_reduce(call, buf, buf, dtypes.reducer("float32", "sum"), small)
        return buf

    for got in run_ranks(3, body, piece_bytes=16):
        assert np.array_equal(got, np.sum(xs, axis=0))


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("count", [1, 5, 64])
def test_all_gather(n, count):
    xs = data(n, count, np.int32)
    want = np.concatenate(xs)

    def body(call):
        out = np.empty(n * count, np.int32)
        bounds = blocks(out.size, n)
        a, b = bounds[call.rank]
        out[a:b] = xs[call.rank]
        reference.all_gather(call, out, bounds)
        return out

    for piece in PIECES:
        for r, got in enumerate(run_ranks(n, body, piece_bytes=piece)):
            assert np.array_equal(got, want), r


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_reduce_scatter(n, rows):
    xs = data(n, n * rows, np.int64)
    total = np.sum(xs, axis=0)
    bounds = blocks(n * rows, n)

    def body(call):
        a, b = bounds[call.rank]
        out = np.empty(b - a, np.int64)
        reference.reduce_scatter(call, xs[call.rank], out, bounds, dtypes.reducer("int64", "sum"))
        return out

    for piece in PIECES:
        for r, got in enumerate(run_ranks(n, body, piece_bytes=piece)):
            a, b = bounds[r]
            assert np.array_equal(got, total[a:b]), r


@pytest.mark.parametrize("n", WORLDS)
def test_broadcast_from_every_root(n):
    for root in range(n):
        x = data(n, 300)[root]

        def body(call):
            buf = x.copy() if call.rank == root else np.zeros_like(x)
            reference.broadcast(call, buf, root)
            return buf

        for r, got in enumerate(run_ranks(n, body)):
            assert np.array_equal(got, x), (root, r)


@pytest.mark.parametrize("n", WORLDS)
def test_barrier(n):
    assert run_ranks(n, reference.barrier) == [None] * n


def test_a_sub_group_maps_its_ranks_to_the_mesh():
    """Group ranks 0, 1, 2 are mesh ranks 5, 1, 3 of six: the algorithms see only the group."""
    xs = data(3, 50)

    def body(call):
        buf = np.empty_like(xs[call.rank])
        reference.all_reduce(call, xs[call.rank], buf, dtypes.reducer("float32", "sum"), True)
        return buf

    for got in run_ranks(6, body, ranks=[5, 1, 3]):
        assert np.array_equal(got, np.sum(xs, axis=0))


def test_a_rank_that_calls_something_else_is_a_mismatch():
    def body(call):
        if call.rank == 1:
            call.sig = "other()"
        reference.barrier(call)

    with pytest.raises(MismatchError, match="other"):
        run_ranks(2, body)


def test_a_missing_rank_is_a_timeout():
    def body(call):
        if call.rank == 0:
            reference.barrier(call)

    with pytest.raises(CollectiveTimeoutError):
        run_ranks(2, body, timeout=0.2)


SILENT_SCHEDULES = {
    "small all_reduce": lambda c, x: reference.all_reduce(c, x, np.empty_like(x), np.add, True),
    "large all_reduce": lambda c, x: reference.all_reduce(c, x, np.empty_like(x), np.add, False),
    "reduce_scatter": lambda c, x: reference.reduce_scatter(c, x, np.empty(2, x.dtype), blocks(8, 4), np.add),
    "all_gather": lambda c, x: reference.all_gather(c, x.copy(), blocks(8, 4)),
    "all_to_all": lambda c, x: reference.all_to_all(c, x, np.empty_like(x), blocks(8, 4), blocks(8, 4)),
    "barrier": lambda c, x: reference.barrier(c),
}


@pytest.mark.parametrize("schedule", SILENT_SCHEDULES)
def test_a_notice_behind_a_peers_data_stops_a_wait_on_another(schedule):
    """Four ranks, rank 2 silent: rank 3 sends its data, waits out its short limit and sends its
    timeout notice. Ranks 0 and 1, waiting on rank 2, must hear that notice at once (and then
    compare waits: fastcoll/diagnosis.py), not wait out their own limit: a schedule that read
    its peers in rank order left rank 3's data unread, and the notice behind it, the whole time
    (the reference's small all_reduce, in the process tests of 'two notices at once')."""
    transports = mesh(4)
    run = SILENT_SCHEDULES[schedule]
    outcome: dict = {}

    def one(r: int) -> None:
        limit = 0.3 if r == 3 else 5.0
        call = Call(transports[r], 0, "test()", time.monotonic() + limit, r, 4, range(4), 1 << 20)
        start = time.monotonic()
        try:
            run(call, np.arange(8, dtype=np.float32))
            outcome[r] = ("returned", time.monotonic() - start)
        except CollectiveTimeoutError as e:
            if r == 3:
                call.t.abort(e)  # the notice: whom rank 3 waited for
            outcome[r] = (e, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(r,)) for r in (0, 1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    assert getattr(outcome[3][0], "waiting_for", None) == 2, outcome
    for r in (0, 1):
        err, took = outcome[r]
        assert getattr(err, "from_peer", False) and err.sender == 3 and err.sender_waits == 2, (r, outcome)
        assert took < 2.0, f"rank {r} heard rank 3's notice only after {took:.2f} s"


def test_the_selection_rule():
    """The native engine's algorithm for a call, by name (what an Op carries)."""
    c = Config()
    assert select.algorithm("all_reduce", 4, 2, c) == "direct"
    assert select.algorithm("all_reduce", c.direct_max_bytes_two_ranks, 2, c) == "direct"
    assert select.algorithm("all_reduce", c.direct_max_bytes_two_ranks + 1, 2, c) == "ring"
    assert select.algorithm("all_reduce", 4, 4, c) == "doubling"
    assert select.algorithm("all_reduce", 4, 3, c) == "direct"
    assert select.algorithm("broadcast", 4, 4, c) == "direct"  # doubling has no broadcast
    assert select.algorithm("all_gather", c.direct_max_bytes + 1, 4, c) == "ring"
    off = Config(doubling=False, direct_max_bytes=0)
    assert select.algorithm("all_reduce", 4, 4, off) == "ring"
    assert select.by_size("all_reduce", 8, c) == (c.direct_max_bytes, "doubling", "ring")
    with pytest.raises(ValueError, match="no algorithm"):
        select.algorithm("scan", 4, 2, c)


def test_doubling_counts_the_steps_that_cross_between_hosts():
    """Recursive doubling's step k pairs rank r with r ^ 2**k: a step crosses the network where
    any pair of it sits on two hosts."""
    assert select.doubling_crossings(["a", "b", "c", "d"]) == 2  # a rank a host
    assert select.doubling_crossings(["a", "a", "b", "b"]) == 1  # two a host: only the second step
    assert select.doubling_crossings(["a", "b", "a", "b"]) == 1  # only the first
    assert select.doubling_crossings(["a"] * 4) == 0
    assert select.doubling_crossings(["a"] * 4 + ["b"] * 4) == 1
    assert select.doubling_crossings(["a", "a", "b", "b", "c", "c", "d", "d"]) == 2
    assert select.doubling_crossings(["a", "b", "c"]) == 0  # doubling serves no group of three
    assert select.doubling_crossings(["a", "b"]) == 0


def test_small_calls_go_direct_where_doubling_would_cross_hosts_twice():
    """Across hosts each of doubling's crossing steps is a trip of the network, where direct sends
    take one (bench/NOTES.md 111): a group that doubling would take across hosts twice or more
    runs direct; one host, or a single crossing, keeps doubling; FASTCOLL_TUNING's choice wins."""
    c = Config(world_size=4)
    spread = select.for_hosts(c, ["a", "b", "c", "d"])
    assert not spread.doubling and select.algorithm("all_reduce", 4, 4, spread) == "direct"
    assert select.by_size("all_gather", 4, spread)[1] == "direct"  # graph mode's rule follows
    for hosts in (["a"] * 4, ["a", "a", "b", "b"]):
        assert select.for_hosts(c, hosts) is c
    tuned = Config.from_env({"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1", "FASTCOLL_TUNING": "doubling=1"})
    assert select.for_hosts(tuned, ["a", "b", "c", "d"]).doubling


def test_a_group_chooses_by_its_own_ranks_hosts():
    """The job's group of four hosts runs its small calls direct; a split whose ranks share one
    host gets doubling back; a group made without the hosts (a world of one, a test's group)
    keeps the job's config."""
    from fastcoll.group import Group, SubGroup
    g = Group(Config(rank=1, world_size=4), None, None, host_ids=["a", "b", "c", "d"])
    assert g.choose("all_reduce", 4) == "direct" and g.choose("all_reduce", 1 << 30) == "ring"
    job = Group(Config(rank=0, world_size=8), None, None, host_ids=["a"] * 4 + ["b", "b", "c", "c"])
    assert job.choose("all_reduce", 4) == "direct"
    assert SubGroup(job, [0, 1, 2, 3], "s0c0/").choose("all_reduce", 4) == "doubling"
    assert Group(Config(rank=1, world_size=4), None, None, host_ids=["a", "a", "b", "b"]).choose("all_reduce", 4) == "doubling"
    assert Group(Config(rank=1, world_size=4)).choose("all_reduce", 4) == "doubling"


def test_the_rule_names_only_algorithms_the_native_engine_has():
    """Every name the rule gives is in the native engine's registry (its import checks the two
    sets are equal, so a renamed algorithm cannot reach it unnoticed)."""
    c = Config()
    names = {select.algorithm(k, nbytes, n, c) for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                         "all_to_all", "reduce", "gather", "scatter", "barrier")
             for n in (2, 3, 4, 8) for nbytes in (0, 1 << 30)}
    assert names == set(select.ALGORITHMS)


def test_tuning_comes_from_the_environment_and_is_checked():
    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}
    c = Config.from_env({**base, "FASTCOLL_TUNING": "spin_reads=0, doubling=0,piece_bytes=4096"})
    assert (c.spin_reads, c.doubling, c.piece_bytes) == (0, False, 4096)
    for bad in ("spin=3", "doubling=maybe", "piece_bytes=-1", "yield_reads"):
        with pytest.raises(ValueError, match="FASTCOLL_TUNING"):
            Config.from_env({**base, "FASTCOLL_TUNING": bad})


def test_zmq_waits_do_not_spin_where_ranks_outnumber_cpus(monkeypatch):
    """A ZeroMQ wait's non-blocking receives hold a core that a peer, or libzmq's I/O thread
    carrying its message, needs where this host's ranks outnumber its CPUs: there it sleeps in
    poll at once (four ranks on 2 cores: small calls about 1.7 times as long with the spin,
    bench/NOTES.md), elsewhere it spins as before, and a FASTCOLL_TUNING spin_reads wins."""
    zmq = pytest.importorskip("fastcoll.transport.zmq", reason="pyzmq is not installed")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}  # (the host's ranks are spin_reads' argument)
    c = Config.from_env(base)
    assert zmq.spin_reads(c, 4) == 0
    assert zmq.spin_reads(c, 2) == 4 * c.spin_reads > 0
    assert zmq.spin_reads(Config.from_env({**base, "FASTCOLL_TUNING": "spin_reads=5"}), 4) == 20
