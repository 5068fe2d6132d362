"""One rank of tests/test_compat.py's gated tests: mx.distributed.all_sum over the fence gate's
host mode, each rank's device played by a thread (tests/gate_sim.py). Outside MLX's
transformations a gated call is the gate's kernel alone; inside mx.grad (and mx.value_and_grad,
mx.vjp, mlx.nn's value_and_grad) it goes through the custom function that gives it MLX's vjp, and
so does every call while mlx_compat is not installed. A grad that MLX made before install()
is not seen: its gated call raises, as a real kernel's missing vjp does.

The simulated kernel's output stands for a real one: an mx.array whose vjp raises NO_VJP.
Prints OK <gates> <custom-function calls>.
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

import fastcoll
from fastcoll import mlx_compat, testhooks
from fastcoll.gate import Gate
from fastcoll.gate.protocol.layout import ControlLayout
from fastcoll.mlx_compat import autograd, patch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from gate_sim import SimDevice  # noqa: E402


NO_VJP = "the simulated gate kernel has no vjp"


@mx.custom_function
def kernel_output(v):
    return v * 1


@kernel_output.vjp
def _(primals, cotangent, output):
    raise ValueError(NO_VJP)


class LazyDevice(SimDevice):
    """The simulated device, whose launch also answers a lazy mx.array as a kernel's output."""

    def __init__(self, layout: ControlLayout):
        super().__init__(layout)
        self.outputs: list[mx.array] = []
        self.results = []

    def launch(self, x, op, max_iters, after):
        result, token = super().launch(x, op, max_iters, after)
        self.results.append(result)
        self.outputs.append(kernel_output(x))
        return self.outputs[-1], token


DEVICES: list[LazyDevice] = []
testhooks.set_gate_factory(lambda c: DEVICES.append(LazyDevice(ControlLayout(c.gate_max_bytes, c.world_size))) or Gate(DEVICES[-1], c))
forwards = [0]
host_reduce = autograd.host_reduce


def counted_host_reduce(*args):
    forwards[0] += 1  # the custom function's forward: _RULES looks host_reduce up at each call
    return host_reduce(*args)


autograd.host_reduce = counted_host_reduce
mlx_compat.install()
group = mx.distributed.init()
r, n = group.rank(), group.size()
dev = DEVICES[0]
x = mx.arange(8, dtype=mx.float32) + r
w = mx.arange(8, dtype=mx.float32) + 10


def check(expect_gates: int, expect_forwards: int, what: str) -> None:
    fastcoll.barrier()  # a host-path call: every gate issued before it has been served
    assert len(dev.results) == expect_gates, (what, len(dev.results), expect_gates)
    assert forwards[0] == expect_forwards, (what, forwards[0], expect_forwards)
    got = dev.results[-1].wait(10).value(np.float32)
    want = sum(np.arange(8, dtype=np.float32) + q for q in range(n))
    assert np.array_equal(got, want), (what, got, want)


# outside any transformation: the kernel's own output, no custom function
y = mx.distributed.all_sum(x, group=group)
assert y is dev.outputs[-1], "an untransformed gated all_sum is the gate's kernel alone"
check(1, 0, "plain")


def loss(v):
    return (mx.distributed.all_sum(v, group=group) * w).sum()


# inside mx.grad: the custom function's vjp passes the cotangent through, so the gradient is w
grad = mx.grad(loss)(x)
assert np.array_equal(np.array(grad), np.array(w)), ("grad", grad)
check(2, 1, "grad")
value, grad = mx.value_and_grad(loss)(x)
assert np.array_equal(np.array(grad), np.array(w)), ("value_and_grad", grad)
check(3, 2, "value_and_grad")
_, (vjp,) = mx.vjp(lambda v: mx.distributed.all_sum(v, group=group), [x], [w])
assert np.array_equal(np.array(vjp), np.array(w)), ("vjp", vjp)
check(4, 3, "vjp")

# mlx.nn's value_and_grad through a sharded layer's all_sum (mlx.nn looks mx.value_and_grad up)
layer = nn.Linear(8, 8)
layer.update({"weight": mx.eye(8), "bias": mx.zeros(8)})
_, grads = nn.value_and_grad(layer, lambda v: (mx.distributed.all_sum(layer(v), group=group) * w).sum())(x)
assert np.array_equal(np.array(grads["bias"]), np.array(w)), ("nn.value_and_grad", grads["bias"])
check(5, 4, "nn.value_and_grad")

# a grad that MLX made before install(): not counted, so the kernel alone, whose vjp raises
patch.uninstall()
early = mx.grad(loss)
patch.install()
try:
    early(x)
    raise AssertionError("a grad made before install() went through")
except ValueError as e:
    assert NO_VJP in str(e), e
check(6, 4, "a grad made before install()")

# not installed: mlx_compat's own all_sum under MLX's grad keeps its custom function
patch.uninstall()
grad = mx.grad(lambda v: (mlx_compat.all_sum(v, group=group) * w).sum())(x)
assert np.array_equal(np.array(grad), np.array(w)), ("not installed", grad)
patch.install()
check(7, 5, "not installed")

# and after them, the plain call is the kernel alone again
y = mx.distributed.all_sum(x, group=group)
assert y is dev.outputs[-1]
check(8, 5, "plain again")
print("OK", len(dev.results), forwards[0], flush=True)
fastcoll.finalize()
