"""One rank of tests/test_graph.py's splits: MLX's Group.split in graph mode (FASTCOLL_MLX_GRAPH=1),
which fastcoll's MPI library answers with fastcoll's own Group.split.

    python graph_split_worker.py split        sub-groups of MLX's group: membership and key order,
                                              every collective and dtype on them (as MLX's own
                                              graph nodes: they run inside mx.compile), point to
                                              point, nested splits, calls of two groups in one
                                              graph, sum_scatter; "rank R: split checks passed"
    python graph_split_worker.py mismatch     on a split, rank 0 sums what rank 1 gathers
    python graph_split_worker.py p2p          on a split, rank 0 sends 4 floats, rank 1 takes 5
    python graph_split_worker.py failed       rank 0 splits while rank 1 calls a barrier: rank 0's
                                              split raises fastcoll's error, not MLX's
"""

from __future__ import annotations

import sys

import mlx.core as mx

import fastcoll

from checks import check, run
from fastcoll import mlx_compat

d = mx.distributed


def membership(g) -> tuple:
    r, n = g.rank(), g.size()
    odd = g.split(r % 2)
    members = [q for q in range(n) if q % 2 == r % 2]
    check(isinstance(odd, d.Group) and type(odd).__module__.startswith("mlx"), f"MLX's own group: {type(odd)}")
    check((odd.rank(), odd.size()) == (members.index(r), len(members)), f"split by parity: {odd.rank()}/{odd.size()}")
    check(odd.fastcoll_group.members() == members, f"its fastcoll group: {odd.fastcoll_group}")
    rev = g.split(7, key=100 - r)  # one group, ranks reversed by key
    check((rev.rank(), rev.size()) == (n - 1 - r, n), f"key order: {rev.rank()}")
    check(rev.fastcoll_group.members() == list(range(n))[::-1], f"{rev.fastcoll_group}")
    check(g.fastcoll_group.members() == list(range(n)), "the job's group")
    return odd, rev


def collectives(sub) -> None:
    """Every collective MLX's MPI backend has, as MLX's graph nodes on `sub` (its ranks in rank order)."""
    r, n = sub.rank(), sub.size()
    for count in (5, 300_000):
        for dt in (mx.float32, mx.int32, mx.float16, mx.bfloat16):  # the last two: MLX's own ops
            parts = [(mx.arange(count) % 7 + k).astype(dt) for k in range(n)]
            got = d.all_sum(parts[r], group=sub)
            want = sum(p.astype(mx.float32) for p in parts).astype(dt)
            check(got.dtype == dt and bool(mx.all(got == want).item()), f"all_sum {count} {dt} on {n} ranks")
    x = mx.array([float(r), -float(r), 2.5])
    check(d.all_max(x, group=sub).tolist() == [n - 1.0, 0.0, 2.5], "all_max")
    check(d.all_min(x.astype(mx.float16), group=sub).tolist() == [0.0, -(n - 1.0), 2.5], "all_min float16")
    check(d.all_sum(mx.array([r == 0, False]), group=sub).tolist() == [True, False], "bool sum is or")
    c = mx.array([complex(r, -r)], dtype=mx.complex64)
    check(d.all_max(c, group=sub).tolist() == [complex(n - 1, -(n - 1))], "complex64 max")
    gathered = d.all_gather(mx.full((2, 3), r, dtype=mx.int16), group=sub)
    check(gathered.shape == (2 * n, 3) and gathered[::2, 0].tolist() == list(range(n)), f"all_gather {gathered}")
    if n > 1:
        if r == 0:
            mx.eval(d.send(mx.arange(5, dtype=mx.float32) * 2, 1, group=sub))
        elif r == 1:
            check(d.recv((5,), mx.float32, 0, group=sub).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0], "recv")
        back = d.recv_like(mx.zeros((3,)), (r - 1) % n, group=sub) if r % 2 else None
        if r % 2 == 0 and r + 1 < n:
            mx.eval(d.send(mx.full((3,), float(r)), r + 1, group=sub))
        if back is not None:
            check(back.tolist() == [r - 1.0] * 3, "recv_like from the rank below")


def split_checks(g) -> None:
    odd, rev = membership(g)
    for sub in (odd, rev):
        collectives(sub)
    inner = rev.split(rev.rank() // 2)  # nested
    check(d.all_sum(mx.array([1]), group=inner).item() == inner.size(), "all_sum on a nested split")
    # In MLX's graph: inside mx.compile (the eager path refuses), and two groups' calls in one graph.
    twice = mx.compile(lambda v: d.all_sum(v, group=odd) * 2)
    check(twice(mx.ones((4,))).tolist() == [2.0 * odd.size()] * 4, "an all_sum on a split, compiled")
    both = d.all_sum(mx.ones((2,)), group=odd) + d.all_sum(mx.ones((2,)), group=g)
    check(both.tolist() == [odd.size() + g.size()] * 2, "a split's and the job's all_sum in one graph")
    if odd.size() > 1:  # sum_scatter, which MLX's MPI backend lacks, runs eagerly on the split
        s = d.sum_scatter(mx.arange(2.0 * odd.size()), group=odd)
        check(s.tolist() == [odd.size() * 2.0 * odd.rank(), odd.size() * (2.0 * odd.rank() + 1)], "sum_scatter")


def main() -> None:
    mx.set_default_device(mx.cpu)
    mlx_compat.install()
    g = d.init()
    what = sys.argv[1]
    if what == "split":
        split_checks(g)
        print(f"rank {g.rank()}: split checks passed", flush=True)
    elif what == "mismatch":
        sub = g.split(0)
        x = mx.ones((4,))
        mx.eval(d.all_sum(x, group=sub) if sub.rank() == 0 else d.all_gather(x, group=sub))
        print("a mismatched call returned", flush=True)
    elif what == "p2p":
        sub = g.split(0)
        if sub.rank() == 0:
            mx.eval(d.send(mx.ones((4,)), 1, group=sub))
        elif sub.rank() == 1:
            mx.eval(d.recv((5,), mx.float32, 0, group=sub))
        print(f"rank {sub.rank()}: its p2p call returned", flush=True)
    elif what == "failed":
        try:
            g.split(0) if g.rank() == 0 else fastcoll.barrier()
        except Exception as e:  # noqa: BLE001 (what was raised is the point)
            print(f"rank {g.rank()}: raised {type(e).__name__}: {e}", flush=True)
        return
    mx.eval(d.all_sum(mx.array(1.0), group=g))  # leave together


if __name__ == "__main__":
    run(main)
