"""The native engine: the data plane in C (fastcoll/engine/csrc/), with a thread of its own that
runs without the GIL.

After Python's rendezvous and authenticated handshake it takes the connections over (the TCP
sockets and the shared-memory rings) and runs each collective's schedule itself: on the caller's
thread when nothing is queued (the GIL released for the whole call), otherwise on its service
thread, which takes the GIL only to report a failure or to run a Python function queued behind
native calls. It sends what the pure-Python engine sends, frame for frame, and reports each
failure as the error the pure-Python transport raises (`error_from`).

Calls whose steps need Python between messages (monitored_barrier, a check after the exchange)
run their Python schedule over `NativeTransport`, the message interface the pure-Python engine's
schedules use, whose waits are native too; every rank runs such a call so. A traced call
(FASTCOLL_TRACE, which each rank sets for itself) runs natively too, on the caller's thread or
behind the queue, its phases noted by the engine and written as the Python engine's are.

The extension's surface is fastcoll/engine/door.py's, checked as this module is imported: an
`_native.Engine` whose `runner` runs and queues collectives (each an `OpSpec`, made once per call
or plan), whose `links` carry the messages, and whose `gate` serves the fence gate's host half.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import socket
import threading
import time
from select import POLLERR, POLLHUP, POLLIN, poll
from typing import Any

import numpy as np

from fastcoll import dtypes, testhooks, trace, wire
from fastcoll.algorithms import select
from fastcoll.config import AUTO_SPIN_US, for_host
from fastcoll.engine import _native, door
from fastcoll.engine.base import Engine, Task, finalized_mid_call
from fastcoll.engine.ops import KINDS, Op
from fastcoll.engine.python import run_task
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.service import Work
from fastcoll.transport import rdma, tcp
from fastcoll.transport.base import LAST_WORD_SECONDS, Transport, abort_error, other_call, other_chunk
from fastcoll.wire import ABORT, Header

door.check(_native)  # an extension of another surface is an ImportError naming what differs

# The codes of fc_err.h's enum fc_code, by name.
_CODES = ("ok", "timeout_wait", "timeout_payload", "timeout_send", "closed", "closed_mid", "conn", "finalized",
          "malformed", "abort", "mismatch_call", "mismatch_chunk", "interrupted", "signal", "broken", "nomem",
          "internal", "gate_closed", "gate_protocol", "gate_spin", "shut")
CODE = {name: i for i, name in enumerate(_CODES)}

_KIND = {name: i for i, name in enumerate(_native.KINDS)}
_ALGORITHM = {name: i for i, name in enumerate(_native.ALGORITHMS)}
_DTYPE = {name: i for i, name in enumerate(_native.DTYPES)}
_PHASES = tuple(_native.PHASES)  # a traced run's phases, by code (fastcoll/trace.py's PHASES)
_REDUCE = {name: i for i, name in enumerate(_native.OPS)}
# A collective that only moves bytes names an unsigned type of its items' size.
_MOVER = {1: _DTYPE["uint8"], 2: _DTYPE["uint16"], 4: _DTYPE["uint32"], 8: _DTYPE["uint64"]}


def unavailable() -> str | None:
    """None where this build of the extension matches this Python layer, else why not."""
    if tuple(_native.KINDS) != KINDS or set(_native.ALGORITHMS) != set(select.ALGORITHMS):
        return "the extension was built from other sources than this fastcoll (reinstall it)"
    if tuple(_native.DTYPES) != dtypes.names() or tuple(_native.OPS) != dtypes.OPS or _PHASES != trace.PHASES:
        return "the extension was built from other sources than this fastcoll (reinstall it)"
    return None


def error_from(info: tuple, me: int, seq: int = -1, sig: str = "", why: str | None = None) -> FastcollError:
    """The error the pure-Python transport raises for what the native engine reported (`info`:
    fc_err as py_err_info gives it), for call (seq, sig) on rank `me`."""
    code, peer, waiting_for, errno_, n0, n1, n2, n3, text = info
    name = _CODES[code] if 0 <= code < len(_CODES) else "internal"
    said = text.decode("utf-8", "replace")
    if name == "timeout_wait":  # n0: how long since its payload last moved, in us (-1: never)
        return tcp.wait_timeout(me, peer, None if n0 < 0 else n0 / 1e6)
    if name == "timeout_payload":  # n2: how long nothing had arrived, in us
        return tcp.receive_timeout(me, peer, n0, n1, n2 / 1e6)
    if name == "timeout_send":  # n0: since data last moved both ways with the peer, in us (-1: not both)
        return tcp.send_timeout(me, None if peer < 0 else peer, None if n0 < 0 else n0 / 1e6)
    if name == "abort":
        return abort_error(Header(ABORT, -1, said, n0, 0), peer, None if waiting_for < 0 else waiting_for)
    if name == "mismatch_call":
        if n1 > 0:  # an all_to_all_v pair's agreement (fc_agree.c): what this rank sends and expects
            sig = wire.pair_signature(sig, me, peer, n2 - 1, n1 - 1)
        return other_call(me, peer, seq, sig, n0, said)
    if name == "mismatch_chunk":
        return other_chunk(me, peer, seq, sig, n0, n1, n2, n3)
    if name == "interrupted":
        return FastcollError(why or f"rank {me}'s call was interrupted")
    if name == "shut":
        return FastcollError(finalized_mid_call(me))
    return _lost(name, peer, me, errno_, said)


def _lost(name: str, peer: int, me: int, errno_: int, said: str) -> FastcollError:
    if name == "closed":
        return PeerLostError(f"rank {peer} closed its connection (it exited or was killed)", peer)
    if name == "closed_mid":
        return PeerLostError(f"rank {peer} closed its connection mid-message", peer)
    if name in ("conn", "broken"):  # `said`: the link's own words, where it says more than an errno
        return PeerLostError(f"connection to rank {peer} failed: {said or OSError(errno_, os.strerror(errno_))}", peer)
    if name == "finalized":
        return PeerLostError(f"rank {peer} called finalize() while rank {me} still needed it", peer)
    if name == "malformed":
        return PeerLostError(f"rank {peer} sent a malformed frame ({said}); dropping it", peer)
    if name == "nomem":
        return FastcollError(f"rank {me}: the native engine ran out of memory")
    return FastcollError(f"rank {me}: internal error in the native engine: {said or name}")


def _remaining(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline - time.monotonic()


class NativeTransport(Transport):
    """The message interface (fastcoll/transport/base.py) over the native engine's links
    (`native`: an `_native.Engine`; its `links` carry the messages)."""

    def __init__(self, native: Any, rank: int, size: int, timeout: float, described: str,
                 connections: list[tuple]):
        super().__init__(rank, size)
        self._engine = native  # (its abort and interrupt reach every link and the call under way)
        self._n = native.links
        self._timeout = timeout
        self._described = described
        self._connections = connections
        self._payloads: list[Any] = []  # sent, kept alive until flush()
        self.last_word_until = 0.0  # abort(): until when the notice may take to leave

    def _error(self, e: _native.NativeError) -> FastcollError:
        return error_from(e.args, self.rank, why=self.interrupted)

    def send(self, peer: int, header: Header, payload: memoryview | None, deadline: float | None = None) -> None:
        if payload is not None and payload.nbytes == 0:
            payload = None
        elif payload is not None:
            self._payloads.append(payload)
        try:
            self._n.send(peer, header.kind, header.seq, header.sig.encode(), header.chunk, payload)
        except _native.NativeError as e:
            raise self._error(e) from None

    def flush(self, deadline: float | None = None) -> None:
        limit = self._timeout if deadline is None else _remaining(deadline)
        try:
            self._n.flush(limit)
        except _native.NativeError as e:
            err = self._error(e)
            if e.args[0] != CODE["broken"]:
                raise err from None
            self.explain_broken({e.args[1]: err})
        finally:
            self._payloads.clear()

    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        try:
            kind, seq, sig, got_chunk, got_nbytes = self._n.next_header(peer, chunk, _remaining(deadline))
        except _native.NativeError as e:
            raise self._error(e) from None
        return Header(kind, seq, sig.decode("utf-8", "replace"), got_chunk, got_nbytes)

    def _read_payload(self, peer: int, chunk: int, out: memoryview, deadline: float = math.inf) -> None:
        try:
            self._n.read_payload(peer, chunk, out, _remaining(deadline))
        except _native.NativeError as e:
            raise self._error(e) from None

    def _keep_unread(self, peer: int, chunk: int, header: Header) -> None:
        try:
            self._n.keep_unread(peer, chunk)
        except _native.NativeError as e:
            raise self._error(e) from None

    def _send_abort(self, header: Header) -> None:
        self.last_word_until = time.monotonic() + LAST_WORD_SECONDS
        self._engine.abort(wire.pack(header), LAST_WORD_SECONDS)

    def interrupt(self, why: str) -> None:
        super().interrupt(why)
        self._engine.interrupt()

    def send_raw(self, peer: int, data: bytes) -> None:
        self._n.send_raw(peer, bytes(data))
        self.flush()

    def close(self) -> None:
        pass  # the engine closes the links (NativeEngine.close)

    def describe(self) -> str:
        return self._described

    def connections(self) -> list[tuple[int, int, str, object, object]]:
        return list(self._connections)


class NativeWork(Work):
    """A call queued on the native service thread: wait() waits on its completion there."""

    __slots__ = ("completion",)

    def __init__(self, result: Any):  # (no Event: the completion is native)
        self._done = None
        self._result = result
        self._error: BaseException | None = None
        self.completion: Any = None

    def wait(self, timeout: float | None = None) -> Any:
        if not self.completion.wait(timeout):
            raise TimeoutError(f"the collective did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        if self.completion.code():
            raise FastcollError("the collective did not run: the job ended before its turn")
        return self._result

    def is_completed(self) -> bool:
        return self.completion.done()

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._error = error  # (the completion says when)


class NativeEngine(Engine):
    """The native data plane of one job on this rank (see the module's docstring). It is its own
    `prepared` (fastcoll/engine/base.py's Prepared): it plans calls, serves gates, opens graph
    tables and keeps memory for results."""

    name = "native"

    def __init__(self, native: Any, transport: NativeTransport, timeout: float, result_cache_bytes: int = 0):
        self._n = native
        self._runner = native.runner
        self._gate = native.gate  # (one object: a gate's host half asks whether this serves it)
        self.transport = transport
        self.prepared = self
        self._timeout = timeout
        self._results = _native.ResultCache(result_cache_bytes) if result_cache_bytes else None
        self._ranks: dict[tuple, bytes] = {}  # a group's ranks, as the int32 array C reads
        self._runner.on_failure(self._queued_failed)
        # The planned path's run lock, without a Python frame each (a small call's fixed cost).
        self.claim = self._runner.claim_if_idle
        self.release = self._runner.release

    @classmethod
    def over(cls, config: Any, links: dict[int, list[Any]], local_ranks: int = 1,
             deadline: float | None = None) -> "NativeEngine":
        """Take over `links` (fastcoll.transport.tcp.establish's): their sockets and rings now
        belong to the native engine. `local_ranks`: how many of the job's ranks share this host;
        `deadline`: init()'s (time.monotonic()), which bounds the verbs links' set-up (None:
        FASTCOLL_TIMEOUT from now)."""
        channels = len(next(iter(links.values())))
        config = for_host(config, cpus_per_rank(local_ranks))
        native = _native.Engine(rank=config.rank, size=config.world_size, channels=channels,
                                spin_us=spin_us(config, local_ranks), yield_us=config.yield_us,
                                main_thread=threading.main_thread().ident, long_wait_us=config.long_wait_us)
        connections = [(p, ch, link.kind) + tcp.ends(link.sock) for p, ls in sorted(links.items())
                       for ch, link in enumerate(ls)]
        try:
            # In ascending (peer, channel) order on every rank: a kind whose open waits for the
            # peer's matching links.add (verbs exchanges its queue pairs) then never waits in a
            # circle, since the lowest pair still pending is open on both of its ranks.
            deadline = time.monotonic() + config.timeout if deadline is None else deadline
            for p, ls in sorted(links.items()):
                for ch, link in enumerate(ls):
                    _add_link(native.links, config, p, ch, link, deadline)
        except BaseException:
            native.close(0.0, 0.0)
            tcp.close_links(links)
            raise
        kinds = [link.kind for ls in links.values() for link in ls]
        details = [native.links.info(p, ch)[1] for p, ls in sorted(links.items()) for ch, link in enumerate(ls)
                   if link.kind == "verbs"]  # the link's own words: its device, UC or RC, its MTU
        described = rdma.describe(kinds, details)
        transport = NativeTransport(native, config.rank, config.world_size, config.timeout, described, connections)
        return cls(native, transport, config.timeout, min(config.result_cache_mb, 1 << 30) << 20)

    # ----- the engine interface (base.Engine) -----

    def attach_gate(self, gate: Any) -> None:
        """Serve the host mode's gates here (fastcoll/engine/csrc/gate/fc_gate.c): the arrival poll,
        the exchange and the release run on the service thread without the GIL."""
        host = gate.host_half() if gate is not None else None
        if host is None:
            return
        page = host.page
        self._gate.attach(page.raw, page.layout, host.next_seq(), host.profiled())
        host.served_by(self._gate)

    # ----- prepared calls (base.Prepared) -----

    def plan(self, task: Task) -> Any:
        op = task.body
        kind = None
        if type(op) is Op and op.kind == "gate" and op.gate.host.is_served_by(self._gate) and task.tracer is None:
            kind = "all_gather"  # the gate's exchange: every rank's bytes into the receive mailbox
        elif not _runs_natively(task) or task.tracer is not None or op.kind not in _PLANNED or op.bounds is not None:
            return None
        return self._spec(task, kind)

    def graph_table(self, prefix: str, ranks: tuple[int, ...], rank: int, limit: float, piece_bytes: int,
                    all_reduce: tuple[int, str, str], all_gather: tuple[int, str, str],
                    labels: tuple[str, ...], tracer: Any = None) -> Any:
        rules = [(most, _ALGORITHM[small], _ALGORITHM[large]) for most, small, large in (all_reduce, all_gather)]
        bounds = {} if tracer is None else testhooks.graph_trace_bounds() or GRAPH_TRACE_BOUNDS
        try:
            # the signatures name dtypes and ops as the eager path does, from fastcoll.dtypes
            table = self._runner.graph_open(prefix=prefix, ranks=tuple(ranks), rank=rank, limit=limit,
                                            piece_bytes=piece_bytes, all_reduce=rules[0], all_gather=rules[1],
                                            labels=tuple(labels), dtype_names=dtypes.names(), op_names=dtypes.OPS,
                                            **bounds)
        except _native.NativeError as e:  # closed: finalize() ran
            raise error_from(e.args, self.transport.rank) from None
        if tracer is not None:
            tracer.add_collector(GraphTrace(table, tracer))
        return table.capsule

    def run_planned(self, plan: Any, seq: int, src: Any, dst: Any) -> None:
        try:
            self._runner.run(plan, seq, src, dst)
        except _native.NativeError as e:
            raise self._error(e.args, None, seq, plan.sig) from None

    def submit_gate(self, plan: Any, seq: int, serve: Any, task: Task) -> Work:
        work = NativeWork(None)
        try:
            work.completion = self._gate.submit(plan, seq, serve.ticket.seq, serve.ticket.nbytes, (task, seq), work)
        except _native.NativeError as e:  # closed: finalize() began after the group's check
            raise error_from(e.args, self.transport.rank) from None
        return work

    def enqueue(self, task: Task, async_op: bool) -> Work | None:
        try:
            return self._enqueue(task, async_op)
        except _native.NativeError as e:  # closed: finalize() began after the group's check
            raise error_from(e.args, self.transport.rank) from None

    def _enqueue(self, task: Task, async_op: bool) -> Work | None:
        body = task.body
        if type(body) is Op and body.kind == "gate" and body.gate.host.is_served_by(self._gate):
            work = NativeWork(None)
            serve = body.gate
            work.completion = self._gate.submit(self._spec(task, "all_gather"), task.seq, serve.ticket.seq,
                                                serve.ticket.nbytes, task, work)
            return work
        if not async_op and self._runner.claim_if_idle():
            return None
        if _runs_natively(task) and task.tracer is None:  # (a traced call records its span on the thread)
            work = NativeWork(body.result)
            work.completion = self._runner.submit(self._spec(task), task.seq, body.src, body.dst, task, work)
            return work
        work = Work()
        self._runner.submit_call(functools.partial(self._run_queued, task, work))
        return work

    def run_inline(self, task: Task) -> Any:
        try:
            return self._run(task)
        finally:
            self._runner.release()

    def result_memory(self, nbytes: int) -> Any:
        """A block of fastcoll/engine/csrc/binding/py_results.c's cache: it comes back to the cache when
        the last array over it is gone (None where the cache is off: result_cache_mb=0)."""
        return None if self._results is None else self._results.take(nbytes)

    def close(self, timeout: float) -> None:
        self.finalizing = True  # a call that close() ends raises without an abort notice
        linger = max(0.0, self.transport.last_word_until - time.monotonic())
        try:
            self._n.close(timeout, linger)
        finally:
            if self._results is not None:
                self._results.close()

    # ----- running -----

    def _run(self, task: Task) -> Any:
        """Run `task` on this thread, which holds the run lock: natively, or its Python schedule."""
        return self._run_native(task) if _runs_natively(task) else run_task(self.transport, task)

    def _run_native(self, task: Task) -> Any:
        err = task.broken()
        if err is not None:
            raise err
        started = time.monotonic()
        op = task.body
        try:
            if task.tracer is None:
                self._runner.run(self._spec(task), task.seq, op.src, op.dst)
            else:
                self._run_traced(task)
        except _native.NativeError as e:
            task.fail(self._error(e.args, task), started)
        except BaseException as e:  # a Ctrl-C that a signal handler raised during the wait
            task.fail(e, started)
            raise
        return task.body.result

    def _run_traced(self, task: Task) -> None:
        """Run task natively with its phases noted by the engine (fastcoll/engine/csrc/algorithms/
        fc_trace.c), written as the spans the Python engine's trace has: the queue, the call, and
        within it each send, wait, receive, reduce and flush (those of a failed call too)."""
        tracer, op = task.tracer, task.body
        tracer.span("queue", task.queued, seq=task.seq)
        began = tracer.now()
        noted = None
        try:
            noted = self._runner.run(self._spec(task, trace=True), task.seq, op.src, op.dst)
        except _native.NativeError as e:
            noted = getattr(e, "spans", None)
            raise
        finally:
            spans, dropped = noted if noted is not None else ((), 0)
            for phase, peer, nbytes, start, end in spans:  # (times since the run began, in ns)
                args = {} if peer < 0 else {"peer": peer}
                if _PHASES[phase] in ("send", "receive", "reduce"):
                    args["bytes"] = nbytes
                tracer.span(_PHASES[phase], began + start, began + end, **args)
            tracer.span(task.sig, began, seq=task.seq, **({"dropped": dropped} if dropped else {}))

    def _run_queued(self, task: Task, work: Work) -> None:
        try:
            work._finish(self._run(task))
        except BaseException as e:  # the caller gets it through Work.wait()
            work._finish(error=e)

    def _queued_failed(self, task: Task, work: Work, info: tuple | None, waited: float) -> None:
        """From the service thread (with the GIL): a queued call failed (info), or the job had
        failed before its turn (None). Break the job as a failure on the caller's thread would,
        and hand the caller's Work the error. A planned gate names its task as (template, seq)."""
        if type(task) is tuple:
            task = dataclasses.replace(task[0], seq=task[1])
        if type(task.body) is Op and task.body.kind == "gate":
            testhooks.point("gate-failed")
        try:
            err = task.broken()
            if info is None or err is not None:
                raise err or FastcollError("the job failed before this collective ran")
            task.fail(self._error(info, task), time.monotonic() - waited)
        except BaseException as e:
            work._finish(error=e)

    def _error(self, info: tuple, task: Task | None, seq: int = -1, sig: str = "") -> FastcollError:
        """The error a failed call (task's, or call seq of signature sig) raises."""
        if task is not None and _CODES[info[0]].startswith("gate_"):
            return task.body.gate.host.native_failure(_CODES[info[0]], info[4], info[5])
        if task is not None:
            seq, sig = task.seq, task.sig
        err = error_from(info, self.transport.rank, seq, sig, self.transport.interrupted)
        if info[0] != CODE["broken"]:
            return err
        try:  # what the peer said before its connection broke is its error, not the broken pipe
            self.transport.explain_broken({info[1]: err})
        except FastcollError as said:
            return said
        return err

    def _spec(self, task: Task, kind: str | None = None, trace: bool = False) -> Any:
        """The `_native.OpSpec` of task's Op (as a collective of `kind`, if given; `trace`: its
        run notes its phases): everything but the call's sequence number and buffers, which each
        run or submit gives."""
        op: Op = task.body
        buf = op.src if op.src is not None else op.dst
        itemsize = 1 if buf is None else buf.itemsize
        dtype = _DTYPE[op.dtype] if op.dtype else _MOVER[itemsize]
        ranks = self._ranks.get(task.ranks)
        if ranks is None:
            ranks = self._ranks[task.ranks] = np.asarray(task.ranks, dtype=np.int32).tobytes()
        return self._runner.spec(kind=_KIND[kind or op.kind], algorithm=_ALGORITHM[op.algorithm], sig=task.sig,
                                 limit=task.limit, rank=task.rank, size=task.size, ranks=ranks,
                                 piece_bytes=task.piece_bytes, dtype=dtype, itemsize=itemsize,
                                 reduce=_REDUCE[op.reduce or "sum"], root=op.root, bounds=_bounds(op.bounds),
                                 recv_bounds=_bounds(op.recv_bounds), agree_counts=op.agree_counts, trace=trace)


# What a traced graph table keeps at most: the engine's own maxima (py_common.h says why).
GRAPH_TRACE_BOUNDS = dict(_native.GRAPH_TRACE_MAX)


class GraphTrace:
    """The graph table's calls in the rank's trace (a Tracer's collector): what the engine noted
    since the last time (GraphTable.trace), as the spans the eager path's traced calls have,
    on a row of their own, "MLX's graph": the queue (where the call waited behind Python's),
    the call named by its signature with its `seq` (and a send's or receive's peer and bytes),
    and within it its phases; and, where calls were not kept, an instant naming how many."""

    ROW = "MLX's graph"

    def __init__(self, table: Any, tracer: Any):
        self._table = table
        self._tracer = tracer
        self._events: list[dict] = []
        self._dropped: dict | None = None

    def __call__(self) -> list[dict]:
        tracer = self._tracer
        asked = tracer.now()
        got = self._table.trace()
        if got is None:
            return []
        shift = asked - got["now"]  # the engine's clock (fc_now) to the tracer's, as of the asking
        tid = tracer.lane(self.ROW)
        for call in got["calls"]:
            self._events += self._spans(call, tid, shift)
        if got["dropped"]:
            self._dropped = tracer.event("graph calls not kept", tid, got["first_dropped"] + shift,
                                         dropped=got["dropped"])
        return self._events + ([self._dropped] if self._dropped is not None else [])

    def _spans(self, call: dict, tid: int, shift: int) -> list[dict]:
        event = self._tracer.event
        events = [event("queue", tid, call["queued"] + shift, call["start"] + shift, seq=call["seq"])]
        for phase, peer, nbytes, start, end in call["phases"]:
            args = {} if peer < 0 else {"peer": peer}
            if _PHASES[phase] in ("send", "receive", "reduce"):
                args["bytes"] = nbytes
            events.append(event(_PHASES[phase], tid, start + shift, end + shift, **args))
        args = {"seq": call["seq"]}
        if call["peer"] >= 0:
            args.update(peer=call["peer"], bytes=call["bytes"])
        if call["dropped"]:
            args["dropped"] = call["dropped"]
        events.append(event(call["name"], tid, call["start"] + shift, call["end"] + shift, **args))
        return events


# The longest a verbs link's set-up may wait for its peer (links.add's bound: a day).
MAX_SETUP_SECONDS = 86400.0


def _add_link(links: Any, config: Any, peer: int, channel: int, link: Any, deadline: float) -> None:
    """Give `link`'s connection to the native engine (`links`: its `_native.Links`) as a link of its kind. A verbs link's set-up
    waits for the peer's, until `deadline`; one that fails is the error _setup_failed says."""
    options: dict[str, Any] = {"kind": link.kind}
    limit = 0.0
    if link.kind == "shm":
        segment, tx, rx, capacity = link.segment
        options.update(segment=segment, tx_offset=tx, rx_offset=rx, capacity=capacity)
    elif link.kind == "verbs":
        limit = min(deadline - time.monotonic(), MAX_SETUP_SECONDS)
        if limit <= 0:
            raise CollectiveTimeoutError(f"rank {config.rank} timed out before it could set up its RDMA link to "
                                         f"rank {peer}")
        options.update(device=link.device, library=config.verbs_lib, reliable=config.rdma_reliable,
                       setup_timeout=limit, same_host=link.same_host)
    started = time.monotonic()
    try:
        links.add(peer, channel, link.sock.fileno(), **options)
    except RuntimeError as e:
        if link.kind != "verbs" or isinstance(e, FastcollError):
            raise
        raise _setup_failed(config.rank, peer, link, " ".join(str(e).split()), time.monotonic() - started >= limit)
    link.sock.detach()  # the fd is the engine's now


def _setup_failed(me: int, peer: int, link: Any, reason: str, out_of_time: bool) -> FastcollError:
    """The error of a verbs link whose set-up failed: the peer's, where its end of the connection
    is gone (it died, or gave up first) or it never answered; else this rank's own (a library or
    device that would not open), a FastcollError naming the device."""
    if _ended(link.sock):
        return PeerLostError(f"rank {peer} closed its connection while rank {me} set up the RDMA link to it "
                             f"({reason})", peer)
    if out_of_time:
        return CollectiveTimeoutError(f"rank {me} timed out setting up its RDMA link to rank {peer} ({reason})")
    return FastcollError(f"rank {me} (device {link.device}): {reason}")


def _ended(sock: Any) -> bool:
    """Whether the peer's end of a connected socket is gone (closed, reset), without waiting."""
    poller = poll()
    poller.register(sock.fileno(), POLLIN)
    events = poller.poll(0)
    if not events:
        return False
    if events[0][1] & (POLLHUP | POLLERR):
        return True
    try:  # readable: the end of the stream, or bytes (then the peer is still there)
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset, broken: gone
        return True


# The collectives a Plan serves (the small calls a loop repeats).
_PLANNED = frozenset(("all_reduce", "all_gather", "broadcast"))


def spin_us(config: Any, local_ranks: int) -> int:
    """How long a wait spins before it yields (config.spin_us; -1: AUTO_SPIN_US, or 0 where this
    host's ranks outnumber its CPUs). The machine's CPUs, not this process's: a rank bound to one
    core (fastcoll-launch --bind-to cores) still has its peers on cores of their own."""
    if config.spin_us >= 0:
        return config.spin_us
    return 0 if local_ranks > (os.cpu_count() or 1) else AUTO_SPIN_US


def cpus_per_rank(local_ranks: int) -> float:
    """The CPUs one of this host's ranks can count on: its share of the machine's, and no more
    than this process may run on, since a wait that yields competes with the rank's own threads
    (unlike spin_us's rule, which weighs the peers' cores)."""
    machine = os.cpu_count() or 1
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity mask
        mine = machine
    return min(mine, machine / max(local_ranks, 1))


def _runs_natively(task: Task) -> bool:
    """Whether the native engine runs task's schedule itself (else its Python schedule runs over
    the native messages): an Op without a check after it. A traced call runs natively too: a
    rank's trace is its own setting, and the Python schedules are not the native ones, so a
    traced rank that ran Python would send what its untraced peers do not expect."""
    body = task.body
    return type(body) is Op and body.after is None and body.gate is None


def _bounds(bounds: list[tuple[int, int]] | None) -> np.ndarray | None:
    return None if bounds is None else np.ascontiguousarray(bounds, dtype=np.int64)
