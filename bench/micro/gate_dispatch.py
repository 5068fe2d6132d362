"""What a gated all-reduce costs the host in Python above its kernels, on any machine.

A 2-rank Group over an in-process transport whose fence gate runs in the direct mode over a stub
device: its launch returns at once, as if the kernel call cost nothing. What is left is
fastcoll's own dispatch, layer by layer, for a decode step's (1, 1, 4096) bf16 row:

    the stub's launch                    (the floor: a Python call)
    Gate.launch                          (the issue count: what the core calls, accepts asked)
    Gate.all_reduce                      (the same with its own checks, for other callers)
    fastcoll.all_reduce                  (the public call: the group, the checks, the dispatch)
    mx.distributed.all_sum               (mlx_compat: the MLX API, mx.custom_function, eager)

and, for scale, an identity mx.custom_function without and with a vjp (mlx_compat's functions
and mlx.nn's sum_gradients have one). On an H200 host the gate's kernel call costs 4.6-8.8 us on
top (bench/NOTES.md 38).

    python bench/micro/gate_dispatch.py [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx  # noqa: E402

import fastcoll  # noqa: E402
from fastcoll import mlx_compat  # noqa: E402
from fastcoll.config import Config  # noqa: E402
from fastcoll.gate import Gate  # noqa: E402
from fastcoll.gate.layout import ControlLayout  # noqa: E402
from fastcoll.engine.python import PythonEngine  # noqa: E402
from fastcoll.group import Group  # noqa: E402

from bench.micro.python_cost import Echo, best  # noqa: E402


class StubDevice:
    """A DeviceBackend (fastcoll/gate/device.py) whose gates cost nothing: launch returns x."""

    name = "stub"

    def __init__(self, layout: ControlLayout):
        self.layout = layout
        self.page = np.zeros(layout.total_bytes, dtype=np.uint8)

    def initial_token(self, seq: int):
        return None

    def launch(self, x, op, max_iters, after):
        return x, after

    def wait(self, token) -> None:
        pass

    def close(self) -> None:
        pass


def direct_gate(config: Config) -> Gate:
    """A Gate in the direct mode with nothing behind it: no segment, a watcher that does nothing."""
    gate = Gate(StubDevice(ControlLayout(config.gate_max_bytes, config.world_size)), config)
    gate._gather = types.SimpleNamespace(close=lambda: None)
    gate._host.direct = True
    gate._watcher = types.SimpleNamespace(wake=lambda: None, stop=lambda: None)
    return gate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", action="store_true", help="also cProfile mx.distributed.all_sum")
    args = ap.parse_args()
    config = Config(rank=0, world_size=2, fast_sync=True)
    gate = direct_gate(config)
    g = Group(config, PythonEngine(Echo()), gate=gate)
    mlx_compat.install()
    mg = mlx_compat.api.Group(g)
    x = mx.zeros((1, 1, 4096), dtype=mx.bfloat16)
    mx.eval(x)
    device = gate._backend

    @mx.custom_function
    def plain(y):
        return y

    @mx.custom_function
    def with_vjp(y):
        return y

    @with_vjp.vjp
    def with_vjp(primals, cotangent, output):
        return cotangent

    rows = [
        ("the stub's launch", lambda: device.launch(x, "sum", 1, None)),
        ("Gate.launch", lambda: gate.launch(x, "sum")),
        ("Gate.all_reduce", lambda: gate.all_reduce(x, "sum")),
        ("fastcoll.all_reduce", lambda: fastcoll.all_reduce(x, group=g)),
        ("mx.distributed.all_sum", lambda: mx.distributed.all_sum(x, group=mg)),
        ("an identity mx.custom_function", lambda: plain(x)),
        ("the same with a vjp", lambda: with_vjp(x)),
    ]
    for name, fn in rows:
        print(f"{name}: {best(fn, 20000):.2f} us per call")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20000):
            mx.distributed.all_sum(x, group=mg)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    gate.close()
    mlx_compat.uninstall()


if __name__ == "__main__":
    main()
