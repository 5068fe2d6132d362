"""What a collective asks of the data plane: an `Op`, built by the public calls once they have
checked their arguments, and run by whichever engine the job has (fastcoll/engine/).

An Op names the collective, the algorithm the rule chose for it (fastcoll/algorithms/select.py;
the native engine runs it, the pure-Python engine its one schedule for the collective) and the
flat host buffers it reads and writes; it decides nothing itself. Every rank of a job runs the
same engine, so the ranks that run one Op send what each other expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fastcoll.algorithms import blocks

# The collectives an Op can describe.
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
         "gather", "scatter", "reduce", "send", "recv")

Bounds = list[tuple[int, int]]

# The collectives in which some ranks only send (a broadcast's root, a gather's other ranks): every
# rank first tells every other its signature, and reads every peer's before it returns
# (fastcoll.algorithms.Call.agree; fc_agree.c), so a rank that disagrees on the root is a
# MismatchError on every rank, not a result some ranks never checked.
AGREEING = frozenset(("broadcast", "scatter", "gather", "reduce"))


@dataclass(slots=True)
class Op:
    """One collective on flat host buffers (element offsets in `bounds`).

    kind            one of KINDS
    algorithm       the native engine's algorithm for it ("direct", "ring", ...: select.ALGORITHMS)
    src, dst        what this rank contributes and where its result goes (None where the
                    collective has none on this rank: a non-root's gather result, say)
    dtype, reduce   the dtype's and the reduction's names, for the reductions
    root            the root of a rooted collective; the peer of a send or a receive
    bounds          each rank's block (all_gather, reduce_scatter, gather, scatter; the blocks
                    sent to each rank for all_to_all); None: even blocks (`bounds_of`)
    recv_bounds     all_to_all: where the block received from each rank goes; None: even
    agree_counts    all_to_all: every pair of ranks first confirms how many elements it
                    exchanges (all_to_all_v with recv_counts given, which no exchange of counts
                    checked). Rooted collectives always confirm their signature so (AGREEING)
    result          what the call returns once the Op has run
    after           a check on this rank's result, run as part of the call (a failure breaks the
                    job as a failure of the exchange does); synchronous calls only
    gate            kind "gate": the fence gate's host half for one gate (fastcoll.gate.host.serve.Serve):
                    wait for the GPU's arrival, all_gather its bytes into `dst` (the receive
                    mailbox) with `algorithm`, release the GPU
    """

    kind: str
    algorithm: str = "direct"
    src: np.ndarray | None = None
    dst: np.ndarray | None = None
    dtype: str = ""
    reduce: str = ""
    root: int = 0
    bounds: Bounds | None = None
    recv_bounds: Bounds | None = None
    agree_counts: bool = False
    result: Any = None
    after: Callable[[], None] | None = None
    gate: Any = None


def bounds_of(op: Op, size: int) -> tuple[Bounds | None, Bounds | None]:
    """op's (bounds, recv_bounds), with even blocks (fastcoll.algorithms.blocks) where they are
    None: of the result for all_gather, of the contribution for reduce_scatter and all_to_all,
    of size blocks of one rank's part for gather and scatter. The native engine computes the
    same blocks for None (fastcoll/engine/csrc/binding/py_args.c)."""
    bounds, recv = op.bounds, op.recv_bounds
    if bounds is None:
        kind = op.kind
        if kind == "all_gather":
            bounds = blocks(op.dst.size, size)
        elif kind in ("reduce_scatter", "all_to_all"):
            bounds = blocks(op.src.size, size)
        elif kind == "gather":
            bounds = blocks(size * op.src.size, size)
        elif kind == "scatter":
            bounds = blocks(size * op.dst.size, size)
    if recv is None and op.kind == "all_to_all":
        recv = blocks(op.src.size, size)
    return bounds, recv
