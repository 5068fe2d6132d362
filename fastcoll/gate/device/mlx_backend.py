"""The gate's device side through MLX custom kernels, for either language (Metal or CUDA): a
DeviceBackend (fastcoll/gate/host/device_backend.py) for the host half, and its self-test.

One persistent, evaluated uint32 array is the control page; the host reaches it through its
zero-copy numpy view (on CUDA, taking that view moves MLX's buffer into managed memory for good).
Each gate adds one kernel (fastcoll/gate/device/kernels.py) to the caller's lazy graph:

    fc_gate (one threadgroup of GATE_THREADS)   x -> this rank's slot, ARRIVAL = seq; thread 0
                                                alone spins; every rank's slot -> reduced -> out

Each gate's kernel takes the previous gate's token as an input, so gates run on the GPU strictly
in issue order, never overlap on the mailboxes, and count their sequence numbers alike with the
host.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.accept import dtype_name
from fastcoll.gate.protocol.page import ControlPage
from fastcoll.gate.device import kernels
from fastcoll.gpu.language import Language

# fc_gate's threadgroup: one thread spins, all of them copy x in and reduce (at 8 KiB of bf16,
# 16 elements each).
GATE_THREADS = 256

Advise = Callable[[np.ndarray], "Callable[[], None] | None"]


class MlxBackend:
    """A DeviceBackend (fastcoll/gate/host/device_backend.py) whose kernels are the shared body in `lang`
    (fastcoll.metal.LANGUAGE or fastcoll.cuda.LANGUAGE)."""

    def __init__(self, lang: Language, layout: L.ControlLayout, advise: Advise | None = None):
        import mlx.core as mx

        self._mx = mx
        self._lang = lang
        self.name: str = lang.name
        self.layout = layout
        # Made from host memory, so MLX allocates it where the host can reach it (managed memory on
        # CUDA); the numpy view is the host's window on it for the life of the gate.
        self._ctrl = mx.array(np.zeros(layout.total_words, dtype=np.uint32))
        mx.eval(self._ctrl)
        self.page: np.ndarray = np.array(self._ctrl, copy=False).view(np.uint8).reshape(-1)
        if not self.page.flags.writeable:
            raise RuntimeError("MLX gave a read-only view of the control page")
        self._undo_advice = advise(self.page) if advise is not None else None
        self._kernels: dict[str, Any] = {}
        self._calls: dict[tuple, tuple] = {}  # (dtype, shape, op, max_iters) -> the launch's arguments
        self._rank = 0
        self._gather: L.GatherLayout | None = None  # the direct mode's segment, once it is used
        self._gather_address = 0

    def share_host_memory(self, ptr: int, nbytes: int) -> Any:
        """The backend language's share_host_memory (None where it has none)."""
        return self._lang.share_host_memory(ptr, nbytes)

    def use_gather(self, address: int, gather: L.GatherLayout, rank: int) -> None:
        """From now on build the direct mode's kernels (fastcoll/gate/host/direct_mode.py): as rank
        `rank`, over the gather segment whose GPU-visible address is `address` (compiled into
        them)."""
        self._gather, self._rank, self._gather_address = gather, rank, address
        self._kernels.clear()
        self._calls.clear()

    # ----- DeviceBackend -----

    def initial_token(self, seq: int) -> Any:
        """A token as if gate `seq` had just completed."""
        mx = self._mx
        token = mx.array([seq, L.OK, 0, 0], dtype=mx.uint32)
        mx.eval(token)
        return token

    def launch(self, x: Any, op: str, max_iters: int, after: Any) -> tuple[Any, Any]:
        # The kernels see x and the result as flat rows of x's size (MLX makes both row-contiguous),
        # so both keep x's shape: no reshape nodes in the graph. A 0-d x is the exception: MLX
        # passes a 0-d input by reference.
        flat = x if x.ndim else x.reshape(1)
        key = (x.dtype, x.shape, op, max_iters)
        args = self._calls.get(key)
        if args is None:
            sig = L.signature(op, dtype_name(x.dtype), tuple(x.shape))
            args = self._calls[key] = self._arguments(x.dtype, flat.shape, flat.size, op, max_iters, sig)
        kernel, kwargs = args
        out, token = kernel(inputs=[flat, self._ctrl, after], **kwargs)
        return (out if x.ndim else out.reshape(())), token

    def _arguments(self, dtype: Any, shape: tuple, count: int, op: str, max_iters: int, sig: int) -> tuple:
        """The kernel of one kind of gate (its constants compiled in) and the keyword arguments
        of its calls, made once."""
        mx = self._mx
        name = dtype_name(dtype)
        kind = kernels.constants(self._lang, name, count, L.OPS[op], max_iters, sig)
        return self._kernel("gate", self._lang.x_space(count), kind, f"{name}_{count}_{op}_{sig:x}_{max_iters}"), {
            "output_shapes": [tuple(shape), (L.TOKEN_WORDS,)], "output_dtypes": [dtype, mx.uint32],
            "grid": (GATE_THREADS, 1, 1), "threadgroup": (GATE_THREADS, 1, 1)}

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

    def _kernel(self, which: str, space: str = "", kind: str = "", kind_name: str = "") -> Any:
        """Kernel `which` for x in address space `space`, with the constants `kind` (named
        `kind_name` in the kernel's name: MLX's Metal backend finds a kernel by its name)."""
        key = f"{which}:{space}:{kind_name}"
        k = self._kernels.get(key)
        if k is None:
            lang, kernel = self._lang, kernels.KERNELS[which]
            name = "_".join(part for part in ("fastcoll_gate", which, kind_name, space,
                                              "direct" if self._gather else "") if part)
            header = kernels.header(lang, which, space or lang.x_spaces[0], self.layout, self._rank,
                                    self._gather, self._gather_address, kind)
            k = self._kernels[key] = lang.make_kernel(
                name, list(kernel.inputs), list(kernel.outputs), kernels.minified(kernels.source(which)),
                kernels.minified(header))
        return k


def self_test(backend: MlxBackend, timeout_s: float = 30.0, max_iters: int = 20_000_000,
              compile_s: float = 300.0) -> str | None:
    """Run a few gates end to end against a helper thread; None if all went right, else why not.

    Covers both address spaces of x (Metal) and each gated dtype, and proves that mx.eval lets
    another Python thread run while the GPU spins (the service thread must). The helper fills every rank's slot of the receive mailbox with x + rank, so the sums
    show that the GPU reduced the receive side, not its own send mailbox. A GPU that never
    observes the release ends its spin at `max_iters` with a timeout status, which fails the
    test instead of hanging it.

    Every case is a kernel that MLX compiles before the first one runs (about 2 s each on
    CUDA, longer with ranks compiling at once), so the first arrival may take `compile_s`; each
    later one `timeout_s`. Nothing waits that long unless the GPU runs and never arrives: a
    kernel that fails to build ends the evaluation, and with it the helper.
    """
    mx = backend._mx
    page = ControlPage(backend.page, backend.layout)
    page.reset(1)
    n = backend.layout.ranks
    cases = [(5, "float32"), (9, "float16"), (130, "bfloat16")]  # each gated dtype
    if len(backend._lang.x_spaces) > 1:
        cases[:0] = [(4, "float32")]  # Metal: an x small enough for MLX's constant address space
    # Small integers: exact in every dtype, whatever the order of the sum.
    values = [np.arange(size, dtype=np.float32) % 16 for size, _ in cases]
    xs = [mx.array(v).astype(getattr(mx, name)) for v, (_, name) in zip(values, cases)]
    xs[-1] = xs[-1].reshape(1, 1, -1)  # a decode step's (batch, tokens, hidden) row keeps its shape
    mx.eval(xs)
    slots = [b"".join(_host_bytes(v + p, name) for p in range(n)) for v, (_, name) in zip(values, cases)]
    problems: list[str] = []
    stop = threading.Event()
    outs = []
    token = backend.initial_token(0)
    for x in xs:
        out, token = backend.launch(x, "sum", max_iters, token)
        outs.append(out)
    helper = threading.Thread(target=_play_host, args=(page, slots, compile_s, timeout_s, stop, problems),
                              name="fastcoll-gate-selftest", daemon=True)
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
    return _self_test_verdict(mx, page, values, outs, cases, xs, n)


def _host_bytes(v: np.ndarray, name: str) -> bytes:
    """A rank's x as the host holds it (bfloat16 as its bits)."""
    from fastcoll import dtypes

    if name == "bfloat16":
        return dtypes.float32_to_bf16(v).tobytes()
    return v.astype(name).tobytes()


def _play_host(page: ControlPage, slots: list[bytes], compile_s: float, timeout_s: float,
               stop: threading.Event, problems: list[str]) -> None:
    """The self-test's host half, on a thread of its own: numpy and the page only, no MLX call
    while the main thread evaluates."""
    for seq, data in enumerate(slots, start=1):
        deadline = time.monotonic() + (compile_s if seq == 1 else timeout_s)
        while page.load(L.ARRIVAL) != seq:
            if stop.is_set() or time.monotonic() > deadline:
                problems.append(f"gate {seq}: the GPU's arrival was not seen")
                page.store(L.STATUS, L.ERROR)
                page.store(L.RELEASE, len(slots))
                return
        page.fence()
        page.recv[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        page.fence()
        page.store(L.STATUS, L.OK)
        page.fence()
        page.store(L.RELEASE, seq)


def _self_test_verdict(mx: Any, page: ControlPage, values: list, outs: list, cases: list, xs: list,
                       n: int) -> str | None:
    """What went wrong in the self-test's gates once they ran, or None."""
    if page.load(L.SPIN_FAILED):
        return "the GPU's release spin never observed the host's store (coherence)"
    for seq, (v, out, (size, name)) in enumerate(zip(values, outs, cases), start=1):
        want = sum(v + p for p in range(n))
        got = np.array(out.astype(mx.float32))
        if got.shape != tuple(xs[seq - 1].shape) or not np.array_equal(want, got.reshape(-1)):
            return f"gate {seq}: wrong values came back ({name}, {size} elements)"
    if page.load(L.ACK) != len(cases):
        return "the spinning thread's acknowledgement (ACK) is missing"
    return None
