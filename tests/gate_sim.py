"""A device played by a thread, and a serial service thread: the gate's host half without a GPU.
Test support, which the package does not ship.

SimDevice runs each launched gate on one "stream" thread, in order, doing what the kernels do
(fastcoll/gate/device/fc_gate.inc and gate.h): the arrival publish copies x into the send mailbox and
stores ARRIVAL (the previous token's seq plus one); the release spin polls RELEASE with the same
iteration bound and the same wrap-aware compare, unless the previous gate failed; then the receive
mailbox's slots (every rank's x) are reduced in rank order into the result (or all-ones bytes on
an error status), and SPIN_ITERS, ACK and, on hitting the bound, SPIN_FAILED are written. Unlike a
GPU it yields the GIL on every spin iteration: a real GPU never competes with Python for it. Used
by the tests.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np

from fastcoll import dtypes
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.accept import dtype_name
from fastcoll.gate.protocol.seq import seq_add, seq_diff


def raw_bytes(x: Any) -> np.ndarray:
    """The bytes of an mx.array or numpy array, flat uint8 (bfloat16 through its uint16 bits)."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    import mlx.core as mx

    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.ascontiguousarray(np.array(x)).reshape(-1).view(np.uint8)


class SimResult:
    """One simulated gate's result and token: raw bytes and the status, once it ran."""

    def __init__(self, seq: int):
        self.seq = seq
        self._done = threading.Event()
        self.data: np.ndarray | None = None
        self.status: int | None = None
        self.iters: int | None = None

    def finish(self, data: np.ndarray, status: int, iters: int) -> None:
        self.data, self.status, self.iters = data, status, iters
        self._done.set()

    def wait(self, timeout: float | None = None) -> "SimResult":
        if not self._done.wait(timeout):
            raise TimeoutError(f"simulated gate {self.seq} did not finish in {timeout}s")
        return self

    def done(self) -> bool:
        return self._done.is_set()

    def value(self, dtype: np.dtype) -> np.ndarray:
        """The result viewed as `dtype` (the host form: uint16 bits for bfloat16)."""
        assert self.data is not None
        return self.data.view(dtype)


class SimDevice:
    """A DeviceBackend whose 'GPU' is a thread running launched gates in order."""

    name = "sim"

    def __init__(self, layout: L.ControlLayout, start: bool = True):
        self.layout = layout
        self.page = np.zeros(layout.total_bytes, dtype=np.uint8)
        self._words = memoryview(self.page).cast("I")
        self._gather: np.ndarray | None = None  # the direct mode's segment, as bytes
        self._glayout: L.GatherLayout | None = None
        self._rank = 0
        self._queue: queue.Queue = queue.Queue()
        self._held = threading.Event()  # set: the stream is paused (a "GPU" busy elsewhere)
        self._thread = threading.Thread(target=self._run, name="fastcoll-sim-gpu", daemon=True)
        if start:
            self._thread.start()

    def initial_token(self, seq: int) -> SimResult:
        token = SimResult(seq)
        token.finish(np.zeros(0, np.uint8), L.OK, 0)
        return token

    def launch(self, x: Any, op: str, max_iters: int, after: SimResult) -> tuple[SimResult, SimResult]:
        data = raw_bytes(x).copy()
        result = SimResult(seq_add(after.seq, 1))
        sig = L.signature(op, dtype_name(x.dtype), tuple(x.shape))
        self._queue.put((data, dtype_name(x.dtype), op, max_iters, after, result, sig))
        return result, result

    def wait(self, token: SimResult) -> None:
        token.wait()

    def share_host_memory(self, ptr: int, nbytes: int):
        """A thread needs no registration: the address is the mapping's own."""
        return ptr, lambda: None

    def use_gather(self, address: int, gather: L.GatherLayout, rank: int) -> None:
        """The direct mode, over the segment at `address` (this process's mapping)."""
        self._gather = np.ctypeslib.as_array((ctypes.c_uint8 * gather.total_bytes).from_address(address))
        self._glayout, self._rank = gather, rank

    def hold(self) -> None:
        """Pause the stream before its next gate (as if earlier kernels were still running)."""
        self._held.set()

    def resume(self) -> None:
        self._held.clear()

    def close(self) -> None:
        self._queue.put(None)

    # The "kernel", in fc_gate's order: the arrival, then the spin and the reduction.

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            while self._held.is_set():
                time.sleep(0.0005)
            data, name, op, max_iters, after, result, sig = job
            self._arrival(data, result.seq, sig)
            self._release(result.seq, after.status, name, op, data.size, max_iters, result, sig)

    def _arrival(self, data: np.ndarray, seq: int, sig: int) -> None:
        if self._gather is None:
            off = self.layout.send_offset
            self.page[off : off + data.size] = data
        else:
            off = self._set(seq) + self._rank * data.size
            self._gather[off : off + data.size] = data
            g = self._gather_words()
            line = self._glayout.line(self._rank)
            g[line + L.G_SIG + (seq & 1)] = sig
            g[line + L.G_FLAG] = seq
        self._words[L.ARRIVAL] = seq

    def _set(self, seq: int) -> int:
        return self._glayout.header_bytes + (seq & 1) * self._glayout.set_bytes

    def _gather_words(self) -> memoryview:
        return memoryview(self._gather).cast("I")

    def _release(self, seq: int, prev: int, name: str, op: str, nbytes: int, max_iters: int,
                 result: SimResult, sig: int) -> None:
        w = self._words
        status = prev  # a failed predecessor: do not wait
        iters = 0
        if status == L.OK and self._gather is None:
            while seq_diff(w[L.RELEASE], seq) < 0:
                iters += 1
                if iters >= max_iters:
                    status = L.TIMEOUT
                    self._record(seq, status, self._rank)
                    break
                time.sleep(0)
        elif status == L.OK:  # the direct mode: every rank's FLAG, or the host's abort
            g, lay, p = self._gather_words(), self._glayout, 0
            while p < lay.ranks:
                if seq_diff(g[lay.line(p) + L.G_FLAG], seq) >= 0:
                    p += 1
                elif seq_diff(w[L.RELEASE], seq) >= 0:
                    status = w[L.STATUS] or L.ERROR  # the host gave up, and says why
                    break
                else:
                    iters += 1
                    if iters >= max_iters:
                        status = L.TIMEOUT
                        self._record(seq, status, p)
                        break
                    time.sleep(0)
            if status == L.OK:
                for p in range(lay.ranks):
                    if g[lay.line(p) + L.G_SIG + (seq & 1)] != sig:
                        status = L.MISMATCH
                        self._record(seq, status, p)
                        break
        out = np.full(nbytes, 0xFF, dtype=np.uint8)
        if status == L.OK:
            # As fc_gate: the slots are reduced while thread 0 reads the host's STATUS, and a gate
            # the host failed is poisoned after all.
            reduced = self._reduce(name, op, nbytes, seq)
            status = w[L.STATUS]
            if status == L.OK:
                out = reduced
        w[L.SPIN_ITERS] = iters
        w[L.ACK] = seq
        result.finish(out, status, iters)

    def _record(self, seq: int, status: int, peer: int) -> None:
        w = self._words
        w[L.SPIN_FAILED_SEQ] = seq
        w[L.SPIN_FAILED_PEER] = peer
        w[L.SPIN_FAILED] = status

    def _reduce(self, name: str, op: str, nbytes: int, seq: int) -> np.ndarray:
        """The slots reduced in rank order, as fc_reduce does: rounded to the dtype after every
        rank (the host path's reducers do the same)."""
        n = self.layout.ranks
        if self._gather is None:
            src, off = self.page, self.layout.recv_offset
        else:
            src, off = self._gather, self._set(seq)
        host = dtypes.host_dtype(name)
        slots = src[off : off + n * nbytes].view(host).reshape(n, -1)
        combine = dtypes.reducer(name, op)
        acc = slots[0].copy()
        for p in range(1, n):
            combine(acc, slots[p], acc)
        if op == "mean":
            dtypes.finish_mean(name, acc, n)
        return acc.view(np.uint8)


class SerialService:
    """A minimal service thread: runs submitted functions one at a time, in submission order."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fastcoll-sim-service", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future:
        f: Future = Future()
        self._queue.put((fn, f))
        return f

    def close(self, timeout: float | None = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, f = item
            try:
                f.set_result(fn())
            except BaseException as e:  # the caller inspects it through the future
                f.set_exception(e)


def loop_rate(seconds: float) -> float:
    """Iterations per second of a plain Python loop on the calling thread over `seconds`: how
    much of the interpreter a background poller (the gate's arrival poll) leaves the caller."""
    n, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(1000):
            n += 1
        if time.perf_counter() >= end:
            return n / (time.perf_counter() - t0)
