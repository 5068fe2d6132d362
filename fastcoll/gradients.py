"""Average a tree of gradients over the ranks, small arrays fused into buckets (tensor fusion).

Data-parallel training reduces many small arrays (biases, norms) and a few large ones every
step. One collective per small array pays the per-collective latency many times over, so, as
Horovod's tensor fusion does, small arrays of one dtype are packed into a flat bucket and the
bucket is reduced by one collective; arrays at least `bucket_bytes` large go alone. The buckets'
collectives are issued asynchronously in tree order, so packing the next bucket overlaps the
exchange of the previous one.

Packing: the leaves are evaluated once, together; a bucket is packed on the host from their
zero-copy numpy views, reduced as one numpy buffer, and each result is copied back into an
array of the leaf's kind (bfloat16, which numpy lacks, is packed with mx.concatenate instead).

Exactness: the result for every array is the one `fastcoll.all_reduce(x, op="mean")` gives for
that array alone, bit for bit, at the default bucket size. A reduction is element-wise and, on
fastcoll's small-message paths (direct, recursive doubling), combines the ranks in one fixed
order whatever the buffer around an element holds; the default `bucket_bytes` is their bound
(`Config.direct_max_bytes`), so a bucket and each small array in it both take it.
With a larger `bucket_bytes` a bucket may take the ring path, whose order of ranks differs from
block to block: on two ranks that changes nothing (a + b == b + a exactly), on three or more a
float element may then differ in the last place from averaging its array alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastcoll import arrays, collectives, dtypes, lifecycle
from fastcoll.config import DEFAULT_DIRECT_MAX_BYTES

DEFAULT_BUCKET_BYTES = DEFAULT_DIRECT_MAX_BYTES
_AVERAGEABLE = ("float16", "bfloat16", "float32", "float64", "complex64")


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or arrays.is_mlx(x)


def _leaves(tree: Any, out: list) -> None:
    if isinstance(tree, dict):
        for v in tree.values():
            _leaves(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _leaves(v, out)
    elif _is_array(tree):
        out.append(tree)


def _rebuild(tree: Any, it) -> Any:
    if isinstance(tree, dict):
        items = [(k, _rebuild(v, it)) for k, v in tree.items()]
        try:
            return type(tree)(items)
        except TypeError:
            return dict(items)
    if isinstance(tree, (list, tuple)):
        items = [_rebuild(v, it) for v in tree]
        if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
            return type(tree)(*items)
        try:
            return type(tree)(items)
        except TypeError:
            return list(items)
    if _is_array(tree):
        return next(it)
    return tree


def average_gradients(grads: Any, group: Any = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Any:
    """Average every array of `grads` over the ranks of `group`; the tree keeps its structure.

    Args:
        grads: a tree of mx.array / numpy.ndarray leaves in dicts, lists and tuples (what
            `mlx.utils.tree_flatten` walks, e.g. `nn.value_and_grad`'s gradients), the same
            structure, shapes and dtypes on every rank. Other leaves (None, numbers) pass
            through untouched.
        group: a fastcoll Group, an mlx_compat Group, or None for the default group.
        bucket_bytes: arrays smaller than this are packed into flat buckets of at most this
            many bytes per dtype, one collective per bucket; larger ones are reduced alone.
            0 or less turns fusion off. The default keeps results bit-identical to averaging
            each array alone at any world size (see the module docstring).
    Returns:
        The same tree with each array replaced by its mean over the ranks (same shape, dtype and
        array type). On a group of one, `grads` itself.
    """
    g = lifecycle.resolve(group)
    if g.size() == 1:
        return grads
    leaves: list = []
    _leaves(grads, leaves)
    if not leaves:
        return grads
    names = [arrays.name_of(x) for x in leaves]
    for x, name in zip(leaves, names):
        if name not in _AVERAGEABLE:
            raise TypeError(f"average_gradients needs floating or complex arrays; got a {name} array of shape {tuple(x.shape)}")
    mlx_leaves = [x for x in leaves if arrays.is_mlx(x)]
    if mlx_leaves:
        arrays.mx.eval(*mlx_leaves)  # one evaluation for the whole tree, not one per array
    pending = []
    for alone, members in _units(leaves, names, bucket_bytes):
        flat = None if alone else _pack([leaves[i] for i in members], names[members[0]])
        x = leaves[members[0]] if alone else flat
        pending.append((members, flat, collectives.all_reduce(x, op="mean", group=g, async_op=True)))
    results: list[Any] = [None] * len(leaves)
    for members, flat, work in pending:
        out = work.wait()
        if flat is None:
            results[members[0]] = out
        else:
            _unpack(out, [leaves[i] for i in members], members, results)
    return _rebuild(grads, iter(results))


def _units(leaves: list, names: list[str], bucket_bytes: int) -> list[tuple[bool, list[int]]]:
    """The collectives to issue, in tree order (the same on every rank): (True, [i]) for a leaf
    reduced alone, (False, members) for a bucket of leaves of one dtype (mx.array and numpy
    leaves share one)."""
    units: list[tuple[bool, list[int]]] = []
    open_buckets: dict[str, tuple[list[int], int]] = {}
    for i, x in enumerate(leaves):
        nbytes = x.nbytes
        if bucket_bytes <= 0 or nbytes >= bucket_bytes:
            units.append((True, [i]))
            continue
        members, size = open_buckets.get(names[i], ([], 0))
        if members and size + nbytes > bucket_bytes:
            units.append((False, members))
            members, size = [], 0
        open_buckets[names[i]] = (members + [i], size + nbytes)
    units.extend((False, members) for members, _ in open_buckets.values() if members)
    return units


def _pack(parts: list, name: str) -> Any:
    """The evaluated `parts` (of dtype `name`) end to end in one flat array."""
    if name == "bfloat16":  # numpy has no bfloat16 (and only mx.arrays hold it): pack with MLX
        flats = [x.reshape(-1) for x in parts]
        return arrays.mx.concatenate(flats) if len(flats) > 1 else flats[0]
    # On the host: the leaves are evaluated, so their numpy views cost nothing.
    flat = np.empty(sum(x.size for x in parts), dtype=dtypes.host_dtype(name))
    start = 0
    for x in parts:
        view = np.array(x, copy=False) if arrays.is_mlx(x) else x
        flat[start : start + x.size] = view.reshape(-1)
        start += x.size
    return flat


def _unpack(out: Any, parts: list, members: list[int], results: list) -> None:
    """Each leaf's piece of a reduced bucket `out` into results[i], shaped and typed as its leaf."""
    host_out = isinstance(out, np.ndarray)
    start = 0
    for i, x in zip(members, parts):
        piece = out[start : start + x.size].reshape(x.shape)
        if host_out and arrays.is_mlx(x):
            piece = arrays.mx.array(piece, dtype=x.dtype)  # a copy, in the leaf's dtype
        results[i] = piece
        start += x.size
