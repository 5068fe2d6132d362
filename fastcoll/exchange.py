"""The uneven collectives and point to point: all_gather_v and all_to_all_v (every rank's own
number of rows; all_to_all_v for mixture-of-experts routing), and send, recv, isend, irecv.

An uneven collective first agrees on the sizes: passing them (`sizes=`, `recv_counts=`) saves that
exchange and makes the whole call asynchronous with `async_op=True`; without them the sizes are
exchanged first, synchronously (one small int64 collective), and only the data moves under the
returned Work. A size a peer reports is checked against MAX_UNEVEN_BYTES before anything is
allocated, and sizes that ranks disagree on show as a MismatchError (each message's byte count is
checked against what the receiver expects), never as wrong data.

Point to point (docs/design.md, Point to point): a rank's sends, receives and collectives run one
at a time in its call order; the n-th send from a to b meets b's n-th receive from a.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Sequence

import numpy as np

from fastcoll import arrays, dtypes
from fastcoll.algorithms import blocks
from fastcoll.collectives import begin, check_rank
from fastcoll.engine.ops import Op
from fastcoll.errors import MismatchError
from fastcoll.group import Group
from fastcoll.service import Done
from fastcoll.wire import signature


# The most an uneven collective may receive on one rank, in bytes.
MAX_UNEVEN_BYTES = 1 << 36  # 64 GiB


def row_items(shape: tuple[int, ...]) -> int:
    """The items of one row of an array of `shape` (its first axis cut off)."""
    return math.prod(shape[1:])


def cut(counts: Sequence[int], row: int) -> list[tuple[int, int]]:
    """Element bounds of consecutive blocks of counts[i] rows of `row` items each."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c * row))
        start += c * row
    return out


def checked_counts(values: Any, n: int, what: str) -> list[int]:
    """`values` (a sequence of ints, or a 1-d integer array) as n non-negative ints; TypeError
    or ValueError naming `what` otherwise."""
    if hasattr(values, "dtype") and hasattr(values, "shape"):  # an mx.array or numpy array
        a = np.asarray(values)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{what} must be a 1-d integer array or a sequence of ints, not {a.dtype} {a.shape}")
        values = a.tolist()
    try:
        out = [int(c) for c in values]
        ok = all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in values)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of {n} ints, not {type(values).__name__}") from None
    if not ok:
        raise TypeError(f"{what} must hold ints, got {list(values)!r}")
    if len(out) != n:
        raise ValueError(f"{what} has {len(out)} entries; the group has {n} ranks")
    if any(c < 0 for c in out):
        raise ValueError(f"{what} {out} has a negative entry")
    return out


def check_bound(name: str, rows: int, row: int, itemsize: int) -> None:
    """MismatchError if receiving `rows` rows would pass MAX_UNEVEN_BYTES on this rank."""
    if rows * row * itemsize > MAX_UNEVEN_BYTES:
        raise MismatchError(
            f"{name}: the sizes the ranks reported add up to {rows * row * itemsize} bytes on "
            f"this rank, over fastcoll.exchange.MAX_UNEVEN_BYTES ({MAX_UNEVEN_BYTES})")


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
    g = begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_gather_v needs an array with a first axis, not a scalar")
    known = None if sizes is None else checked_counts(sizes, n, "sizes")
    if known is not None and known[g.rank()] != h.shape[0]:
        raise ValueError(f"sizes[{g.rank()}] = {known[g.rank()]} but x has {h.shape[0]} rows on this rank")
    row = row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        y = (x, [h.shape[0]])
        return Done(y) if async_op else y
    sig = signature("all_gather_v", h.name, rest)
    if known is None:
        known = [int(v) for v in g.gather_ints("all_gather_v.sizes", [h.shape[0]], timeout)[:, 0]]
        if min(known) < 0:
            raise MismatchError(f"all_gather_v: a rank reported a negative size: {known}")
    else:  # sizes the ranks were given: part of what every message is checked against
        sig = signature("all_gather_v", h.name, rest, _sizes_tag(known))
    check_bound("all_gather_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx, g.empty)
    bounds = cut(known, row)
    a, b = bounds[g.rank()]
    buf[a:b] = h.flat
    step = Op("all_gather", g.choose("all_gather", buf.nbytes), dst=buf, bounds=bounds, result=(out, list(known)))
    return g.run(sig, step, timeout, async_op)


# A list of sizes longer than this goes into a signature as a digest (a header holds 4096 bytes).
_SIZES_TAG_MAX = 256


def _sizes_tag(sizes: list[int]) -> str:
    """`sizes=[2, 3]` as a signature carries it: the list, or for a long one its digest."""
    text = repr(sizes)
    if len(text) > _SIZES_TAG_MAX:
        text = "#" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"sizes={text}"


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
    g = begin(group, timeout)
    n = g.size()
    h = arrays.to_host(x)
    if len(h.shape) == 0:
        raise ValueError("all_to_all_v needs an array with a first axis, not a scalar")
    send = checked_counts(counts, n, "counts")
    if sum(send) != h.shape[0]:
        raise ValueError(f"counts {send} add up to {sum(send)} rows; x has {h.shape[0]}")
    known = None if recv_counts is None else checked_counts(recv_counts, n, "recv_counts")
    row = row_items(h.shape)
    rest = tuple(h.shape[1:])
    if n == 1:
        return Done((x, send)) if async_op else (x, send)
    given = known is not None  # the senders' counts never checked: each pair confirms its own first
    if known is None:
        known = _exchange_counts(g, send, timeout)
    check_bound("all_to_all_v", sum(known), row, dtypes.host_dtype(h.name).itemsize)
    out, buf = arrays.output(h.name, (sum(known),) + rest, h.mlx, g.empty)
    step = Op("all_to_all", g.choose("all_to_all", h.flat.nbytes), h.flat, buf, bounds=cut(send, row),
              recv_bounds=cut(known, row), agree_counts=given, result=(out, list(known)))
    return g.run(signature("all_to_all_v", h.name, rest), step, timeout, async_op)


def _exchange_counts(g: Group, send: list[int], timeout: float | None) -> list[int]:
    """counts[j] to rank j; what every rank sends this one (a small int64 all_to_all)."""
    n = g.size()
    src = np.array(send, dtype=np.int64)
    got = np.empty(n, dtype=np.int64)
    bounds = blocks(n, n)

    def check() -> None:
        if (got < 0).any():
            raise MismatchError(f"all_to_all_v: a rank reported a negative count: {got.tolist()}")

    step = Op("all_to_all", g.choose("all_to_all", src.nbytes), src, got, bounds=bounds, recv_bounds=bounds,
              after=check)
    g.run("all_to_all_v.counts(int64)", step, timeout)
    return [int(c) for c in got]


def send(x: Any, dst: int, group: Group | None = None, timeout: float | None = None, async_op: bool = False) -> Any:
    """Send `x` to rank `dst`, which must call recv() with the same shape and dtype.

    With async_op (or isend) it returns a Work at once; keep `x` unchanged until its wait().
    A send completes once its bytes have left this rank."""
    g = begin(group, timeout)
    check_rank(dst, g, "dst", self_ok=False)
    h = arrays.to_host(x)
    step = Op("send", g.choose("send", h.flat.nbytes), src=h.flat, root=dst)
    return g.run(signature("send", g.rank(), dst, h.name, h.shape), step, timeout, async_op, p2p=("send", dst))


def recv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None,
         async_op: bool = False) -> Any:
    """Receive an array of `shape` and `dtype` sent by rank `src` with send().

    An MLX dtype (mx.float32) gives an mx.array; a numpy dtype gives a numpy.ndarray. With
    async_op (or irecv), a Work whose wait() returns it.
    """
    g = begin(group, timeout)
    check_rank(src, g, "src", self_ok=False)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"recv shape {shape} has a negative dimension")
    name, mlx = _dtype_name(dtype)
    out, buf = arrays.output(name, shape, mlx, g.empty)
    step = Op("recv", g.choose("recv", buf.nbytes), dst=buf, root=src, result=out)
    return g.run(signature("send", src, g.rank(), name, shape), step, timeout, async_op, p2p=("recv", src))


def isend(x: Any, dst: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """send(x, dst, async_op=True): a Work; keep `x` unchanged until its wait() returns."""
    return send(x, dst, group, timeout, async_op=True)


def irecv(shape: Any, dtype: Any, src: int, group: Group | None = None, timeout: float | None = None) -> Any:
    """recv(shape, dtype, src, async_op=True): a Work whose wait() returns the array."""
    return recv(shape, dtype, src, group, timeout, async_op=True)


def _dtype_name(dtype: Any) -> tuple[str, bool]:
    """(dtype's name, whether it is an MLX dtype); TypeError naming recv otherwise."""
    if arrays.mx is not None and isinstance(dtype, arrays.mx.Dtype):
        return arrays.name_of_mlx(dtype), True
    try:
        return arrays.name_of_numpy(np.dtype(dtype)), False
    except TypeError as e:
        raise TypeError(f"recv dtype {dtype!r}: {e}") from None
