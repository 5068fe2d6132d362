"""Whether MLX is differentiating or vectorizing on this thread: install() wraps MLX's grad,
value_and_grad, vmap, vjp and jvp so that each counts while it runs.

A gated all_sum needs its `mx.custom_function` (fastcoll/mlx_compat/autograd.py) only while one of
these traces it: the custom function is what gives the gate's kernel a vjp (under jvp and vmap
the call keeps it too, as before this rule; MLX then fails on the kernel either way). Outside
them it is two more graph nodes a call (bench/NOTES.md 83), so api.py leaves it out there, and
only while installed: without install() nothing is counted. MLX's other transformations need no
count: mx.compile and mx.export_function cannot replay a host exchange either way, and
mx.checkpoint differentiates only inside a grad. A function transformed before install() is not
counted: a gated call in it then meets MLX's error for a kernel without a vjp, never a wrong
gradient, because only gated calls leave the custom function out.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import mlx.core as mx

RETURNING = ("grad", "value_and_grad", "vmap")  # these return the transformed function
IMMEDIATE = ("vjp", "jvp")  # these trace the function they are given at once


class _Depth(threading.local):
    n = 0  # transformations running on this thread (MLX traces on the caller's thread)


_depth = _Depth()
_swapped: dict[str, tuple[Any, Any]] = {}  # name -> (MLX's own, ours), while installed


def untraced() -> bool:
    """True while installed and no grad, value_and_grad, vmap, vjp or jvp made since runs on
    this thread (neither the function it traces nor its backward pass)."""
    return _depth.n == 0 and bool(_swapped)


def _counted(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        _depth.n += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth.n -= 1

    return call


def _returning(transform: Callable) -> Callable:
    @functools.wraps(transform)
    def transformed(*args: Any, **kwargs: Any) -> Any:
        return _counted(transform(*args, **kwargs))

    return transformed


def install() -> None:
    """Wrap MLX's transformations (the caller holds patch.py's lock)."""
    if _swapped:
        return
    for name in RETURNING + IMMEDIATE:
        theirs = getattr(mx, name)
        ours = (_returning if name in RETURNING else _counted)(theirs)
        _swapped[name] = (theirs, ours)
        setattr(mx, name, ours)


def uninstall() -> None:
    """Put MLX's own transformations back where ours still stand (functions transformed meanwhile
    keep counting)."""
    for name, (theirs, ours) in _swapped.items():
        if getattr(mx, name) is ours:  # not over whoever wrapped ours since
            setattr(mx, name, theirs)
    _swapped.clear()
