"""fastcoll Group.split (sub-groups over the parent's connections), as one rank of a job.

Checks membership and key order, every collective on sub-groups (the direct and the ring
path), point to point, async collectives of two groups interleaved, nested splits, and that
calling two groups' collectives in different orders is a MismatchError on every rank, not a
hang and not wrong data. Prints "rank R: N checks passed" and, last, "mismatch detected".
"""

from __future__ import annotations


import numpy as np

import fastcoll
from fastcoll.errors import FastcollError, MismatchError
import checks
from checks import check, run



def main() -> None:
    g = fastcoll.init()
    n, r = g.size(), g.rank()

    odd = g.split(r % 2)
    members = [q for q in range(n) if q % 2 == r % 2]
    check(odd.size() == len(members) and odd.rank() == members.index(r), f"split by parity: {odd}")
    check(odd.members() == members, f"global ranks {odd.members()}")

    rev = g.split(7, key=100 - r)  # one group, ranks reversed by key
    check(rev.size() == n and rev.rank() == n - 1 - r, f"key order: {rev}")
    tie = g.split(0, key=0)  # equal keys: parent rank order
    check(tie.rank() == r, f"equal keys keep the parent order: {tie}")

    def expect(group, values):
        return sum(values[q] for q in group.members())

    x = np.array([r + 1.0, 10.0 * (r + 1)])
    vals = {q: np.array([q + 1.0, 10.0 * (q + 1)]) for q in range(n)}
    for sub in (odd, rev):
        y = fastcoll.all_reduce(x, group=sub)
        check(np.array_equal(y, expect(sub, vals)), f"all_reduce on {sub}: {y}")
        big = np.full(200_000, float(r + 1))  # 1.6 MB: the ring path
        y = fastcoll.all_reduce(big, group=sub)
        check(np.all(y == sum(q + 1.0 for q in sub.members())), f"ring all_reduce on {sub}")
        y = fastcoll.all_gather(np.array([r]), group=sub)
        check(list(y) == sub.members(), f"all_gather on {sub}: {y}")
        rs = fastcoll.reduce_scatter(np.arange(2.0 * sub.size()) + r, group=sub)
        full = sum(np.arange(2.0 * sub.size()) + q for q in sub.members())
        check(np.array_equal(rs, full[2 * sub.rank() : 2 * sub.rank() + 2]), f"reduce_scatter on {sub}")
        b = fastcoll.broadcast(np.array([r]), root=sub.size() - 1, group=sub)
        check(b[0] == sub.members()[-1], f"broadcast on {sub}")
        fastcoll.barrier(group=sub)

    # Point to point inside a sub-group, in its own ranks.
    if rev.rank() == 0:
        fastcoll.send(np.arange(4.0) + r, 1, group=rev)
    elif rev.rank() == 1:
        got = fastcoll.recv(4, np.float64, 0, group=rev)
        check(np.array_equal(got, np.arange(4.0) + rev.members()[0]), f"recv in a sub-group: {got}")

    # Async collectives of the world and a sub-group, interleaved in the same order everywhere.
    works = []
    for i in range(6):
        grp = None if i % 2 else rev
        works.append((grp, fastcoll.all_reduce(np.array([float(r + i)]), group=grp, async_op=True)))
    for i, (grp, w) in enumerate(works):
        check(w.wait()[0] == sum(q + i for q in range(n)), f"async #{i}")

    # Nested: split a sub-group again.
    inner = rev.split(rev.rank() // 2)
    check(inner.size() == len([q for q in range(n) if q // 2 == rev.rank() // 2]), f"nested split {inner}")
    y = fastcoll.all_reduce(np.array([1]), group=inner)
    check(y[0] == inner.size(), "all_reduce on a nested group")
    inner.finalize()
    check(fastcoll.all_reduce(np.array([1]))[0] == n, "finalize() on a sub-group leaves the world usable")
    try:
        fastcoll.all_reduce(np.array([1]), group=inner)
    except FastcollError:
        check(True, "")
    else:
        raise AssertionError("a finalized sub-group still ran a collective")

    # Different orders on two groups sharing ranks: a MismatchError, everywhere.
    same = g.split(0)
    print(f"rank {r}: {checks.passed} checks passed", flush=True)
    try:
        if r == 0:
            fastcoll.all_reduce(np.array([1.0]), group=same, timeout=20)
        else:
            fastcoll.all_reduce(np.array([1.0]), timeout=20)
    except MismatchError as e:
        print(f"mismatch detected: {e}", flush=True)
    else:
        raise AssertionError("two groups' messages were confused")


if __name__ == "__main__":
    run(main, cleanup=fastcoll.finalize)
