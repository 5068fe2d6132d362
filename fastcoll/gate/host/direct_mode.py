"""The gate's direct mode: ranks of one host whose GPUs gather through shared memory, so that no
host moves a byte per gate.

Where every rank of a job is on one host and its GPU backend can reach another process's memory
(CUDA, through cudaHostRegister), rank 0 creates a gather segment (POSIX shared memory, laid out
as layout.GatherLayout) and the others attach it; each registers it with its GPU and writes the
segment's GPU-visible address into the kernels. From then on each gate's kernel (fc_gate, the
shared body's FC_DIRECT paths, fastcoll/gate/device/gate.h) works across the ranks by itself:

    its threads       x -> this rank's slot of the segment's set (seq & 1); SIG, then FLAG = seq
    thread 0 alone    spins until every rank's FLAG reaches seq (or RELEASE, the host's abort);
                      then every rank's SIG must be this rank's (else: a mismatch)
    its threads       every rank's slot reduced, in rank order, into the result

The host half only supervises, from a thread of its own (`Watcher`), while gates are in flight:
a peer whose process is gone (each rank's PID is in its line of the segment) is PeerLostError, a
gate this rank's GPU reached but a peer did not within FASTCOLL_TIMEOUT is CollectiveTimeoutError
naming that peer, and either releases every issued gate with an error status, as the host mode
does. While gates pass, a look reads two words of the control page; the peers' processes are
looked at only once the gates have stopped (a dead peer stops them), since each look at a process
is a system call that hands the GIL back and forth with the thread building the next token. The
per-gate Python work (a poll, an exchange, a release on the service thread) and its need of the
GIL are gone, which is what makes the gate cheap beside a Python thread that builds the next
token (mlx-lm's generation loop).

Where ranks span hosts, or the backend cannot share memory (Metal through MLX), the gate keeps
the host mode: every rank decides alike, from an all_gather of what each could set up.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from fastcoll.errors import CollectiveTimeoutError, PeerLostError
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.seq import seq_add, seq_diff
from fastcoll.transport import shm

log = logging.getLogger("fastcoll.gate")

_NAME_BYTES = 32  # a segment name ("/fc" + 24 hex digits) fits
GatherInts = Callable[[str, list[int]], np.ndarray]  # every rank's values, as rows


class Gather:
    """This rank's mapping of the gather segment: its lines (flags, signatures, pids) for the
    watcher, and its GPU-visible address for the kernels."""

    def __init__(self, mem: Any, layout: L.GatherLayout, rank: int, address: int, undo: Callable[[], None] | None):
        self._mem = mem
        self._view = memoryview(mem)[shm.PREAMBLE_PAGE:]
        self.words = self._view.cast("I")
        self.layout = layout
        self.rank = rank
        self.address = address  # of the layout's start, for the GPU
        self._undo = undo

    def flag(self, rank: int) -> int:
        """The last gate `rank` arrived at."""
        return self.words[self.layout.line(rank) + L.G_FLAG]

    def pid(self, rank: int) -> int:
        return self.words[self.layout.line(rank) + L.G_PID]

    def close(self) -> None:
        """Unregister and unmap (once no kernel can reach the segment any more)."""
        if self._undo is not None:
            undo, self._undo = self._undo, None
            undo()
        self.words.release()
        self._view.release()
        try:
            self._mem.close()
        except BufferError:  # a view still alive elsewhere: the mapping goes with the process
            pass


def setup(gather_ints: GatherInts, rank: int, size: int, max_bytes: int,
          share: Callable[[int, int], tuple[int, Callable[[], None]] | None]) -> Gather | None:
    """Set up the gather segment with every rank of the job (all must call it), or None on every
    rank if any rank cannot (then the gate keeps the host mode).

    `gather_ints(name, values)` all-gathers small integers over the job's transport; `share(ptr,
    nbytes)` registers host memory with this rank's GPU (the backend's share_host_memory)."""
    layout = L.GatherLayout(max_bytes, size)
    nbytes = shm.PREAMBLE_PAGE + layout.total_bytes
    name = ""
    mem = None
    offer = [0] * (1 + _NAME_BYTES + 16)
    if rank == 0 and shm.available():
        try:
            name, nonce, mem = shm.create_segment(nbytes)
            offer = [1, *name.encode().ljust(_NAME_BYTES, b"\0"), *nonce]
        except OSError as e:
            log.info("no gather segment for the gate's direct mode (%s): it keeps the host mode", e)
    try:
        row = gather_ints("gate_gather_offer", offer)[0]
        gather = None
        if row[0] == 1:
            if rank != 0:
                seg = bytes(int(v) for v in row[1 : 1 + _NAME_BYTES]).rstrip(b"\0").decode()
                mem = shm.attach_segment(seg, bytes(int(v) for v in row[1 + _NAME_BYTES :]), nbytes)
            if mem is not None:
                gather = _register(mem, layout, rank, share)
        oks = gather_ints("gate_gather_ok", [int(gather is not None)])
    finally:
        if name:
            shm.unlink_segment(name)  # every rank attached (or gave up): nothing is left behind
    if not all(int(v) for v in oks[:, 0]):
        if gather is not None:
            gather.close()
        elif mem is not None:
            mem.close()
        log.info("the gate's direct mode is off: not every rank could share the gather segment")
        return None
    gather.words[layout.line(rank) + L.G_PID] = os.getpid()
    log.info("fence gate, direct mode: %d ranks of this host gather through shared memory", size)
    return gather


def _register(mem: Any, layout: L.GatherLayout, rank: int,
              share: Callable[[int, int], tuple[int, Callable[[], None]] | None]) -> Gather | None:
    anchor = ctypes.c_char.from_buffer(mem)  # the mapping's address (an export, released below)
    base = ctypes.addressof(anchor)
    del anchor
    shared = share(base, len(mem))
    if shared is None:
        mem.close()
        return None
    address, undo = shared
    return Gather(mem, layout, rank, address + shm.PREAMBLE_PAGE, undo)


class Watcher:
    """Supervises the direct mode's gates from a thread of its own while any is in flight.

    `host` is the gate's HostHalf (its issued count, ACK, fail); `alive(pid)` says whether a
    process is there (os.kill(pid, 0) by default; tests play it)."""

    def __init__(self, host: Any, gather: Gather, timeout: float, alive: Callable[[int], bool] | None = None,
                 nap_s: float = 0.001):
        self._host = host
        self._gather = gather
        self._timeout = timeout
        self._alive = alive or _process_alive
        self._nap_s = nap_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastcoll-gate-watch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A gate was issued: watch until every issued gate has passed."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            try:
                self._watch()
            except Exception as e:  # the watch must never die silently: fail the gate instead
                self._host.fail(e)

    def _watch(self) -> None:
        host, g = self._host, self._gather
        arrived_at: float | None = None  # when this rank reached the gate that waits
        waiting_for = None
        passed = None  # the last gate passed (ACK) at the previous look
        while not self._stop.is_set() and host.pending():
            done = host.completed()
            host.check()  # a failure the GPU recorded (spin bound, mismatch)
            if done != passed:
                # A gate passed since the last look: every rank arrived at it, so none is gone or
                # late yet. The checks below cost two system calls a peer, each a handover of the
                # GIL with the thread building the next token; they wait for a look that finds
                # the gates stopped (a dead peer stops them at once).
                passed, waiting_for = done, None
                time.sleep(self._nap_s)
                continue
            next_seq = seq_add(done, 1)
            for p in range(g.layout.ranks):
                pid = g.pid(p)
                if p != g.rank and pid and not self._alive(pid):
                    host.fail(PeerLostError(f"rank {p} (process {pid} on this host) exited while gate "
                                            f"{next_seq} waited for it"))
                    return
            if seq_diff(g.flag(g.rank), next_seq) >= 0:  # this rank's GPU is there: peers must come
                if waiting_for != next_seq:
                    waiting_for, arrived_at = next_seq, time.monotonic()
                elif time.monotonic() - arrived_at > self._timeout:
                    late = [p for p in range(g.layout.ranks) if seq_diff(g.flag(p), next_seq) < 0]
                    host.fail(CollectiveTimeoutError(
                        f"gated all_reduce {next_seq}: rank(s) {late} did not arrive within "
                        f"{self._timeout:g} s (FASTCOLL_TIMEOUT={self._timeout:g}; raise it to wait longer)"))
                    return
            time.sleep(self._nap_s)


def _process_alive(pid: int) -> bool:
    """Whether process `pid` (on this host) still runs. A process killed but not yet reaped by
    its parent (a zombie) still answers kill(pid, 0): on Linux its state says it is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]  # after "pid (name)"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(pid, 0) is all there is
    return state not in ("Z", "X")
