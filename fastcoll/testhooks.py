"""Test-only hooks: named points where the fault tests inject a delay, a death or an interrupt.

Nothing in fastcoll sets a hook. The test programs (tests/progs/) call `set_hook(fn)` so that
the timing windows of a job's set-up and of a collective are reached every time, not by luck
(tests/test_hardening.py). With no hook set, a point costs one global lookup. The points:

    rendezvous-done     every rank, once the rendezvous table has arrived
    tcp-mesh-done       TCP: every connection of the mesh is up, before shared memory
    shm-offered         shared memory: this rank has offered its segments, before it reads
                        the offers made to it and the answers to its own
    zmq-handshake       ZeroMQ: the DEALERs are connected, before their handshake
    setup-done          the transport is set up, just before init() returns it
    zmq-frame           ZeroMQ: a received payload is about to be released
    abort               a call failed on this rank: its abort notice is about to go out
    gate-failed         a gate's host half failed: its error is about to be recorded (the
                        native engine has stored the gate's error release already, the
                        Python engine stores it after)
    probe:doubling      init() timing doubling against direct sends (doubling_probe.py): one
    probe:direct        timed call of that algorithm has run, its clock not yet read

and one factory: `set_gate_factory(fn)` makes init() take its fence gate from fn(config) (a gate
over a simulated device, for the multi-process tests of the gate's host half) instead of probing
the GPUs. `set_graph_trace_bounds(calls, phases)` makes a traced graph table (FASTCOLL_TRACE in
graph mode) keep at most that many calls and phases, so that a test reaches the bound with a few.
"""

from __future__ import annotations

from typing import Any, Callable

_hook: Callable[[str], None] | None = None
_gate_factory: Callable[[Any], Any] | None = None
_graph_trace_bounds: dict[str, int] | None = None


def set_hook(fn: Callable[[str], None] | None) -> None:
    """For tests only: call fn(point) at each named point (None removes it)."""
    global _hook
    _hook = fn


def point(name: str) -> None:
    """A named point (see the module's docstring): calls the test hook, if one is set."""
    if _hook is not None:
        _hook(name)


def set_gate_factory(fn: Callable[[Any], Any] | None) -> None:
    """For tests only: init() gets its fence gate from fn(config) (None: probe the GPUs again)."""
    global _gate_factory
    _gate_factory = fn


def gate_factory() -> Callable[[Any], Any] | None:
    """The factory a test set, if any."""
    return _gate_factory


def set_graph_trace_bounds(calls: int, phases: int) -> None:
    """For tests only: a traced graph table opened after this keeps at most `calls` calls and
    `phases` phases (graph_open's trace_calls and trace_phases)."""
    global _graph_trace_bounds
    _graph_trace_bounds = {"trace_calls": calls, "trace_phases": phases}


def graph_trace_bounds() -> dict[str, int] | None:
    """The bounds a test set, if any."""
    return _graph_trace_bounds
