"""One rank of tests/test_agreement.py: a collective whose ranks disagree on an argument they
must share, which every rank must refuse with a MismatchError before returning anything.

    agreement_worker.py CASE

Cases (n ranks):

    root-<kind>[-large]   broadcast, scatter, reduce or gather: rank r passes root=r (every rank
                          thinks itself the root), after two agreed calls of the same kind
    odd-root-<kind>       every rank passes root=0 but the last, which passes root=1
    counts                all_to_all_v with recv_counts given: rank 1 expects one piece of rank
                          0's rows where rank 0 sends two (FASTCOLL_TUNING=piece_bytes=65536)
    sizes                 all_gather_v with sizes given, rank 0's list unlike the others'

Prints `AGREED` once the agreed calls were exact, then `RESULT <kind>` if the call returned, or
`ERROR <class> <message>`.
"""

from __future__ import annotations

import sys

import numpy as np

import fastcoll

CASE = sys.argv[1]
LARGE = 1 << 20  # elements: past every direct crossover (the ring's broadcast, the chain's reduce)
PIECE = 65536 // 4  # float32 elements in a piece of FASTCOLL_TUNING=piece_bytes=65536


def rooted(kind: str, x: np.ndarray, root: int) -> object:
    return getattr(fastcoll, kind)(x, root=root)


def agreed(kind: str, r: int, n: int, items: int) -> None:
    """Two calls of `kind` whose ranks agree (root 0): exact, and the second one planned where
    the kind has plans."""
    for _ in range(2):
        x = np.full(items * n, r + 1.0, np.float32)
        y = rooted(kind, x, 0)
        if kind == "broadcast":
            assert np.all(y == 1.0), y[:4]
        elif kind == "scatter":
            assert y.shape == (items,) and np.all(y == 1.0), y[:4]
        elif kind == "reduce":
            assert (y is None) == (r != 0) and (r != 0 or np.all(y == n * (n + 1) / 2)), y
        else:
            assert (y is None) == (r != 0) and (r != 0 or y.size == items * n * n), y
    print("AGREED", flush=True)


def call(r: int, n: int) -> str:
    """The disagreeing call; what it returned."""
    if CASE == "counts":
        counts = [2 * PIECE if (r, j) == (0, 1) else 1 for j in range(n)]
        recv = [PIECE if (i, r) == (0, 1) else 1 for i in range(n)]
        x = np.ones(sum(counts), np.float32)
        fastcoll.all_to_all_v(x, counts, recv_counts=recv)
        return "all_to_all_v"
    if CASE == "sizes":
        sizes = [r + 1 for r in range(n)]
        if r == 0:
            sizes[-1] += 1
        fastcoll.all_gather_v(np.ones((r + 1, 2), np.float32), sizes=sizes)
        return "all_gather_v"
    odd = CASE.startswith("odd-root-")
    kind = CASE.removeprefix("odd-root-").removeprefix("root-").removesuffix("-large")
    items = LARGE if CASE.endswith("-large") else 4
    agreed(kind, r, n, items)
    root = (1 if r == n - 1 else 0) if odd else r
    rooted(kind, np.full(items * n, 10.0 * (r + 1), np.float32), root)
    return kind


def main() -> None:
    g = fastcoll.init()
    try:
        print("RESULT", call(g.rank(), g.size()), flush=True)
    except fastcoll.FastcollError as e:
        print("ERROR", type(e).__name__, str(e).replace("\n", " "), flush=True)
    fastcoll.finalize()


if __name__ == "__main__":
    main()
