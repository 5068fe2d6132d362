"""One rank of tests/test_results.py: large numpy results (made over memory the native engine
keeps between calls, Group.empty) stay each its own while they live: a result kept alive is never
written by a later call, whichever collective made it, planned or not; a result let go is reused
(native engine) and the call that reuses it is exact. Prints what owns a result's memory, and
REUSED where a result landed on memory let go (by the engine's cache, or by chance of malloc's)."""

from __future__ import annotations

import numpy as np

import fastcoll
from checks import check, run

N = 1 << 19  # float32 items: 2 MiB, above fastcoll.group.ENGINE_RESULT_BYTES


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def owner(a: np.ndarray) -> str:
    """The type of the object that owns a's memory (ndarray: numpy's own)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return type(a).__name__


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    base = np.arange(N, dtype=np.float32) % 97
    total = sum(base + p for p in range(n))
    kept = []
    for i in range(6):  # the first call takes the ordinary way, the later ones are planned
        y = fastcoll.all_reduce(base + r + i)
        check(np.array_equal(y, total + n * i), f"all_reduce #{i}")
        kept.append((y, total + n * i))
    check(len({address(y) for y, _ in kept}) == len(kept), "a live result shares its memory with another")
    for i, (y, want) in enumerate(kept):
        check(np.array_equal(y, want), f"all_reduce #{i} was written after it returned")
    gone = {address(y) for y, _ in kept}
    del kept, y
    again = fastcoll.all_reduce(base + r)
    check(np.array_equal(again, total), "all_reduce into memory let go")
    reused = address(again) in gone
    z = fastcoll.all_gather(base[: N // n] + r)
    check(np.array_equal(z, np.concatenate([base[: N // n] + p for p in range(n)])), "all_gather")
    b = fastcoll.broadcast(base + r, root=0)
    check(np.array_equal(b, base) and np.array_equal(again, total), "broadcast")
    rs = fastcoll.reduce_scatter(np.tile(base, n) + r)
    check(np.array_equal(rs, total) and np.array_equal(z[: N // n], base[: N // n]), "reduce_scatter")
    view = again[::2]  # a view keeps the memory: the next result must not land on it
    del again
    later = fastcoll.all_reduce(base + 2 * r)
    check(np.array_equal(view, total[::2]), "a view of a let-go result was written")
    check(np.array_equal(later, sum(base + 2 * p for p in range(n))), "all_reduce beside a view")
    print(f"owner={owner(later)}", "REUSED" if reused else "FRESH", g.transport_info(), flush=True)
    fastcoll.finalize()


run(main)
