"""One rank of tests/test_graph.py: mx.distributed under fastcoll.mlx_compat (graph mode where the
environment lets it run).

    python graph_worker.py check       every size and dtype the graph's table serves, then
                                       "graph checks passed" (or "eager checks passed" where
                                       the table cannot run and the eager collectives serve)

FASTCOLL_TEST_GRAPH_UNAVAILABLE=old-mlx (MLX says it is 0.29.3) or no-mpi (MLX's MPI backend
loads nothing) makes graph mode unable to run on this rank, as such an MLX would.
    python graph_worker.py die RANK    rank RANK ends itself (SIGKILL) in the middle of a loop of
                                       all_sums; the others must end with the error, not hang
    python graph_worker.py mismatch    rank r sums r + 4 elements: the ranks call different
                                       collectives
    python graph_worker.py streams     two all_sums of one shape on two MLX streams, the input of
                                       one slow on rank 0 and of the other on rank 1: each must
                                       get its own sum ("streams kept apart")
    python graph_worker.py eager       an all_sum in MLX's graph, its input slow on rank 0 only,
                                       evaluated asynchronously, then at once an eager
                                       fastcoll.all_reduce: both right ("eager after graph")
    python graph_worker.py threads     rank 0 evaluates two all_sums at once from two threads;
                                       rank 1 comes late: the library ends rank 0 naming both
    python graph_worker.py finalize    fastcoll.finalize() while rank 0's graph all_sum still
                                       waits for its input: it waits for the call, then ends
    python graph_worker.py traced [CALLS PHASES]
                                       (with FASTCOLL_TRACE) an all_sum, an all_gather, an all_max,
                                       a send from rank 0 to 1, (with CALLS and PHASES, the most a
                                       traced table keeps: 20 all_sums more,) an all_sum, then
                                       fastcoll.finalize()
    python graph_worker.py queued      an eager all_reduce queued (async_op=True; rank 1 joins it
                                       1 s late), then at once an all_sum in MLX's graph, which
                                       waits behind it on rank 0
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import mlx.core as mx
import numpy as np

import fastcoll
from fastcoll import mlx_compat


def check(g) -> None:
    r, n = g.rank(), g.size()
    d = mx.distributed
    mode = "eager"
    if isinstance(g, d.Group) and type(g).__module__.startswith("mlx"):  # MLX's own group: its MPI
        from fastcoll.mlx_compat import graph  # backend's, over fastcoll's library, which it serves

        assert os.environ.get(graph.LIBNAME) == graph.library() and graph.carries(g), os.environ.get(graph.LIBNAME)
        mode = "graph"
    for count in (1, 1000, 3_000_000):  # the small calls' algorithm and the large calls' (ring)
        for dt in (mx.float32, mx.int32, mx.float16, mx.bfloat16):
            parts = [(mx.arange(count) % 7 + k).astype(dt) for k in range(n)]
            want = parts[0]
            for p in parts[1:]:
                want = want + p  # in dt, pairwise in rank order, as the engine reduces
            got = d.all_sum(parts[r], group=g)
            assert got.dtype == dt and bool(mx.all(got == want).item()), (count, dt)
    x = mx.array([float(r), -float(r), 2.5])
    assert d.all_max(x, group=g).tolist() == [n - 1.0, 0.0, 2.5]
    assert d.all_min(x.astype(mx.bfloat16), group=g).astype(mx.float32).tolist() == [0.0, -(n - 1.0), 2.5]
    c = mx.array([complex(r, -r)], dtype=mx.complex64)
    assert d.all_max(c, group=g).tolist() == [complex(n - 1, -(n - 1))]
    gathered = d.all_gather(mx.full((2, 3), r, dtype=mx.int16), group=g)
    assert gathered.shape == (2 * n, 3) and gathered[::2, 0].tolist() == list(range(n))
    if r == 0:
        mx.eval(d.send(mx.arange(5, dtype=mx.float32) * 2, 1, group=g))
    elif r == 1:
        assert d.recv((5,), mx.float32, 0, group=g).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    # a chain inside one graph: each all_sum's input is the last one's output
    y = mx.ones((16,))
    for _ in range(5):
        y = d.all_sum(y, group=g) / n
    assert y.tolist() == [1.0] * 16
    assert d.sum_scatter(mx.arange(2.0 * n), group=g).tolist() == [n * 2.0 * r, n * (2.0 * r + 1)]
    again = d.init()  # mlx-lm asks more than once: the same group (or, eagerly, the same ranks)
    assert (again.rank(), again.size()) == (r, n) and type(again) is type(g)
    print(f"rank {r}: {mode} checks passed", flush=True)


def die(g, victim: int) -> None:
    x = mx.ones((256,))
    for i in range(100000):
        if g.rank() == victim and i == 50:
            os.kill(os.getpid(), signal.SIGKILL)
        x = mx.distributed.all_sum(x, group=g) / g.size()
        mx.eval(x)
    print("the loop ended without the victim's death being noticed", flush=True)


def slow(n: int) -> mx.array:
    """64 zeros that take a while to compute when n is large (n x n products), at once when small."""
    m = mx.random.normal((n, n), key=mx.random.key(1))
    for _ in range(8):
        m = mx.tanh(m @ m)
    return 0 * m[0, :64]


def streams(g) -> None:
    r, n = g.rank(), g.size()
    d = mx.distributed
    s1, s2 = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
    with mx.stream(s1):
        a = d.all_sum(1.0 + r + slow(700 if r == 0 else 64), group=g)
    with mx.stream(s2):
        b = d.all_sum(100.0 + r + slow(64 if r == 0 else 700), group=g)
    mx.eval(a, b)
    want_a, want_b = sum(1.0 + q for q in range(n)), sum(100.0 + q for q in range(n))
    assert a.tolist() == [want_a] * 64 and b.tolist() == [want_b] * 64, (a.tolist()[:2], b.tolist()[:2])
    print(f"rank {r}: streams kept apart", flush=True)


def eager_after_graph(g) -> None:
    r, n = g.rank(), g.size()
    y = mx.distributed.all_sum(1.0 + r + slow(700 if r == 0 else 64), group=g)
    mx.async_eval(y)
    if r != 0:
        time.sleep(1)  # this rank's graph call goes first here; rank 0's input is still being made
    z = fastcoll.all_reduce(np.array([10.0 * (r + 1)]))  # the job's group: no part of MLX's graph
    assert z.tolist() == [10.0 * n * (n + 1) / 2], z
    assert y.tolist() == [sum(1.0 + q for q in range(n))] * 64, y.tolist()[:2]
    print(f"rank {r}: eager after graph in order", flush=True)


def finalize_after_graph(g) -> None:
    r, n = g.rank(), g.size()
    y = mx.distributed.all_sum(1.0 + r + slow(700 if r == 0 else 64), group=g)
    mx.async_eval(y)
    fastcoll.finalize()
    assert y.tolist() == [sum(1.0 + q for q in range(n))] * 64, y.tolist()[:2]
    print(f"rank {r}: finalized after the graph's call", flush=True)


def threads(g) -> None:
    if g.rank() != 0:
        time.sleep(4)  # rank 0's first call waits for this rank meanwhile
    else:
        t = threading.Thread(target=lambda: mx.eval(mx.distributed.all_sum(mx.ones((8,)), group=g)), daemon=True)
        t.start()
        time.sleep(1)
    mx.eval(mx.distributed.all_gather(mx.ones((3,)), group=g))
    print("two threads' calls at once were not caught", flush=True)


def traced(g, bounds: list[str]) -> None:
    r, d = g.rank(), mx.distributed
    mx.eval(d.all_sum(mx.ones((16,)), group=g))
    mx.eval(d.all_gather(mx.full((3,), r, dtype=mx.int16), group=g))
    mx.eval(d.all_max(mx.arange(4) + r, group=g))
    if r == 0:
        mx.eval(d.send(mx.arange(5, dtype=mx.float32), 1, group=g))
    else:
        mx.eval(d.recv((5,), mx.float32, 0, group=g))
    for _ in range(20 if bounds else 0):  # more calls than the bound keeps
        mx.eval(d.all_sum(mx.ones((16,)), group=g))
    mx.eval(d.all_sum(mx.array(1.0), group=g))
    fastcoll.finalize()
    print(f"rank {r}: traced calls made", flush=True)


def queued(g) -> None:
    r = g.rank()
    if r == 1:
        time.sleep(1)
    work = fastcoll.all_reduce(np.ones(4, np.float32), async_op=True)
    y = mx.distributed.all_sum(mx.ones((8,)), group=g)
    mx.eval(y)
    work.wait()
    assert y.tolist() == [2.0] * 8
    fastcoll.finalize()
    print(f"rank {r}: queued behind the eager call", flush=True)


def unavailable(how: str) -> None:
    """Make graph mode unable to run here (FASTCOLL_TEST_GRAPH_UNAVAILABLE), as it cannot on an
    MLX older than 0.29.4 or one built without its MPI backend."""
    from fastcoll.mlx_compat import graph

    if how == "old-mlx":
        mx.__version__ = "0.29.3"
    elif how == "no-mpi":
        graph.MLX["is_available"] = lambda backend="any": False
    elif how:
        raise SystemExit(f"unknown FASTCOLL_TEST_GRAPH_UNAVAILABLE {how!r}")


def main() -> None:
    mx.set_default_device(mx.cpu)
    unavailable(os.environ.get("FASTCOLL_TEST_GRAPH_UNAVAILABLE", ""))
    mlx_compat.install()
    what = sys.argv[1]
    if what == "traced" and sys.argv[2:]:  # before init(), which opens the graph's table
        from fastcoll import testhooks

        testhooks.set_graph_trace_bounds(int(sys.argv[2]), int(sys.argv[3]))
    g = mx.distributed.init()
    if what == "traced":
        traced(g, sys.argv[2:])
        return
    if what == "queued":
        queued(g)
        return
    if what == "check":
        check(g)
    elif what == "die":
        die(g, int(sys.argv[2]))
    elif what == "finalize":
        finalize_after_graph(g)
        return
    elif what in ("streams", "eager", "threads"):
        {"streams": streams, "eager": eager_after_graph, "threads": threads}[what](g)
    elif what == "mismatch":
        mx.eval(mx.distributed.all_sum(mx.ones((g.rank() + 4,)), group=g))
        print("a mismatched call returned", flush=True)
    else:
        raise SystemExit(f"unknown action {what!r}")
    # Leave together: no rank closes its links while another still evaluates its last call.
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=g))


if __name__ == "__main__":
    main()
