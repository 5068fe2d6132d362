"""The engine interface: the one way from the Python layer to the data plane.

A group hands each call to its job's engine as a `Task` (which collective, its place in the
group's sequence, its time limit and how a failure is reported). The engine decides where the
call runs (on the caller's thread when nothing is queued, else behind the queued calls, in call
order) and moves its bytes. Two engines implement it: `python` (fastcoll/engine/python.py, the
algorithms of fastcoll/algorithms/ over a Python transport: the reference) and `native`
(fastcoll/engine/native.py, a compiled extension whose own thread runs without the GIL).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from fastcoll.engine.ops import Op
from fastcoll.errors import FastcollError
from fastcoll.service import Work
from fastcoll.transport.base import Transport


@dataclass(slots=True)
class Task:
    """One call as its group hands it to the engine.

    `body` is an Op, or a Python schedule `body(call)` over the message interface (the calls
    whose steps need Python between messages: monitored_barrier, traced calls). `broken()` is
    the job's recorded error, if any; `fail(error, started)` breaks the job for an error raised
    while the call ran (started: when its time limit began) and raises what the caller gets."""

    seq: int
    sig: str
    limit: float
    rank: int
    size: int
    ranks: Sequence[int]
    body: Op | Callable[[Any], Any]
    broken: Callable[[], FastcollError | None]
    fail: Callable[[BaseException, float], None]
    piece_bytes: int = 1 << 20
    tracer: Any = None
    queued: int = 0  # when it was submitted, on the tracer's clock


def finalized_mid_call(rank: int) -> str:
    """What a call that finalize() ended under way raises (on another thread than the call's)."""
    return (f"rank {rank}: this group was finalized (fastcoll.finalize() or Group.finalize(), on another "
            "thread) during this call, which ends without a result; no collective runs on the group any more")


# How long finalize() waits for a call it interrupted to let go of the connections (the call sees
# the interrupt at its next wait, within 0.2 s).
LET_GO_SECONDS = 5.0


class Engine(abc.ABC):
    """The data plane of one job on this rank: what both engines implement. What only an engine
    that prepares calls offers (the native one) is its `prepared` (see Prepared), None here."""

    name: str = ""
    # close() has begun: a call it ended fails without an abort notice, since close() says
    # goodbye instead (the peers hear that this rank finalized, not that it failed).
    finalizing: bool = False
    # The message interface (fastcoll/transport/base.py): what Python schedules, the diagnosis
    # of a timeout (notices), an interrupt from another thread and the tests' connections use.
    transport: Transport
    # Prepared calls, gates served natively, graph tables, result memory; None: every call goes
    # through enqueue, numpy allocates results, and nothing runs without Python.
    prepared: "Prepared | None" = None

    @abc.abstractmethod
    def enqueue(self, task: Task, async_op: bool) -> Work | None:
        """Take `task` as this rank's next call (the caller holds the order lock). None: run it
        on this thread now with `run_inline` (nothing was queued or running; the run lock is
        this thread's until then). Otherwise a Work that finishes when the queue has run it."""

    @abc.abstractmethod
    def run_inline(self, task: Task) -> Any:
        """Run a task that `enqueue` gave back to this thread; its result, or raise."""

    @abc.abstractmethod
    def attach_gate(self, gate: Any) -> None:
        """The job's fence gate, once its mode is fixed: an engine may serve its host half, and
        stops it at exit (end_at_exit)."""

    def abort(self, error: FastcollError) -> None:
        """Tell every peer this rank gave up (the peers raise an error of the same class); not
        while closing (see `finalizing`)."""
        if not self.finalizing:
            self.transport.abort(error)

    def describe(self) -> str:
        """What carries the messages and which engine moves them, for Group.transport_info()."""
        return f"{self.transport.describe()}; {self.name} engine"

    def end_at_exit(self) -> None:
        """The interpreter is exiting and the job was not finalized: stop what would run on past
        the Python objects it reads. The native engine's thread reads none, and is left alone: a
        wait it ended now would take the GIL during finalization, which ends the thread inside
        CPython (pthread_exit)."""

    @abc.abstractmethod
    def close(self, timeout: float) -> None:
        """End a call that another thread runs on its own thread (it raises, saying the group was
        finalized), run what is queued (for at most `timeout` seconds), tell the peers, release
        everything; never free what a call still uses."""


class Prepared(Protocol):
    """What an engine that prepares calls offers beyond Engine (the native engine, as its
    `prepared`): callers ask `engine.prepared is not None` once, and take the general way
    (Engine.enqueue) where it is None."""

    def plan(self, task: Task) -> Any:
        """A prepared form of task's call, for calls that repeat it with new buffers of the same
        sizes (`run_planned`; its `sig` is the call's signature); None where this call is not
        one it prepares (then it runs through enqueue)."""

    def claim(self) -> bool:
        """Take the run lock for this thread if nothing is queued or running (for run_planned;
        the caller holds the order lock); `release()` gives it back."""

    def release(self) -> None: ...

    def run_planned(self, plan: Any, seq: int, src: Any, dst: Any) -> None:
        """Run a planned call as this group's call `seq` with these buffers, on this thread,
        which holds the run lock; raises the call's FastcollError (the job is not broken yet)."""

    def submit_gate(self, plan: Any, seq: int, serve: Any, task: Task) -> Work:
        """Queue a gate's host half (`serve`: fastcoll/gate/host/serve.py's Serve) as this group's call
        `seq`, its exchange prepared by `plan(task)` (the caller holds the order lock). `task`
        is the template of such calls (any seq): only a failure needs it."""

    def graph_table(self, prefix: str, ranks: tuple[int, ...], rank: int, limit: float, piece_bytes: int,
                    all_reduce: tuple[int, str, str], all_gather: tuple[int, str, str],
                    labels: tuple[str, ...], tracer: Any = None) -> Any:
        """A capsule of the table that runs one group's collectives from MLX's evaluation thread
        without Python (fastcoll/engine/csrc/binding/fc_graph.h). The group (`prefix`, the job's
        `ranks`, this `rank` in it) must run nothing else: the table numbers its calls.
        all_reduce, all_gather: select.by_size's rule; labels: each member's name in error
        messages; tracer: the job's trace.Tracer, or None: the table notes its calls, which go
        into the trace as it is written."""

    def result_memory(self, nbytes: int) -> Any:
        """Writable memory of `nbytes` for a large numpy result, which this engine takes back
        once no array uses it (so that the next call of that size finds its pages mapped), or
        None where numpy should allocate (the cache is off)."""
