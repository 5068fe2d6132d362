"""The fence gate on a real GPU (Metal or CUDA through MLX); skipped, with the reason, without one.

On the H200: `python3 -m pytest tests/test_gate_gpu.py -s`.
bench/gate_bench.py measures it; this checks that it is right.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastcoll.config import Config
from fastcoll.cuda import LANGUAGE as CUDA
from fastcoll.metal import LANGUAGE as METAL

_reasons = [r for r in (METAL.unavailable(), CUDA.unavailable()) if r]
_GPU = len(_reasons) < 2
if not _GPU:
    print(f"\ntest_gate_gpu: skipped, no GPU backend for the fence gate ({'; '.join(_reasons)})")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _GPU, reason="no GPU: " + "; ".join(_reasons)),
]


@pytest.fixture
def gate():
    from fastcoll.gate.host.probe import probe

    g = probe(Config(fast_sync=True, gate_host_min_bytes=1, gate_max_bytes=64 * 1024, fence_max_iters=50_000_000))
    assert g is not None, "a GPU is present but probe() returned None (see the log)"
    yield g
    g.close()


def test_gated_results_are_exact(gate):
    import mlx.core as mx

    from gate_sim import SerialService

    service = SerialService()
    try:
        def same(send, gathered):  # one rank: its own bytes
            gathered[:] = send

        y = mx.ones((4096,), dtype=mx.bfloat16)
        for i in range(200):
            # Every step depends on the previous gate's result.
            y = gate.all_reduce(y * 1, "sum", same, service.submit)
        mx.eval(y)
        assert np.array_equal(np.array(y.astype(mx.float32)), np.ones(4096, np.float32))

        def doubled(dtype):
            def exchange(send, gathered):  # the one slot holds twice this rank's x
                v = send.view(np.float16 if dtype == mx.float16 else np.float32)
                gathered.view(v.dtype)[:] = v * 2
            return exchange

        xs = [mx.arange(n, dtype=dt) for n in (1, 7, 8, 100, 16384) for dt in (mx.float32, mx.float16)]
        # Results keep x's shape: a decode step's (1, 1, hidden) row, and a 0-d array.
        xs += [mx.arange(4096, dtype=mx.float32).reshape(1, 1, 4096), mx.array(5.0)]
        ys = [gate.all_reduce(x, "max", doubled(x.dtype), service.submit) for x in xs]
        mx.eval(ys)
        for x, y in zip(xs, ys):
            assert y.shape == x.shape and np.array_equal(np.array(y), np.array(x) * 2)
        gate.check()
        assert not gate.pending()
    finally:
        service.close()


def test_a_gate_the_host_fails_is_all_ones_on_the_gpu(gate):
    """The host releases a failed gate with an error STATUS. The kernel reads STATUS beside the
    slots and reduces them all the same (bench/NOTES.md 72): it must then poison its result
    (all-ones bytes: NaN), though the mailbox holds plausible data."""
    import mlx.core as mx

    from fastcoll.errors import PeerLostError
    from gate_sim import SerialService

    service = SerialService()
    try:
        def dies(send, gathered):
            gathered.reshape(-1, send.size)[:] = send  # every slot this rank's x
            raise PeerLostError("rank 1 closed its connection")

        y = gate.all_reduce(mx.ones((4096,), dtype=mx.bfloat16), "sum", dies, service.submit)
        mx.eval(y)
        assert np.all(np.array(y.view(mx.uint16)) == 0xFFFF)
        with pytest.raises(PeerLostError, match="closed its connection"):
            gate.check()
    finally:
        service.close()
