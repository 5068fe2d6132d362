"""all_to_all, the rooted collectives (gather, scatter, reduce), the uneven forms (all_to_all_v,
all_gather_v), monitored_barrier and new_group.

As in `collectives.py`: every check that can fail on bad input runs in the caller's thread
before any byte is sent, so a bad call raises TypeError/ValueError and leaves the group usable;
the algorithm comes from `fastcoll.algorithms.select`.

The uneven forms first agree on the sizes. Passing them (`recv_counts=`, `sizes=`) saves that
exchange and makes the whole call asynchronous with `async_op=True`; without them the sizes are
exchanged first, synchronously (one small int64 collective), and only the data moves under the
returned Work. Sizes that ranks disagree on show as a MismatchError (each message's byte count
is checked against what the receiver expects), never as wrong data.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from fastcoll import arrays, dtypes, lifecycle
from fastcoll.algorithms import Call, blocks, select
from fastcoll.collectives import _begin, _check_rank, _sig
from fastcoll.engine.ops import Op
from fastcoll.errors import CollectiveTimeoutError, MismatchError
from fastcoll.group import Group, done

# The most an uneven collective may receive on one rank, in bytes: sizes that peers report are
# checked against it before anything is allocated.
MAX_UNEVEN_BYTES = 1 << 36  # 64 GiB


def _row_items(shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:])


def _cut(counts: Sequence[int], row: int) -> list[tuple[int, int]]:
    """Element bounds of consecutive blocks of counts[i] rows of `row` items each."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c * row))
        start += c * row
    return out


def _counts(values: Any, n: int, what: str) -> list[int]:
    if hasattr(values, "dtype") and hasattr(values, "shape"):  # an mx.array or numpy array
        a = np.asarray(values)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{what} must be a 1-d integer array or a sequence of ints, not {a.dtype} {a.shape}")
        values = a.tolist()
    try:
        counts = [int(c) for c in values]
        ok = all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in values)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of {n} ints, not {type(values).__name__}") from None
    if not ok:
        raise TypeError(f"{what} must hold ints, got {list(values)!r}")
    if len(counts) != n:
        raise ValueError(f"{what} has {len(counts)} entries; the group has {n} ranks")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what} {counts} has a negative entry")
    return counts


def _check_bound(name: str, rows: int, row: int, itemsize: int) -> None:
    if rows * row * itemsize > MAX_UNEVEN_BYTES:
        raise MismatchError(
            f"{name}: the sizes the ranks reported add up to {rows * row * itemsize} bytes on "
            f"this rank, over fastcoll.exchange.MAX_UNEVEN_BYTES ({MAX_UNEVEN_BYTES})")


def all_to_all(x: Any, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Block j of `x` (axis 0 cut into size equal blocks) goes to rank j; rank r gets block r of
    every rank, concatenated in rank order.

    x.shape[0] must be divisible by the group size; the result has x's shape and dtype, the same
    on every rank. Every dtype moves (bool too).
    """
    g = _begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"all_to_all needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return done(x, async_op)
    out, buf = arrays.output(h.name, h.shape, h.mlx)
    step = Op("all_to_all", select.algorithm("all_to_all", h.flat.nbytes, n, g.config), h.flat, buf, result=out)
    return g._run(_sig("all_to_all", h.name, h.shape), step, timeout, async_op)


def all_to_all_v(
    x: Any,
    counts: Sequence[int],
    recv_counts: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """The uneven all_to_all (MPI_Alltoallv; torch's all_to_all_single with split sizes), as
    mixture-of-experts token routing needs it.

    Args:
        x: shape (sum(counts), *rest); rows counts[0] go to rank 0, the next counts[1] to rank 1...
            `rest` and the dtype must be the same on every rank.
        counts: rows for each destination rank (len == group size).
        recv_counts: rows this rank receives from each rank, if known (it must equal what each
            sender's `counts` says); None: the call exchanges the counts first (synchronously).
    Returns:
        (y, recv_counts): y of shape (sum(recv_counts), *rest), the blocks from rank 0, 1, ...
        in rank order; recv_counts a list of ints. With async_op, a Work whose wait() returns it.
    """
    g = _begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_to_all_v needs an array with a first axis, not a scalar")
    send = _counts(counts, n, "counts")
    if sum(send) != h.shape[0]:
        raise ValueError(f"counts {send} add up to {sum(send)} rows; x has {h.shape[0]}")
    known = None if recv_counts is None else _counts(recv_counts, n, "recv_counts")
    row = _row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        return done((x, send), async_op)
    if known is None:
        known = _exchange_counts(g, send, timeout)
    _check_bound("all_to_all_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx)
    step = Op("all_to_all", select.algorithm("all_to_all", h.flat.nbytes, n, g.config), h.flat, buf,
              bounds=_cut(send, row), recv_bounds=_cut(known, row), result=(out, list(known)))
    return g._run(_sig("all_to_all_v", h.name, rest), step, timeout, async_op)


def _exchange_counts(g: Group, send: list[int], timeout: float | None) -> list[int]:
    """counts[j] to rank j; what every rank sends this one (a small int64 all_to_all)."""
    n = g.size()
    src = np.array(send, dtype=np.int64)
    got = np.empty(n, dtype=np.int64)
    bounds = blocks(n, n)

    def check() -> None:
        if (got < 0).any():
            raise MismatchError(f"all_to_all_v: a rank reported a negative count: {got.tolist()}")

    g._run("all_to_all_v.counts(int64)", Op("all_to_all", "direct", src, got, bounds=bounds, recv_bounds=bounds,
                                            after=check), timeout)
    return [int(c) for c in got]


def all_gather_v(
    x: Any,
    sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """all_gather of arrays whose first axis differs across ranks (MPI_Allgatherv).

    Args:
        x: shape (k_r, *rest) on rank r; `rest` and the dtype must be the same on every rank.
        sizes: every rank's k_r, if known (it must match); None: exchanged first (synchronously).
    Returns:
        (y, sizes): y of shape (sum(sizes), *rest), every rank's x in rank order, the same on
        every rank; sizes a list of ints. With async_op, a Work whose wait() returns it.
    """
    g = _begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_gather_v needs an array with a first axis, not a scalar")
    known = None if sizes is None else _counts(sizes, n, "sizes")
    if known is not None and known[g.rank()] != h.shape[0]:
        raise ValueError(f"sizes[{g.rank()}] = {known[g.rank()]} but x has {h.shape[0]} rows on this rank")
    row = _row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        return done((x, [h.shape[0]]), async_op)
    if known is None:
        table = g._gather_ints("all_gather_v.sizes", [h.shape[0]], timeout)
        known = [int(v) for v in table[:, 0]]
        if min(known) < 0:
            raise MismatchError(f"all_gather_v: a rank reported a negative size: {known}")
    _check_bound("all_gather_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx)
    bounds = _cut(known, row)
    a, b = bounds[g.rank()]
    buf[a:b] = h.flat
    step = Op("all_gather", select.algorithm("all_gather", buf.nbytes, n, g.config), dst=buf, bounds=bounds,
              result=(out, list(known)))
    return g._run(_sig("all_gather_v", h.name, rest), step, timeout, async_op)


def gather(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Concatenate every rank's `x` along axis 0 on `root` only (x: the same shape and dtype on
    every rank).

    Returns on root an array of shape (size * x.shape[0], *x.shape[1:]) ((size,) for a scalar),
    rank order; None on the other ranks.
    """
    g = _begin(group, timeout)
    _check_rank(root, g, "root")
    n = g.size()
    h = arrays.to_host(x)
    if n == 1:
        return done(x.reshape(1) if len(h.shape) == 0 else x, async_op)
    shape = (n,) if len(h.shape) == 0 else (n * h.shape[0],) + tuple(h.shape[1:])
    out, buf = arrays.output(h.name, shape, h.mlx) if g.rank() == root else (None, None)
    step = Op("gather", select.algorithm("gather", n * h.flat.nbytes, n, g.config), h.flat, buf, root=root,
              result=out)
    return g._run(_sig("gather", root, h.name, h.shape), step, timeout, async_op)


def scatter(x: Any, root: int = 0, group: Group | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Root's `x` split along axis 0 into size blocks; rank r gets block r.

    x.shape[0] must be divisible by the group size. On the other ranks `x` gives only the shape
    and dtype, which must be root's (its values are not read), as for broadcast. Returns an array
    of shape (x.shape[0] // size, *x.shape[1:]) on every rank.
    """
    g = _begin(group, timeout)
    _check_rank(root, g, "root")
    n = g.size()
    h = arrays.to_host(x) if g.rank() == root else _shape_only(x)
    if len(h.shape) == 0 or h.shape[0] % n:
        raise ValueError(f"scatter needs x.shape[0] divisible by the group size {n}; x has shape {h.shape}")
    if n == 1:
        return done(x, async_op)
    shape = (h.shape[0] // n,) + tuple(h.shape[1:])
    out, buf = arrays.output(h.name, shape, h.mlx)
    src = h.flat if g.rank() == root else None
    step = Op("scatter", select.algorithm("scatter", buf.nbytes * n, n, g.config), src, buf, root=root, result=out)
    return g._run(_sig("scatter", root, h.name, h.shape), step, timeout, async_op)


def _shape_only(x: Any) -> arrays.Host:
    """x's dtype name and shape without evaluating or copying it (a non-root scatter)."""
    if isinstance(x, np.ndarray):
        return arrays.Host(dtypes.name_of_numpy(x.dtype), tuple(x.shape), None, False)
    if arrays.is_mlx(x):
        return arrays.Host(arrays.mx_name(x.dtype), tuple(x.shape), None, True)
    raise TypeError(f"expected an mx.array or a numpy.ndarray, got {type(x).__name__}")


def reduce(x: Any, root: int = 0, op: str = "sum", group: Group | None = None, async_op: bool = False,
           timeout: float | None = None) -> Any:
    """Reduce `x` element-wise over all ranks onto `root` (op: sum, prod, min, max, mean).

    Returns on root an array of x's shape and dtype; None on the other ranks.
    """
    g = _begin(group, timeout)
    _check_rank(root, g, "root")
    h = arrays.to_host(x)
    dtypes.check_reduction(h.name, op)
    n = g.size()
    if n == 1:
        return done(x, async_op)
    out, buf = arrays.output(h.name, h.shape, h.mlx) if g.rank() == root else (None, None)
    step = Op("reduce", select.algorithm("reduce", h.flat.nbytes, n, g.config), h.flat, buf, h.name, op,
              root=root, result=out)
    return g._run(_sig("reduce", op, root, h.name, h.shape), step, timeout, async_op)


# How long a monitored barrier that has timed out on one peer still listens to the others: their
# notices arrived before the deadline, so they are read at once; this only bounds the wait.
_MONITOR_GRACE = 0.1


def monitored_barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """A barrier that, when ranks do not arrive within `timeout` seconds (default
    FASTCOLL_TIMEOUT), raises CollectiveTimeoutError naming them, on every rank that arrived.

    Every rank tells every other that it arrived, then waits for each; one that has not arrived
    by the deadline is listed. The first rank to time out tells the others (ABORT), so each
    raises within about the same time, naming the same ranks. As after any timeout, the group
    is then broken.
    """
    g = _begin(group, timeout)
    if g.size() == 1:
        return
    members = g.members()
    sub = members != list(range(len(members))) or g._prefix

    def body(call: Call) -> None:
        peers = [p for p in range(call.size) if p != call.rank]
        for p in peers:
            call.send(p, 0, None)
        missing = []
        for p in peers:
            try:
                call.recv(p, 0, None)
            except CollectiveTimeoutError as e:
                if getattr(e, "from_peer", False):
                    raise
                missing.append(p)
                call.deadline = min(call.deadline, time.monotonic() + _MONITOR_GRACE)
        call.flush()
        if missing:
            arrived = [p for p in range(call.size) if p not in missing]
            names = f"rank(s) {missing}" + (f" (job ranks {[members[p] for p in missing]})" if sub else "")
            raise CollectiveTimeoutError(
                f"monitored_barrier: {names} did not arrive; ranks {arrived} did")

    g._run("monitored_barrier()", body, timeout)


def new_group(ranks: Sequence[int], group: Group | None = None, timeout: float | None = None) -> Group:
    """A sub-group of the given ranks of `group` (default: the job's), as
    torch.distributed.new_group: every rank of `group` calls it with the same `ranks`.

    Members get the sub-group, ranked in sorted order; the others get a group of which they are
    not a member, every use of which raises ValueError. It shares the parent's connections, as
    `Group.split` does (docs/design.md, Sub-groups).
    """
    return lifecycle.resolve(group).new_group(ranks, timeout=timeout)

