"""`fastcoll-launch --check`'s RDMA part, as each host's agent runs it (fastcoll/launch/agent.py
imports this module only where a hostfile names RDMA devices).

`probe` answers whether this host's verbs library loads and lists the devices the hostfile names
for it. `run_link` opens one verbs link, as a job's native engine opens it (NativeEngine.over,
over the check's TCP connection between two hosts' agents), then measures it: the median round
trip of small messages and one larger message each way, compared byte for byte. Every failure is
a one-line reason, never an exception out of the agent.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from fastcoll.config import Config
from fastcoll.engine import verbs_problem
from fastcoll.transport import rdma
from fastcoll.transport.base import data_header

PINGS = 20
PING_BYTES = 64
BULK_BYTES = 4 << 20
SIG = "fastcoll-launch --check"


def library() -> str | None:
    """The verbs library a job on this host loads (FASTCOLL_VERBS_LIB, else the platform's)."""
    return os.environ.get("FASTCOLL_VERBS_LIB") or None


def reliable() -> bool:
    return os.environ.get("FASTCOLL_RDMA_RELIABLE", "").strip().lower() in ("1", "on", "true", "yes")


def probe(devices: list[str]) -> dict:
    """{"devices": [what the library lists]}, or {"error": why the devices cannot be used here}."""
    why = verbs_problem()
    if why is None:
        why, _ = rdma.device_problem(library(), sorted(set(devices)))
    if why is not None:
        return {"error": why}
    return {"devices": rdma.list_devices(library())}


def run_link(sock: Any, rank: int, device: str, timeout: float) -> dict:
    """Open a verbs link on `device` over `sock` (connected to the other host's agent, which runs
    this as the other rank of two) and measure it: {"ok": True, "rtt_s", "bytes", "seconds"} or
    {"ok": False, "error"}. Takes `sock` (closed here)."""
    from fastcoll.engine.native import NativeEngine

    config = Config(rank=rank, world_size=2, transport="rdma", timeout=timeout, verbs_lib=library(),
                    rdma_reliable=reliable())
    try:
        eng = NativeEngine.over(config, {1 - rank: [rdma.VerbsLink(sock, device)]})
    except Exception as e:  # over() closed the socket; the reason is the check's answer
        return {"ok": False, "error": " ".join(str(e).split())}
    try:
        return _measure(eng.transport, rank, time.monotonic() + timeout)
    except Exception as e:
        return {"ok": False, "error": " ".join(str(e).split())}
    finally:
        eng.close(1.0)


def _measure(t: Any, rank: int, deadline: float) -> dict:
    """Round trips of PING_BYTES (rank 1 starts each), then BULK_BYTES each way, checked."""
    peer = 1 - rank
    small, back = np.full(PING_BYTES, 0x5A, np.uint8), np.empty(PING_BYTES, np.uint8)
    rtts = []
    for i in range(PINGS):
        t0 = time.perf_counter()
        if rank == 1:
            t.send(peer, data_header(i, SIG, 0, PING_BYTES), memoryview(small))
            t.flush(deadline)
        t.recv(peer, i, SIG, 0, memoryview(back), deadline)
        if rank == 0:
            t.send(peer, data_header(i, SIG, 0, PING_BYTES), memoryview(back))
            t.flush(deadline)
        rtts.append(time.perf_counter() - t0)
    bulk = _pattern(rank)
    got = np.empty(BULK_BYTES, np.uint8)
    t0 = time.perf_counter()
    t.send(peer, data_header(PINGS, SIG, 0, BULK_BYTES), memoryview(bulk))
    t.recv(peer, PINGS, SIG, 0, memoryview(got), deadline)
    t.flush(deadline)
    seconds = time.perf_counter() - t0
    want = _pattern(peer)
    if not np.array_equal(got, want):
        return {"ok": False, "error": f"{BULK_BYTES} bytes arrived changed ({int((got != want).sum())} differ)"}
    return {"ok": True, "rtt_s": sorted(rtts)[len(rtts) // 2], "bytes": BULK_BYTES, "seconds": seconds}


def _pattern(rank: int) -> np.ndarray:
    """BULK_BYTES that differ by position and by sender, so that a misplaced frame shows."""
    return np.resize(np.arange(251, dtype=np.uint8), BULK_BYTES) ^ np.uint8(rank + 1)
