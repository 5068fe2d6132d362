"""Test-only hooks: named points where the fault tests inject a delay, a death or an interrupt.

Nothing in fastcoll sets a hook. The test programs (tests/progs/) call `set_hook(fn)` so that
the timing windows of a job's set-up and of a collective are reached every time, not by luck
(tests/test_hardening.py). With no hook set, a point costs one global lookup. The points:

    rendezvous-done     every rank, once the rendezvous table has arrived
    tcp-mesh-done       TCP: every connection of the mesh is up, before shared memory
    zmq-handshake       ZeroMQ: the DEALERs are connected, before their handshake
    setup-done          the transport is set up, just before init() returns it
    zmq-frame           ZeroMQ: a received payload is about to be released
    abort               a call failed on this rank: its abort notice is about to go out
"""

from __future__ import annotations

from typing import Callable

_hook: Callable[[str], None] | None = None


def set_hook(fn: Callable[[str], None] | None) -> None:
    """For tests only: call fn(point) at each named point (None removes it)."""
    global _hook
    _hook = fn


def point(name: str) -> None:
    """A named point (see the module's docstring): calls the test hook, if one is set."""
    if _hook is not None:
        _hook(name)
