"""The gate's device side through MLX custom kernels, for either language (Metal or CUDA).

One persistent, evaluated uint32 array is the control page; the host reaches it through its
zero-copy numpy view (on CUDA, taking that view moves MLX's buffer into managed memory for good).
Each gate adds to the caller's lazy graph:

    fc_arrival (one threadgroup)      x -> send mailbox, ARRIVAL = seq
    fc_release (one thread)           spin on RELEASE, then receive mailbox -> out
  or, for payloads above `spin_copy_max_bytes`:
    fc_release_wait (one thread)      spin on RELEASE
    fc_deliver (one threadgroup)      receive mailbox -> out

The spin is always one thread in one threadgroup. Where the receive mailbox lives in host memory
(CUDA, advised towards the host) one thread copying it out pays a bus round trip per batch of
loads, so larger payloads are copied by a whole threadgroup in a kernel of their own; the cut-off
was chosen by measurement (bench/results/gate_h200.md). Every gate's arrival kernel takes the
previous gate's last output as an input, so gates run on the GPU in issue order and never
overlap on the mailboxes.
"""

from __future__ import annotations

import logging
import threading
import time
from types import ModuleType
from typing import Any, Callable

import numpy as np

from fastcoll.gate import kernels
from fastcoll.gate import layout as L
from fastcoll.gate.page import ControlPage

log = logging.getLogger("fastcoll.gate")

ARRIVAL_THREADS = 256
DELIVER_THREADS = 256
# Payloads up to this many bytes are copied out by the spinning thread itself (no extra kernel).
SPIN_COPY_MAX_BYTES = 256

Advise = Callable[[np.ndarray], "Callable[[], None] | None"]


class MlxBackend:
    """A DeviceBackend (fastcoll/gate/device.py) whose kernels are the shared body in `lang`
    (the fastcoll.metal or fastcoll.cuda package)."""

    def __init__(
        self,
        lang: ModuleType,
        layout: L.ControlLayout,
        advise: Advise | None = None,
        spin_copy_max_bytes: int = SPIN_COPY_MAX_BYTES,
    ):
        import mlx.core as mx

        self._mx = mx
        self._lang = lang
        self.name: str = lang.LANGUAGE
        self.layout = layout
        self.spin_copy_max_bytes = spin_copy_max_bytes
        # Made from host memory, so MLX allocates it where the host can reach it (managed memory on
        # CUDA); the numpy view is the host's window on it for the life of the gate.
        self._ctrl = mx.array(np.zeros(layout.total_words, dtype=np.uint32))
        mx.eval(self._ctrl)
        self.page: np.ndarray = np.array(self._ctrl, copy=False).view(np.uint8).reshape(-1)
        if not self.page.flags.writeable:
            raise RuntimeError("MLX gave a read-only view of the control page")
        self._undo_advice = advise(self.page) if advise is not None else None
        self._first = mx.zeros((1,), dtype=mx.uint32)
        mx.eval(self._first)
        self._kernels: dict[str, Any] = {}

    # ----- DeviceBackend -----

    def initial_token(self) -> Any:
        return self._first

    def launch(self, x: Any, seq: int, nbytes: int, max_iters: int, after: Any) -> tuple[Any, Any]:
        mx = self._mx
        flat = x if x.ndim == 1 else x.reshape(-1)  # MLX passes a 0-d input by reference
        params = mx.array([seq, nbytes, max_iters, self.layout.recv_offset], dtype=mx.uint32)
        template = [("T", x.dtype)]
        space = self._lang.x_space(flat.size)
        (arrived,) = self._kernel("arrival", space)(
            inputs=[flat, self._ctrl, params, after], template=template,
            grid=(ARRIVAL_THREADS, 1, 1), threadgroup=(ARRIVAL_THREADS, 1, 1),
            output_shapes=[(1,)], output_dtypes=[mx.uint32],
        )
        if nbytes <= self.spin_copy_max_bytes:
            out, token = self._kernel("release")(
                inputs=[self._ctrl, params, arrived], template=template,
                grid=(1, 1, 1), threadgroup=(1, 1, 1),
                output_shapes=[flat.shape, (1,)], output_dtypes=[x.dtype, mx.uint32],
            )
        else:
            (done,) = self._kernel("release_wait")(
                inputs=[self._ctrl, params, arrived],
                grid=(1, 1, 1), threadgroup=(1, 1, 1),
                output_shapes=[(1,)], output_dtypes=[mx.uint32],
            )
            out, token = self._kernel("deliver")(
                inputs=[self._ctrl, params, done], template=template,
                grid=(DELIVER_THREADS, 1, 1), threadgroup=(DELIVER_THREADS, 1, 1),
                output_shapes=[flat.shape, (1,)], output_dtypes=[x.dtype, mx.uint32],
            )
        return (out if x.ndim == 1 else out.reshape(x.shape)), token

    def wait(self, token: Any) -> None:
        self._mx.eval(token)

    def close(self) -> None:
        if self._undo_advice is not None:
            undo, self._undo_advice = self._undo_advice, None
            undo()

    # ----- diagnostics -----

    def mark(self, seq: int, dep: Any) -> Any:
        """A one-thread kernel that stores seq into MARK once `dep` is ready (for timing)."""
        mx = self._mx
        params = mx.array([seq, 0, 0, 0], dtype=mx.uint32)
        (marked,) = self._kernel("mark")(
            inputs=[self._ctrl, params, dep.reshape(-1)], template=[("T", dep.dtype)],
            grid=(1, 1, 1), threadgroup=(1, 1, 1),
            output_shapes=[(1,)], output_dtypes=[mx.uint32],
        )
        return marked

    def _kernel(self, which: str, space: str = "") -> Any:
        key = f"{which}:{space}"
        k = self._kernels.get(key)
        if k is None:
            lang = self._lang
            inputs, outputs, source = kernels.source(lang, which)
            name = f"fastcoll_gate_{which}" + (f"_{space}" if space else "")
            k = lang.make_kernel(name, inputs, outputs, source, kernels.header(lang, space or lang.X_SPACES[0]))
            self._kernels[key] = k
        return k


def verified(backend: MlxBackend, name: str, run_self_test: bool = True) -> MlxBackend | None:
    """`backend` if it passes self_test() (or the test is skipped), else None, closed and logged,
    so that the caller falls back to the host path. Shared by the Metal and CUDA openers."""
    if run_self_test:
        problem = self_test(backend)
        if problem is not None:
            backend.close()
            log.warning("the %s fence gate failed its self-test, so the host path is used: %s", name, problem)
            return None
    return backend


def self_test(backend: MlxBackend, timeout_s: float = 30.0, max_iters: int = 20_000_000) -> str | None:
    """Run a few gates end to end against a helper thread; None if all went right, else why not.

    Covers both address spaces of x (Metal), both copy-out paths and a dtype of each width, and
    proves that mx.eval lets another Python thread run while the GPU spins (the service thread
    must). A GPU that never observes the release ends its spin at `max_iters` with a timeout
    status, which fails the test instead of hanging it.
    """
    mx = backend._mx
    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    big = backend.spin_copy_max_bytes // 4 + 5
    cases = [
        mx.arange(4, dtype=mx.float32),  # < 8 elements: Metal's constant address space
        mx.arange(16, dtype=mx.float32),
        mx.arange(big, dtype=mx.float32),  # copied out by fc_deliver
        mx.arange(9, dtype=mx.int16),
        mx.arange(33, dtype=mx.uint8),
    ]
    mx.eval(cases)
    problems: list[str] = []
    stop = threading.Event()

    def host() -> None:
        for seq, x in enumerate(cases, start=1):
            deadline = time.monotonic() + timeout_s
            while page.load(L.ARRIVAL) != seq:
                if stop.is_set() or time.monotonic() > deadline:
                    problems.append(f"gate {seq}: the GPU's arrival was not seen")
                    page.store(L.STATUS, L.ERROR)
                    page.store(L.RELEASE, len(cases))
                    return
            nbytes = x.nbytes
            page.fence()
            send = page.send[:nbytes].copy()
            page.recv[:nbytes] = send[::-1]  # bytes reversed: the GPU must copy the receive side
            page.fence()
            page.store(L.STATUS, L.OK)
            page.fence()
            page.store(L.RELEASE, seq)

    outs = []
    token = backend.initial_token()
    for seq, x in enumerate(cases, start=1):
        out, token = backend.launch(x, seq, x.nbytes, max_iters, token)
        outs.append(out)
    helper = threading.Thread(target=host, name="fastcoll-gate-selftest", daemon=True)
    helper.start()
    try:
        mx.eval(outs + [token])
    except Exception as e:  # a kernel that does not compile or launch
        stop.set()
        helper.join(5.0)
        return f"the gate kernels failed: {e}"
    stop.set()
    helper.join(timeout_s)
    if problems:
        return "; ".join(problems)
    if page.load(L.SPIN_FAILED):
        return "the GPU's release spin never observed the host's store (coherence)"
    for seq, (x, out) in enumerate(zip(cases, outs), start=1):
        want = np.array(x).reshape(-1).view(np.uint8)[::-1]
        got = np.array(out).reshape(-1).view(np.uint8)
        if not np.array_equal(want, got):
            return f"gate {seq}: wrong bytes came back ({x.dtype}, {x.size} elements)"
    if page.load(L.ACK) != len(cases):
        return "the release kernel's acknowledgement is missing"
    return None
