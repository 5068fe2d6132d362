"""Collectives as MLX graph functions with gradients: `mx.custom_function`s whose vjp (and jvp)
are the ones MLX's own distributed primitives have.

The vjp of all_sum/all_max/all_min passes the cotangent through (as MLX's AllReduce::vjp);
all_gather's slices out this rank's block; sum_scatter's all-gathers the cotangent. Each function
runs the collective eagerly (fastcoll's host path evaluates its input); `eager` turns MLX's error
for evaluation inside mx.compile or mx.vmap into one that says why.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

import fastcoll
from fastcoll.group import Group

_TRACING = "function transformations"


def eager(fn, *args, **kwargs):
    """Run a fastcoll collective; explain the error MLX gives for evaluation while tracing."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, ValueError) as e:
        if _TRACING in str(e):
            raise RuntimeError(
                "fastcoll.mlx_compat: collectives run eagerly (they evaluate their input), which "
                "MLX forbids inside mx.compile and mx.vmap; call them outside the compiled or "
                f"vmapped function ({e})"
            ) from e
        raise


# dtypes that fastcoll does not reduce as MLX's backends do (host_reduce's special cases)
_SPECIAL = frozenset((mx.bool_, mx.complex64))


def host_reduce(x: mx.array, op: str, g: Group) -> mx.array:
    dtype = x.dtype
    # One set lookup for the common dtypes: tensor-parallel decode calls this dozens of times a token.
    if dtype in _SPECIAL:
        if dtype == mx.bool_:
            # MLX's backends reduce bools as logical or (sum, max) and and (min).
            y = eager(fastcoll.all_reduce, x.astype(mx.uint8), op="min" if op == "min" else "max", group=g)
            return y.astype(mx.bool_)
        if op in ("max", "min"):  # complex64
            # fastcoll has no order on complex numbers; MLX's mx.maximum orders lexicographically.
            parts = eager(fastcoll.all_gather, mx.expand_dims(x, 0), group=g)
            pick = mx.maximum if op == "max" else mx.minimum
            acc = parts[0]
            for i in range(1, g.size()):
                acc = pick(acc, parts[i])
            return acc
    return eager(fastcoll.all_reduce, x, op, g)


def _scatter(x: mx.array, g: Group) -> mx.array:
    if x.dtype == mx.bool_:  # MLX's backends sum bools as logical or
        return eager(fastcoll.reduce_scatter, x.astype(mx.uint8), op="max", group=g).astype(mx.bool_)
    return eager(fastcoll.reduce_scatter, x, op="sum", group=g)


def _block(primals: mx.array, cotangent: mx.array, g: Group) -> mx.array:
    """This rank's block of an all_gather's cotangent: the all_gather's vjp."""
    r = g.rank()
    if primals.ndim == 0:
        return cotangent[r]
    n = primals.shape[0]
    return cotangent[r * n : (r + 1) * n]


# kind -> (the collective, its vjp), as MLX's primitives have them: AllReduce::vjp passes the
# cotangent through, AllGather's slices out this rank's block, ReduceScatter's all-gathers it.
_RULES = {
    "sum": (lambda x, g: host_reduce(x, "sum", g), lambda primals, cotangent, g: cotangent),
    "max": (lambda x, g: host_reduce(x, "max", g), lambda primals, cotangent, g: cotangent),
    "min": (lambda x, g: host_reduce(x, "min", g), lambda primals, cotangent, g: cotangent),
    "gather": (lambda x, g: eager(fastcoll.all_gather, x, group=g), _block),
    "scatter": (_scatter, lambda primals, cotangent, g: differentiable("gather", g)(cotangent)),
}
_LINEAR = frozenset(("sum", "gather", "scatter"))  # a linear map is its own jvp


@functools.lru_cache(maxsize=None)
def differentiable(kind: str, g: Group) -> Any:
    """An mx.custom_function running collective `kind` on g, with MLX's vjp for it (and, for
    the linear ones, their jvp); one per kind and group."""
    if kind not in _RULES:
        raise ValueError(kind)
    forward, vjp = _RULES[kind]
    fn = mx.custom_function(lambda x: forward(x, g))
    fn = fn.vjp(lambda primals, cotangent, output: vjp(primals, cotangent, g))
    if kind in _LINEAR:
        fn = fn.jvp(lambda primals, tangent: differentiable(kind, g)(tangent))
    return fn
