"""The quick-start job: all-reduce an mx.array across the ranks of a job, check it, time it.

    fastcoll-launch -n 2 python examples/allreduce.py
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

import fastcoll


def timed(x: mx.array, calls: int) -> list[float]:
    """Seconds per all_reduce of x, one sample per call."""
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fastcoll.all_reduce(x)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    x = mx.full((1024,), r + 1, dtype=mx.float32)  # 4 KiB
    y = fastcoll.all_reduce(x)
    want = n * (n + 1) / 2
    assert bool(mx.all(y == want)), f"rank {r}: expected every element to be {want}, got {y}"
    print(f"rank {r}/{n}: all_reduce(sum) of 4 KiB float32 gave {want:g} everywhere, as expected")

    timed(x, 50)  # warm-up
    small = np.median(timed(x, 1000))
    big = mx.ones((16 << 20,), dtype=mx.float32)  # 64 MiB
    timed(big, 1)
    t_big = float(np.median(timed(big, 5)))
    busbw = big.nbytes / t_big * 2 * (n - 1) / n / 1e9 if n > 1 else float("nan")
    transport = g.transport_info() if n > 1 else "none (world of one)"
    print(
        f"rank {r}/{n}: transport {transport}: 4 KiB all_reduce median {small * 1e6:.0f} us over 1000 calls; "
        f"64 MiB all_reduce median {t_big * 1e3:.1f} ms (bus bandwidth {busbw:.2f} GB/s)"
    )
    fastcoll.finalize()


if __name__ == "__main__":
    main()
