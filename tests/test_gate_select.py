"""Gate selection (every rank decides alike), the fallback without a GPU, and wrap-aware compares."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from fastcoll.config import Config
from fastcoll.cuda import LANGUAGE as CUDA
from fastcoll.gate import Gate
from fastcoll.gate.protocol.layout import ControlLayout
from fastcoll.gate.host.probe import probe
from fastcoll.gate.protocol.accept import gate_accepts
from fastcoll.gate.protocol.seq import seq_add, seq_diff, seq_reached
from fastcoll.gpu.language import Language

from gate_sim import SimDevice

SHAPES = [(), (1,), (7,), (8,), (4096,), (2, 4096), (16384,), (16385,), (64, 64, 4), (0,)]
DTYPES = [mx.bool_, mx.uint8, mx.int16, mx.uint32, mx.int64, mx.float16, mx.bfloat16, mx.float32, mx.complex64]
OPS = ["sum", "prod", "min", "max", "mean", "median"]


def gate(max_bytes: int) -> Gate:
    config = Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=max_bytes)
    return Gate(SimDevice(ControlLayout(max_bytes), start=False), config)


def test_ranks_decide_alike():
    # Two ranks' gates, made apart from the same config, must agree on every call.
    a, b = gate(64 * 1024), gate(64 * 1024)
    decided = set()
    for shape, dtype, op in itertools.product(SHAPES, DTYPES, OPS):
        x_a = mx.zeros(shape, dtype=dtype)
        x_b = mx.ones(shape, dtype=dtype)  # different values, same shape and dtype
        assert a.accepts(x_a, op) == b.accepts(x_b, op), (shape, dtype, op)
        decided.add(a.accepts(x_a, op))
    assert decided == {True, False}


def test_threshold_and_exclusions():
    g = gate(64 * 1024)
    assert g.accepts(mx.zeros((16384,), mx.float32), "sum")  # exactly gate_max_bytes
    assert not g.accepts(mx.zeros((16385,), mx.float32), "sum")  # one element over
    assert g.accepts(mx.zeros((), mx.float32), "max")  # a scalar
    assert not g.accepts(mx.zeros((0,), mx.float32), "sum")  # nothing to gate
    assert not g.accepts(np.zeros(8, np.float32), "sum")  # numpy keeps the host path
    assert not g.accepts(mx.zeros((8,), mx.bool_), "sum")  # no reduction of bool
    assert not g.accepts(mx.zeros((8,), mx.int32), "mean")  # the host path raises for it
    assert not g.accepts(mx.zeros((8,), mx.complex64), "sum")
    assert not g.accepts(mx.zeros((8,), mx.float32), "median")
    assert g.accepts(mx.zeros((8,), mx.bfloat16), "mean")


def test_the_host_mode_leaves_small_all_reduces_to_the_host_path_and_the_direct_mode_takes_them():
    import types

    config = Config(fast_sync=True, gate_max_bytes=8192)  # the default gate_host_min_bytes
    g = Gate(SimDevice(ControlLayout(8192), start=False), config)
    small = mx.zeros((config.gate_host_min_bytes // 4 - 1,), mx.float32)
    enough = mx.zeros((config.gate_host_min_bytes // 4,), mx.float32)
    assert not g.accepts(small, "sum") and g.accepts(enough, "sum")
    with pytest.raises(ValueError, match="does not take"):
        g.all_reduce(small, "sum")
    # The direct mode (every rank of one host, decided by all of them at once) takes every size.
    g._backend.use_gather = lambda *a: None
    g.use_direct(types.SimpleNamespace(address=0, layout=None, rank=0, close=lambda: None),
                 alive=lambda pid: True)
    try:
        assert g.accepts(small, "sum") and g.accepts(enough, "sum")
    finally:
        g._watcher.stop()


def test_rule_reads_only_shape_dtype_op_and_threshold():
    assert gate_accepts((4096,), "bfloat16", "sum", 8192)
    assert not gate_accepts((4097,), "bfloat16", "sum", 8192)
    assert gate_accepts((2, 2048), "bfloat16", "sum", 8192)
    assert not gate_accepts((511,), "bfloat16", "sum", 8192, min_bytes=1024)
    assert gate_accepts((512,), "bfloat16", "sum", 8192, min_bytes=1024)


def test_probe_falls_back_without_a_gpu():
    # This machine has no Metal or CUDA GPU: probe must say None, not raise.
    if mx.metal.is_available() or (hasattr(mx, "cuda") and mx.cuda.is_available()):
        pytest.skip("a GPU is present here; tests/test_gate_gpu.py covers it")
    assert probe(Config(fast_sync=True, gate_host_min_bytes=1)) is None


class _SilentGpu(Language):
    """A GPU language that says it is available but whose kernels never run (outputs of zeros):
    the gate's self-test must fail, or, with `broken`, building a kernel raises."""

    def __init__(self, broken: bool = False):
        super().__init__(name="silent", title="Silent", package="fastcoll.cuda", prelude_file="prelude.h",
                         types=CUDA.types)
        self.broken = broken

    def unavailable(self):
        return None

    def make_kernel(self, name, input_names, output_names, source, header):
        if self.broken:
            raise RuntimeError("no compiler for these kernels")
        return lambda **kw: [mx.zeros(shape, dtype=dt) for shape, dt in zip(kw["output_shapes"], kw["output_dtypes"])]


@pytest.mark.parametrize("broken,why", [
    (False, "failed its self-test, so the host path is used: gate 1: the GPU.s arrival was not seen"),
    (True, "could not be set up.*no compiler"),
])
def test_a_gpu_whose_gate_cannot_run_warns_and_keeps_the_host_path(monkeypatch, broken, why):
    """FASTCOLL_FAST_SYNC=1 asked for the gate: falling back says so even with logging unset."""
    from fastcoll.gate.host import backends

    monkeypatch.setattr(backends, "BACKENDS", {"silent": "(a test's)"})
    monkeypatch.setattr(backends, "language", lambda name: _SilentGpu(broken))
    with pytest.warns(RuntimeWarning, match=f"fastcoll: the silent fence gate {why}"):
        assert probe(Config(fast_sync=True, gate_host_min_bytes=1)) is None


def test_probe_is_off_by_default():
    assert probe(Config()) is None  # FASTCOLL_FAST_SYNC unset: never a gate, whatever the GPU


def test_gate_max_bytes_must_fit_the_mailboxes():
    with pytest.raises(ValueError):
        Gate(SimDevice(ControlLayout(1024), start=False), Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=4096 * 2))
    with pytest.raises(ValueError, match="slots"):  # a receive slot for every rank
        Gate(SimDevice(ControlLayout(4096, 2), start=False), Config(world_size=3, fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=4096))


def test_only_float_dtypes_take_the_gate():
    """The GPU reduces in float: integer all-reduces keep the host path."""
    g = gate(64 * 1024)
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        assert g.accepts(mx.zeros((8,), dtype), "sum")
    for dtype in (mx.int8, mx.int32, mx.uint8, mx.uint32, mx.int64):
        assert not g.accepts(mx.zeros((8,), dtype), "sum")


def test_wrap_aware_compare():
    top = 2**32 - 1
    assert seq_add(top) == 0
    assert seq_add(0, -1) == top
    assert seq_diff(0, top) == 1
    assert seq_diff(top, 0) == -1
    assert seq_reached(2, top)  # 2 comes after 2**32 - 1
    assert not seq_reached(top, 2)
    assert seq_reached(5, 5)
    assert seq_diff(2**31 - 1, 0) == 2**31 - 1
    assert seq_diff(2**31, 0) == -(2**31)
