"""FASTCOLL_GATE_PROFILE=1: per-gate timings and a steady-state summary.

Per gate, on the service thread: how long the host waited for the GPU's arrival, how long the
exchange took, the release latency (host store of the release word until the spinning kernel's
acknowledgement is seen, i.e. host store -> GPU continuing) and the spin's iteration count. The
first `warmup` gates (kernel compilation, first-touch page faults) are left out of the summary.
"""

from __future__ import annotations

import logging
import threading
from array import array
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("fastcoll.gate")

DEFAULT_WARMUP = 10


@dataclass(frozen=True)
class GateTiming:
    """One gate as the host saw it; times in microseconds, None where not measured."""

    seq: int
    arrival_us: float
    exchange_us: float
    host_us: float  # arrival seen -> release stored: the exchange plus the host half's own work
    release_us: float | None
    spin_iters: int | None
    status: str


class GateProfile:
    """Collects GateTimings, logs each one, and summarizes the steady state."""

    FIELDS = ("arrival_us", "exchange_us", "host_us", "release_us", "spin_iters")

    def __init__(self, warmup: int = DEFAULT_WARMUP, logger: logging.Logger = log):
        self.warmup = warmup
        self._log = logger
        self._lock = threading.Lock()
        self._count = 0
        self._columns = {f: array("d") for f in self.FIELDS}
        self._missing_acks = 0

    def record(self, t: GateTiming) -> None:
        """Keep one gate's timing (past the warm-up) and log it."""
        self._log.info(
            "gate %d: arrival wait %.1f us, exchange %.1f us, host %.1f us, release %s, spin %s iters, %s",
            t.seq, t.arrival_us, t.exchange_us, t.host_us,
            "n/a" if t.release_us is None else f"{t.release_us:.1f} us",
            "n/a" if t.spin_iters is None else t.spin_iters, t.status,
        )
        with self._lock:
            self._count += 1
            if self._count <= self.warmup:
                return
            if t.release_us is None:
                self._missing_acks += 1
                return
            for f in self.FIELDS:
                self._columns[f].append(float(getattr(t, f)))

    def summary(self) -> dict[str, dict[str, float]] | None:
        """Median, p90 and mean of each field over the steady-state gates, or None if none."""
        with self._lock:
            columns = {f: np.frombuffer(c, dtype=np.float64).copy() for f, c in self._columns.items()}
            count, missing = self._count, self._missing_acks
        if columns["arrival_us"].size == 0:
            return None
        out: dict[str, dict[str, float]] = {}
        for f, values in columns.items():
            out[f] = {
                "median": float(np.median(values)),
                "p90": float(np.percentile(values, 90)),
                "mean": float(values.mean()),
            }
        out["gates"] = {"total": float(count), "steady": float(columns["arrival_us"].size),
                        "missing_acks": float(missing)}
        return out

    def log_summary(self) -> None:
        """Log the steady-state summary (at exit or close)."""
        s = self.summary()
        if s is None:
            self._log.info("gate profile: no steady-state gates (%d in all)", self._count)
            return
        g = s["gates"]
        self._log.info(
            "gate profile, steady state (%d of %d gates; medians, p90 in brackets): "
            "arrival wait %.1f us [%.1f], exchange %.1f us [%.1f], host %.1f us [%.1f], "
            "release %.1f us [%.1f], spin %.0f iters [%.0f]%s",
            g["steady"], g["total"],
            s["arrival_us"]["median"], s["arrival_us"]["p90"],
            s["exchange_us"]["median"], s["exchange_us"]["p90"],
            s["host_us"]["median"], s["host_us"]["p90"],
            s["release_us"]["median"], s["release_us"]["p90"],
            s["spin_iters"]["median"], s["spin_iters"]["p90"],
            f"; {int(g['missing_acks'])} releases not acknowledged in time" if g["missing_acks"] else "",
        )
