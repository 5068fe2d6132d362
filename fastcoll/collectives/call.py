"""What every collective does before its own rule: find the group and check the call.

Every check that can fail on bad input runs in the caller's thread before any byte is sent, so
a bad call raises TypeError/ValueError and leaves the group usable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastcoll import lifecycle
from fastcoll.config import check_timeout
from fastcoll.group import Group


def begin(group: Any, timeout: Any, drain: bool = True) -> Group:
    """The group a call runs on, ready: not broken or finalized, `timeout` valid, and (with
    `drain`) no gated result left to hold the service queue ahead of this call."""
    g = lifecycle.resolve(group)
    g.check()
    if timeout is not None:
        check_timeout(timeout, "timeout")
    if drain and g.gate is not None:
        g.drain_gate()
    return g


def check_rank(r: Any, g: Group, what: str, self_ok: bool = True) -> None:
    """ValueError unless `r` is a rank of g (and, without `self_ok`, not this one)."""
    if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < g.size():
        raise ValueError(f"{what}={r!r} is not a rank of this group (0..{g.size() - 1})")
    if not self_ok and r == g.rank():
        raise ValueError(f"{what}={r} is this rank itself")


