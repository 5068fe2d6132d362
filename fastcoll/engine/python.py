"""The pure-Python engine: one schedule per collective (fastcoll/algorithms/reference.py) over a
Python transport, with a service thread for what is queued. It is the reference the native engine
is tested against, and the fallback where the extension is not built (FASTCOLL_NATIVE=0, no
compiler) or the transport is one the native engine does not own (ZeroMQ).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np

from fastcoll import dtypes
from fastcoll.algorithms import Call, reference, select
from fastcoll.engine.base import LET_GO_SECONDS, Engine, Task, finalized_mid_call
from fastcoll.engine.ops import AGREEING, Op, bounds_of
from fastcoll.errors import FastcollError
from fastcoll.service import Service, Work
from fastcoll.transport.base import Transport

log = logging.getLogger("fastcoll")


class PythonEngine(Engine):
    """Runs each Task's Op through its algorithm module, on the caller's thread when the service
    is idle (fastcoll/service.py says why), else on the service thread in call order."""

    name = "python"

    def __init__(self, transport: Transport):
        self.transport = transport
        self._service = Service()
        self._gate: Any = None

    def enqueue(self, task: Task, async_op: bool) -> Work | None:
        if not async_op and self._service.claim_if_idle():
            return None
        return self._service.submit(functools.partial(self.run, task))

    def run_inline(self, task: Task) -> Any:
        try:
            return self.run(task)
        finally:
            self._service.release()

    def run(self, task: Task) -> Any:
        """Run `task` on this thread (which holds the run lock)."""
        return run_task(self.transport, task)

    def attach_gate(self, gate: Any) -> None:
        self._gate = gate  # its host half runs on the service thread, as a queued call

    def end_at_exit(self) -> None:
        if self._gate is not None:  # a gate whose result nobody evaluated is never served
            self._gate.stop_serving()
        self.transport.interrupt("the interpreter is exiting")  # a call under way ends within 0.2 s
        if self._service.stop_running(timeout=1.0):
            self.transport.end_at_exit()
        else:
            log.warning("a collective was still running at exit: its transport was left as it was")

    def close(self, timeout: float) -> None:
        self.finalizing = True
        why = finalized_mid_call(self.transport.rank)
        if self._service.end_inline(FastcollError(why), functools.partial(self.transport.interrupt, why),
                                    LET_GO_SECONDS):
            if self.transport.interrupted == why:
                self.transport.interrupted = None  # the ended call is out: the goodbye must not stop
        else:
            log.warning("a collective of another thread did not end within %.0f s of finalize(); closing "
                        "its connections under it", LET_GO_SECONDS)
        self._service.close(timeout=timeout)
        self.transport.close()


def run_task(transport: Transport, task: Task) -> Any:
    """Run `task` on this thread through its Python schedule over `transport`'s messages; its
    result, or raise what Task.fail gives for a failure."""
    err = task.broken()
    if err is not None:
        raise err
    call = Call(transport, task.seq, task.sig, time.monotonic() + task.limit, task.rank, task.size,
                task.ranks, task.piece_bytes, task.tracer)
    try:
        return _traced(call, task) if task.tracer is not None else _body(call, task.body, task.limit)
    except BaseException as e:
        task.fail(e, call.deadline - task.limit)
        raise


def _traced(call: Call, task: Task) -> Any:
    task.tracer.span("queue", task.queued, seq=task.seq)
    with task.tracer.phase(task.sig, seq=task.seq):
        return _body(call, task.body, task.limit)


def _body(call: Call, body: Any, limit: float) -> Any:
    if not isinstance(body, Op):
        return body(call)
    if body.kind == "gate":
        serve_gate(call, body, limit)
        return None
    run_op(call, body)
    if body.after is not None:
        body.after()
    return body.result


def serve_gate(call: Call, op: Op, limit: float) -> None:
    """The fence gate's host half for one gate (op.gate), its bytes gathered by an all_gather
    once the GPU has arrived (fastcoll/gate/host/serve.py)."""

    def exchange(send: np.ndarray, gathered: np.ndarray) -> None:
        # The GPU arrives when the caller evaluates, which may be long after the call was queued:
        # the time limit is for waiting on peers, so it starts now.
        call.deadline = time.monotonic() + limit
        k = send.size
        gathered[call.rank * k : (call.rank + 1) * k] = send
        run_op(call, Op("all_gather", op.algorithm, dst=gathered))

    op.gate(exchange)


def run_op(call: Call, op: Op) -> None:
    """Run `op` as this rank's part of the call, through its collective's one reference schedule.

    The algorithm the Op names (select.py's rule) is the native engine's to follow; this engine
    reads from it, here and nowhere else, only whether the rule calls an all_reduce small
    (select.small): its schedules are the simplest correct ones (fastcoll/algorithms/reference.py),
    and every rank of a job runs the same engine."""
    bounds, recv_bounds = bounds_of(op, call.size)
    if op.kind in AGREEING or op.agree_counts:  # every peer's agreement is read before the call returns
        if op.agree_counts:
            call.agree([b - a for a, b in bounds], [b - a for a, b in recv_bounds])
        else:
            call.agree()
    _dispatch(call, op, bounds, recv_bounds)
    if call.owed is not None:  # (a schedule that ends with flush() has read them all)
        call.agreed()


def _dispatch(call: Call, op: Op, bounds: Any, recv_bounds: Any) -> None:
    """op's schedule: reference.py's function for its kind."""
    kind, ref = op.kind, reference
    if kind in _REDUCING:
        combine = call.traced(dtypes.reducer(op.dtype, op.reduce))
        if kind == "all_reduce":
            ref.all_reduce(call, op.src, op.dst, combine, select.small(op.algorithm))
        elif kind == "reduce_scatter":
            ref.reduce_scatter(call, op.src, op.dst, bounds, combine)
        else:
            ref.reduce(call, op.src, op.dst, op.root, combine)
        if op.reduce == "mean" and op.dst is not None:
            dtypes.finish_mean(op.dtype, op.dst, call.size)
    elif kind == "all_gather":
        ref.all_gather(call, op.dst, bounds)
    elif kind == "broadcast":
        ref.broadcast(call, op.dst, op.root)
    elif kind == "barrier":
        ref.barrier(call)
    elif kind == "all_to_all":
        ref.all_to_all(call, op.src, op.dst, bounds, recv_bounds)
    elif kind == "gather":
        ref.gather(call, op.dst, op.src, bounds, op.root)
    elif kind == "scatter":
        ref.scatter(call, op.src, op.dst, bounds, op.root)
    elif kind == "send":
        ref.send(call, op.src, op.root)
    elif kind == "recv":
        ref.recv(call, op.dst, op.root)
    else:
        raise ValueError(f"no engine step for an Op of kind {kind!r}")


_REDUCING = frozenset(("all_reduce", "reduce_scatter", "reduce"))
