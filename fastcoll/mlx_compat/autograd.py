"""Collectives as MLX graph functions with gradients: `mx.custom_function`s whose vjp (and jvp)
are the ones MLX's own distributed primitives have.

The vjp of all_sum/all_max/all_min passes the cotangent through (as MLX's AllReduce::vjp);
all_gather's slices out this rank's block; sum_scatter's all-gathers the cotangent. Each function
runs the collective eagerly (fastcoll's host path evaluates its input); `eager` turns MLX's error
for evaluation inside mx.compile or mx.vmap into one that says why.
"""

from __future__ import annotations

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


_functions: dict[tuple, Any] = {}


def differentiable(kind: str, g: Group) -> Any:
    """A cached mx.custom_function running collective `kind` on g, with MLX's vjp for it."""
    fn = _functions.get((kind, g))
    if fn is not None:
        return fn
    if kind in ("sum", "max", "min"):

        @mx.custom_function
        def fn(x):
            return host_reduce(x, kind, g)

        @fn.vjp
        def fn(primals, cotangent, output):
            return cotangent  # as MLX's AllReduce::vjp

        if kind == "sum":

            @fn.jvp
            def fn(primals, tangent):
                return differentiable("sum", g)(tangent)

    elif kind == "gather":

        @mx.custom_function
        def fn(x):
            return eager(fastcoll.all_gather, x, group=g)

        @fn.vjp
        def fn(primals, cotangent, output):
            r = g.rank()
            if primals.ndim == 0:
                return cotangent[r]
            n = primals.shape[0]
            return cotangent[r * n : (r + 1) * n]

        @fn.jvp
        def fn(primals, tangent):
            return differentiable("gather", g)(tangent)

    elif kind == "scatter":

        @mx.custom_function
        def fn(x):
            if x.dtype == mx.bool_:
                y = eager(fastcoll.reduce_scatter, x.astype(mx.uint8), op="max", group=g)
                return y.astype(mx.bool_)
            return eager(fastcoll.reduce_scatter, x, op="sum", group=g)

        @fn.vjp
        def fn(primals, cotangent, output):
            return differentiable("gather", g)(cotangent)

        @fn.jvp
        def fn(primals, tangent):
            return differentiable("scatter", g)(tangent)

    else:
        raise ValueError(kind)
    _functions[(kind, g)] = fn
    return fn


