"""Statistics and bandwidths as nccl-tests defines them (docs/performance.md, "How the benchmark
measures").

algbw = S / t.  busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather,
reduce-scatter, all-to-all, gather and scatter (S the total gathered size; for all-to-all each
rank's buffer), x 1 for broadcast and reduce (as nccl-tests).  Bandwidths are in bytes per
second here; the report prints GB/s (1e9 bytes per second, as nccl-tests does).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

GB = 1e9


def bus_factor(op: str, world: int) -> float:
    """The factor from algbw to busbw for `op` over `world` ranks."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, not {world}")
    n = float(world)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1.0) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def algbw(nbytes: int, seconds: float) -> float:
    """S / t in bytes per second."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, not {seconds}")
    return nbytes / seconds


def busbw(op: str, world: int, nbytes: int, seconds: float) -> float:
    """Bus bandwidth in bytes per second, comparable across world sizes."""
    return algbw(nbytes, seconds) * bus_factor(op, world)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, p90, mean and min of per-iteration times (seconds)."""
    if len(times) == 0:
        raise ValueError("no samples")
    a = np.asarray(times, dtype=np.float64)
    return {
        "median_s": float(np.median(a)),
        "p90_s": float(np.percentile(a, 90)),
        "mean_s": float(a.mean()),
        "min_s": float(a.min()),
    }


def csv(text: str, kind: Callable[[str], Any] = str) -> list:
    """A command line's comma-separated list, each item read by `kind`; empty items dropped."""
    return [kind(t.strip()) for t in text.split(",") if t.strip()]


def parse_size(text: str) -> int:
    """'4', '4KiB', '64MiB', '1GiB', '16k', '2M' -> bytes (k/M/G are binary here too)."""
    s = text.strip()
    units = {"gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "g": 1 << 30, "m": 1 << 20,
             "k": 1 << 10, "b": 1}
    low = s.lower()
    for suffix, mult in units.items():
        if low.endswith(suffix) and low[: -len(suffix)].strip():
            return int(float(low[: -len(suffix)]) * mult)
    return int(s)


def sizes_pow4(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from the first >= min_bytes up to max_bytes (4 B .. 64 MiB: 13 sizes)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"bad size range {min_bytes}..{max_bytes}")
    out, s = [], 1
    while s < min_bytes:
        s *= 4
    while s <= max_bytes:
        out.append(s)
        s *= 4
    return out


def format_size(nbytes: int) -> str:
    """4 -> '4 B', 4096 -> '4 KiB', 67108864 -> '64 MiB'."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult} {unit}"
    return f"{nbytes} B"
