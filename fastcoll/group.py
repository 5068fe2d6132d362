"""Groups: this rank's place in a job, as in mx.distributed.Group, and how a collective runs.

`fastcoll.init()` makes a job's root group; `Group.split` makes sub-groups of it (as
MPI_Comm_split does) over the same connections. Every group of one job shares a `Job`
(fastcoll/job.py): the engine, the lock that orders calls, the tracer, the fence gate, and the
first error. A group adds its own view: which of the job's ranks are its members, its own
sequence of collectives, and a prefix on every signature it sends.

Sub-groups:
- Their collectives run the same algorithms on sub-group ranks; `Call` maps them to the job's.
- Each numbers its collectives in a sequence of its own, and every signature it sends starts with
  a prefix of its own (`s<n>c<color>/`: the n-th split of its parent, this color; nested splits
  add to the parent's prefix). A message of one group can therefore never be taken for a message
  of another: it fails the header check (`MismatchError`), it is never reduced into the wrong
  buffer.
- All groups of a rank share its service thread and ordering lock, so the connections still
  have one user at a time and the collectives of all groups of a rank run in its call order.

The rule that follows (the one NCCL states for communicators that share a stream): two ranks
that share several groups must call the collectives that involve both of them in the same
order. Collectives of groups that share no pair of ranks are independent. A program that breaks
the rule gets a `MismatchError` on the ranks concerned, not a hang and not wrong data.

Because a failure leaves the shared connections mid-message, an error in any group breaks the
job, and so every group of it. `finalize()` on a sub-group only retires that view;
`fastcoll.finalize()` closes the connections under every group.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import threading
import time
from typing import Any, Callable

import numpy as np

from fastcoll import arrays, diagnosis
from fastcoll.algorithms import block, select
from fastcoll.config import Config, check_timeout
from fastcoll.engine import Engine, Op, Task
from fastcoll.errors import FastcollError, MismatchError
from fastcoll.job import Job
from fastcoll.service import Done
from fastcoll.wire import signature

log = logging.getLogger("fastcoll")

_MAIN_IDENT = threading.main_thread().ident  # calls from other threads tag their signature
_monotonic = time.monotonic  # (globals: a planned call's own work is counted in nanoseconds)
_get_ident = threading.get_ident
NOT_PLANNED = object()  # Group.run_plan's answer when a call must take the ordinary way
NOT_GATED = object()  # Group.launch_gated's answer when the gate does not take the call
_PLANS_MAX = 64  # kinds of repeated call a group remembers (a model repeats a handful)
# A numpy result this large is made over memory from the engine (Prepared.result_memory); a smaller
# one is numpy's: malloc's free lists serve it without fresh pages anyway.
ENGINE_RESULT_BYTES = 1 << 20


class Group:
    """The ranks of a job, as in mx.distributed.Group: `rank()` and `size()`.

    Collectives on a group run on its service thread in call order. After any error (a peer
    lost, a timeout, a mismatch) the group is broken: every later call raises that error again.
    `fastcoll.init()` makes the job's group; use `split` for sub-groups.
    """

    def __init__(self, config: Config, engine: Engine | None = None, gate: Any = None, hosts: list[str] | None = None,
                 processes: list | None = None, host_ids: list | None = None):
        self._job = Job(config, engine, gate, hosts, processes, host_ids)
        self._view(config, tuple(range(config.world_size)), "")

    def _view(self, config: Config, ranks: tuple[int, ...], prefix: str) -> None:
        if self._job.host_ids:  # the job's doubling, off where this group's hosts make it cross twice
            config = dataclasses.replace(config, doubling=self._job.config.doubling)
            if not self._job.doubling_across_hosts:  # unless init() timed doubling the faster
                config = select.for_hosts(config, [self._job.host_ids[r] for r in ranks])
        self.config = config  # rank and world_size are this group's
        self._ranks = ranks  # the job's rank of each of this group's ranks
        self._prefix = prefix
        self._seq = 0
        self._p2p_seq: dict[tuple[str, int], int] = {}  # ("send", dst) / ("recv", src) -> count
        self._splits = 0
        self._closed = False
        self._threads: dict[str, threading.Thread] = {}  # name -> the thread that calls under it
        self.gate = self._job.gate  # the job's fence gate, or None (fixed at init)
        self.plans: dict[tuple, Any] = {}  # a repeated call's key -> its engine's plan
        self.gate_submits: dict[tuple, Callable[[Any], Any]] = {}  # a gated call's key -> gate_submitter's

    def rank(self) -> int:
        """This process's rank, 0 <= rank < size."""
        return self.config.rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self.config.world_size

    def members(self) -> list[int]:
        """The job's (global) rank of each rank of this group, in group rank order."""
        return list(self._ranks)

    def prefix(self) -> str:
        """What this group's signatures start with: '' for the job's group, 's0c1/' for the first
        split's color 1 (nested splits add to their parent's)."""
        return self._prefix

    def rank_names(self) -> tuple[str, ...]:
        """How messages name each of this group's ranks: 'rank 1 (host host2)' (the job's rank)."""
        return tuple(diagnosis.rank_name(r, self._job.hosts) for r in self._ranks)

    def set_before_call(self, wait: Callable[[], None] | None) -> None:
        """Have every call of every group of this job call `wait()` first, on the caller's thread
        (None: nothing). Graph mode waits there for the collectives MLX's graph runs without the
        job's order (fastcoll.mlx_compat.graph), so that an eager call comes after them."""
        self._job.before_call = wait

    def __repr__(self) -> str:
        return f"<fastcoll.Group rank={self.rank()} size={self.size()} transport={self.config.transport}>"

    def transport_info(self) -> str:
        """What carries this group's messages and which engine moves them: 'tcp; native engine',
        'tcp, shared memory on 1 of 1 connections; native engine', 'zmq; python engine', or
        'none' for a world of one."""
        engine = self._job.engine
        return "none" if engine is None else engine.describe()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new numpy array for a collective's result (uninitialised, as numpy.empty's): a large
        one over memory the engine keeps between calls, where it keeps any."""
        nbytes = math.prod(shape) * dtype.itemsize
        prepared = self._job.prepared
        memory = prepared.result_memory(nbytes) if prepared is not None and nbytes >= ENGINE_RESULT_BYTES else None
        if memory is None:
            return np.empty(shape, dtype)
        return np.frombuffer(memory, dtype=dtype).reshape(shape)

    def split(self, color: int, key: int = -1, timeout: float | None = None) -> "Group":
        """Split into sub-groups by `color`; every rank of this group must call it.

        Ranks that pass the same color form one sub-group. Within it, ranks are ordered by `key`
        (ties and negative keys: by rank here), as MPI_Comm_split and mx.distributed's
        Group.split document. The sub-group shares this group's connections (see the module's
        docstring for the ordering rule). A group of one splits into a group of one without
        communicating.
        """
        for name, v in (("color", color), ("key", key)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"split {name} must be an int, not {type(v).__name__}")
        self.check()
        prefix = f"{self._prefix}s{self._splits}c{int(color)}/"
        self._splits += 1
        if self.size() == 1:
            return SubGroup(self, [0], prefix)
        table = self.gather_ints("split", [int(color), int(key)], timeout)
        same = [r for r in range(self.size()) if table[r, 0] == color]
        members = sorted(same, key=lambda r: (int(table[r, 1]) if table[r, 1] >= 0 else r, r))
        return SubGroup(self, members, prefix)

    def new_group(self, ranks: Any, timeout: float | None = None) -> "Group":
        """A sub-group of `ranks` (ranks of this group), as torch.distributed.new_group: every
        rank of this group calls it, with the same `ranks`. Members get the sub-group, ranked in
        sorted order; the other ranks get a `NonMember`, every use of which raises ValueError.
        Ranks that pass different lists all raise MismatchError (the lists are compared through
        a digest, so this costs one small all_gather, as split does)."""
        try:
            ranks = list(ranks)
            members = sorted({int(r) for r in ranks})
            ok = all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in ranks)
        except (TypeError, ValueError):
            raise TypeError(f"new_group ranks must be a sequence of ints, not {type(ranks).__name__}") from None
        if not ok or not members:
            raise (TypeError if not ok else ValueError)(f"new_group needs a non-empty list of int ranks, not {ranks!r}")
        if len(members) != len(ranks) or members[0] < 0 or members[-1] >= self.size():
            raise ValueError(f"new_group ranks {list(ranks)} must be distinct ranks of this group (0..{self.size() - 1})")
        self.check()
        prefix = f"{self._prefix}s{self._splits}g/"
        self._splits += 1
        if self.size() > 1:
            digest = int.from_bytes(hashlib.sha256(repr(members).encode()).digest()[:8], "little") >> 1
            table = self.gather_ints("new_group", [digest], timeout)
            differ = [r for r in range(self.size()) if table[r, 0] != table[0, 0]]
            if differ:
                raise MismatchError(
                    f"new_group: ranks {differ} passed a different list of ranks than rank 0; "
                    f"rank {self.rank()} passed {members}")
        if self.rank() not in members:
            return NonMember(self, members)
        return SubGroup(self, members, prefix)

    def gather_ints(self, what: str, values: list[int], timeout: float | None) -> np.ndarray:
        """Every rank's `values` (the same count on each), as rows of an int64 table."""
        n, k = self.size(), len(values)
        buf = np.empty(n * k, dtype=np.int64)
        a, b = block(buf.size, n, self.rank())
        buf[a:b] = values
        op = Op("all_gather", self.choose("all_gather", buf.nbytes), dst=buf)
        self.drain_gate()
        self.run(f"{what}(int64,{k})", op, timeout)
        return buf.reshape(n, k)

    def check(self) -> None:
        """Raise the error that broke this group (or a gate's pending error), if any."""
        job = self._job
        if job.error is None and job.gate is None and not (self._closed or job.closed):
            return  # the common case, first: every call passes here twice
        if self._closed or self._job.closed:
            raise FastcollError(
                "this group was finalized (fastcoll.finalize() or Group.finalize() ended it): no "
                "collective runs on it any more; only an explicit fastcoll.init() starts a new job")
        err = self._job.error
        if err is not None:
            raise type(err)(str(err))
        if self._job.gate is not None:
            self._job.gate.check()

    def finalize(self) -> None:
        """Finish queued work (graph mode's too), tell the peers, and release sockets and threads."""
        try:
            if self._job.before_call is not None and not self._closed:
                self._job.before_call()
        finally:
            self._closed = True
            self._job.close()

    # ----- what the collectives use (fastcoll/collectives.py, exchange.py, objects.py) -----

    def choose(self, collective: str, nbytes: int) -> str:
        """The algorithm (a name an Op carries) that runs `collective` over `nbytes` bytes on
        this group: the one place that asks the rule (fastcoll/algorithms/select.py)."""
        return select.algorithm(collective, nbytes, self.config.world_size, self.config)

    def keep_doubling_across_hosts(self) -> None:
        """What init() does where it timed recursive doubling faster than direct sends across the
        job's hosts (fastcoll/doubling_probe.py): this group, and every group split from it later,
        keeps the job's doubling whatever its hosts."""
        self._job.doubling_across_hosts = True
        self.config = dataclasses.replace(self.config, doubling=self._job.config.doubling)

    def graph_table(self) -> Any:
        """The engine's table that runs this group's collectives from MLX's evaluation thread
        without Python (fastcoll.mlx_compat.graph), or None where the engine has none. Give it a
        group of its own (`split`): the table numbers the calls, so Python must make none here."""
        prepared = self._job.prepared
        if prepared is None:
            return None
        labels = self.rank_names()
        rules = [select.by_size(c, self.size(), self.config) for c in ("all_reduce", "all_gather")]
        return prepared.graph_table(self._prefix, self._ranks, self.rank(), self.config.timeout,
                                      self.config.piece_bytes, *rules, labels, self._job.tracer)

    def drain_gate(self) -> None:
        """Evaluate gated results nobody has evaluated yet: they would hold the service queue
        (which every group of the job shares) ahead of the call about to be queued."""
        gate = self._job.gate
        if gate is not None and gate.pending():
            gate.drain()

    def run(
        self,
        sig: str,
        body: Op | Callable[[Any], Any],
        timeout: float | None = None,
        async_op: bool = False,
        p2p: tuple[str, int] | None = None,
    ) -> Any:
        """Run `body` (an Op, or a schedule body(call) over the message interface) as this
        group's next collective; its result or, with async_op, a Work.

        Collectives are numbered in one sequence that every rank of the group shares; a
        point-to-point message (`p2p` = ("send", dst) or ("recv", src)) in a sequence of that
        pair of ranks."""
        self.check()
        limit = self.config.timeout if timeout is None else check_timeout(timeout, "timeout")
        job = self._job
        if job.before_call is not None:
            job.before_call()
        if self._prefix:
            sig = self._prefix + sig
        with job.lock:
            if _get_ident() != _MAIN_IDENT:  # (cheaper than current_thread() per call)
                sig += self._thread_tag(threading.current_thread())
            if p2p is None:
                seq = self._seq
                self._seq += 1
            else:
                seq = self._p2p_seq.get(p2p, 0)
                self._p2p_seq[p2p] = seq + 1
            task = Task(seq, sig, limit, self.config.rank, self.config.world_size, self._ranks, body,
                        job.recorded, functools.partial(job.failed, self.config.rank, sig, limit, timeout is None),
                        self.config.piece_bytes, job.tracer, job.tracer.now() if job.tracer is not None else 0)
            # Taken while still holding the order lock, which keeps call order.
            work = job.engine.enqueue(task, async_op)
        if work is None:
            return job.engine.run_inline(task)
        if async_op:
            return work
        try:
            return work.wait()
        except BaseException:
            if not work.is_completed():  # Ctrl-C while the queue runs it: end it there
                job.engine.transport.interrupt(f"rank {self.rank()} was interrupted during {sig}")
            raise

    def _thread_tag(self, thread: threading.Thread) -> str:
        """' in thread NAME': what a call from a thread other than the main one adds to its
        signature, so that calls of two threads never pair up across ranks (the other rank's
        thread of another name makes it a MismatchError, not mixed data). Two live threads of
        one name cannot be told apart: the second raises at once."""
        name = thread.name
        seen = self._threads.get(name)
        if seen is not thread:
            if seen is not None and seen.is_alive():
                raise FastcollError(
                    f"two threads named {name!r} call collectives on one group, which cannot tell "
                    "their calls apart; name them apart (threading.Thread(name=...)), or give each "
                    "thread its own group (docs/failures.md, Threads)")
            self._threads[name] = thread
        return f" in thread {name[:64]!r}"

    def prepare(self, sig: str, op: Op) -> Any:
        """A plan of `op` (a synchronous call of `sig`, from the main thread, with the default
        time limit) for `run_plan`, or None where the engine prepares none or the group keeps
        no more. The collective files it in `plans` under a key that fixes every check and
        choice the call made, so that a call with that key skips them."""
        job = self._job
        if (job.prepared is None or job.tracer is not None or job.gate is not None or _get_ident() != _MAIN_IDENT
                or len(self.plans) >= _PLANS_MAX):
            return None  # run_plan refuses every plan under a gate: one would only hold a slot
        task = Task(0, self._prefix + sig, self.config.timeout, self.config.rank, self.config.world_size,
                    self._ranks, op, job.recorded, _no_fail, self.config.piece_bytes)
        return job.prepared.plan(task)

    def run_plan(self, plan: Any, src: Any, dst: Any, result: Any) -> Any:
        """Run a call that `prepare` planned with these buffers: its result, or NOT_PLANNED when
        it must take the ordinary way (the job has failed, a gate is on, another thread calls,
        or calls are queued)."""
        job = self._job
        if job.error is not None or self._closed or job.closed or job.gate is not None or _get_ident() != _MAIN_IDENT:
            return NOT_PLANNED
        if job.before_call is not None:
            job.before_call()
        engine = job.prepared  # (a plan comes from it)
        lock = job.lock
        lock.acquire()
        if not engine.claim():
            lock.release()
            return NOT_PLANNED
        seq = self._seq
        self._seq = seq + 1
        lock.release()
        started = _monotonic()
        try:
            engine.run_planned(plan, seq, src, dst)
        except BaseException as e:
            job.failed(self.config.rank, plan.sig, self.config.timeout, True, e, started)
            raise
        finally:
            engine.release()
        return result

    def launch_gated(self, x: Any, op: str, async_op: bool, timeout: float | None) -> Any:
        """all_reduce(x, op) through the job's fence gate, if the gate takes it here: the result
        (with async_op, a finished Work), else NOT_GATED. A world of one has nothing to exchange
        and sub-groups keep the host path; the caller has checked the group."""
        gate = self._job.gate
        if self._prefix or self.config.world_size == 1 or not gate.accepts(x, op):
            return NOT_GATED
        if gate.direct:  # the GPUs gather among themselves: nothing for the host to do per gate
            y = gate.launch(x, op)
        else:  # the host moves every rank's bytes into the receive mailbox; the GPU reduces them
            key = (x.shape, x.dtype, op)
            submit = self.gate_submits.get(key) if timeout is None else None
            y = gate.launch(x, op, None, submit or self._gate_submitter(key, timeout))
        return Done(y) if async_op else y

    def _gate_submitter(self, key: tuple, timeout: float | None) -> Callable[[Any], Any]:
        """How a host-mode gated all_reduce of `key` queues its host half (a Serve, whose exchange
        gathers every rank's bytes of it): planned where the engine can prepare the exchange once
        (a decode step repeats a few keys), else through `run` like any call."""
        shape, dtype, op = key
        sig = signature("all_reduce", op, arrays.MLX_NAMES[dtype], tuple(shape))
        run = functools.partial(self._run_gate, sig, timeout)
        if timeout is not None or self._job.tracer is not None or len(self.gate_submits) >= _PLANS_MAX:
            return run

        def first(serve: Any) -> Any:  # the plan needs a gate's size: made at the first call
            self.gate_submits[key] = self._planned_gate(sig, serve) or run
            return self.gate_submits[key](serve)

        self.gate_submits[key] = first
        return first

    def _run_gate(self, sig: str, timeout: float | None, serve: Any) -> Any:
        """Queue serve's host half as this group's next call, the general way."""
        gathered = serve.gathered()
        op = Op("gate", self.choose("all_gather", gathered.nbytes), dst=gathered, gate=serve)
        return self.run(sig, op, timeout, async_op=True)

    def _planned_gate(self, sig: str, serve: Any) -> Callable[[Any], Any] | None:
        """A submit for gates of serve's kind that skips `run`'s per-call work, from the main
        thread (another thread's calls tag their signature); None where the engine plans none."""
        job, config = self._job, self.config
        algorithm = self.choose("all_gather", serve.gathered().nbytes)
        task = Task(0, sig, config.timeout, config.rank, config.world_size, self._ranks,
                    Op("gate", algorithm, gate=serve), job.recorded,
                    functools.partial(job.failed, config.rank, sig, config.timeout, True), config.piece_bytes)
        plan = None if job.prepared is None else job.prepared.plan(task)
        if plan is None:
            return None
        engine, lock, general = job.prepared, job.lock, functools.partial(self._run_gate, sig, None)

        def submit(serve: Any) -> Any:
            if _get_ident() != _MAIN_IDENT:
                return general(serve)
            with lock:  # (the call's begin checked the group)
                seq = self._seq
                self._seq += 1
                return engine.submit_gate(plan, seq, serve, task)

        return submit


class SubGroup(Group):
    """A group made by `Group.split`: `rank()` and `size()` are within the sub-group."""

    def __init__(self, parent: Group, members: list[int], prefix: str):
        job = parent._job
        config = dataclasses.replace(parent.config, rank=members.index(parent.rank()), world_size=len(members))
        self._job = job
        self._view(config, tuple(parent._ranks[m] for m in members), prefix)

    def __repr__(self) -> str:
        return (
            f"<fastcoll.SubGroup rank={self.rank()} size={self.size()} "
            f"global ranks={list(self._ranks)} prefix={self._prefix!r}>"
        )

    def finalize(self) -> None:
        """Retire this view; the connections stay open for the job's other groups."""
        self._closed = True


class NonMember(Group):
    """What `new_group` gives a rank that is not one of its members: every use raises ValueError
    (torch.distributed's GROUP_NON_MEMBER). rank() is -1, size() the member count."""

    def __init__(self, parent: Group, members: list[int]):
        self._job = parent._job
        self._view(parent.config, tuple(parent._ranks[m] for m in members), "")
        self._me = parent._ranks[parent.rank()]

    def rank(self) -> int:
        return -1

    def size(self) -> int:
        return len(self._ranks)

    def __repr__(self) -> str:
        return f"<fastcoll.NonMember of a group of job ranks {list(self._ranks)}>"

    def check(self) -> None:
        raise ValueError(
            f"this rank (job rank {self._me}) is not a member of the group of job ranks "
            f"{list(self._ranks)} made by new_group; only its members may use it")

    def finalize(self) -> None:
        self._closed = True



def _no_fail(e: BaseException, started: float) -> None:
    raise e  # a plan's template task never runs
