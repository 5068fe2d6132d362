"""The gate's direct mode (fastcoll/gate/host/direct_mode.py) with two ranks played by two gates of this
process over simulated devices: a real shared-memory gather segment, the real setup, watcher and
failure paths; the simulated devices do what the kernels' FC_DIRECT paths do.
"""

from __future__ import annotations

import dataclasses

import glob
import threading
import time

import mlx.core as mx
import numpy as np
import pytest

from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, MismatchError, PeerLostError
from fastcoll.gate import Gate
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.layout import ControlLayout

from gate_sim import SimDevice
from fastcoll.transport import shm

WAIT = 10.0
N = 2

pytestmark = pytest.mark.skipif(not shm.available(), reason="no shared memory on this platform")


class Table:
    """gather_ints for ranks that are threads: every rank's values, as rows."""

    def __init__(self, n: int):
        self.rows: dict[str, dict[int, list[int]]] = {}
        self.barrier = threading.Barrier(n, timeout=WAIT)

    def for_rank(self, rank: int):
        def gather_ints(what: str, values: list[int]) -> np.ndarray:
            self.rows.setdefault(what, {})[rank] = list(values)
            self.barrier.wait()
            rows = np.array([self.rows[what][p] for p in range(len(self.rows[what]))], dtype=np.int64)
            self.barrier.wait()  # nobody reuses `what` before everyone has read it
            return rows

        return gather_ints


def ranks(timeout: float = 30.0, max_iters: int = 10**9, share=None, alive=None, tuning: str = ""):
    """Two gates of one job in the direct mode (or not, where `share` refuses)."""
    gates, devices = [], []
    for r in range(N):
        env = {"FASTCOLL_RANK": str(r), "FASTCOLL_WORLD_SIZE": str(N), "FASTCOLL_TUNING": tuning,
               "FASTCOLL_COORDINATOR": "127.0.0.1:1"}  # (never dialled: the gates alone)
        config = dataclasses.replace(Config.from_env(env), fast_sync=True, gate_max_bytes=4096, timeout=timeout,
                                     gate_host_min_bytes=1,
                                     fence_max_iters=max_iters)
        device = SimDevice(ControlLayout(4096, N))
        devices.append(device)
        gates.append(Gate(device, config))
    table = Table(N)
    threads = [threading.Thread(target=gates[r].connect, args=(table.for_rank(r), r, N, True),
                                kwargs={"share": share(r) if share else None, "alive": alive})
               for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    return gates, devices


def close(gates, devices):
    for g in gates:
        g.close()
    for d in devices:
        d.close()


def test_every_rank_gets_the_reduction_over_many_gates():
    before = set(glob.glob("/dev/shm/fc*"))
    gates, devices = ranks()
    try:
        assert all(g.direct for g in gates)
        assert set(glob.glob("/dev/shm/fc*")) - before == set()  # the name is gone after setup
        devices[1].hold()  # rank 1 starts late: rank 0 waits in its spin, never reads stale slots
        results = {0: [], 1: []}
        for r in range(N):
            for i in range(12):  # both parities of the gather's sets, many times
                x = (mx.arange(64, dtype=mx.float32) + 10 * r + i).astype(mx.bfloat16 if i % 3 == 0 else mx.float32)
                op = ("sum", "mean", "max")[i % 3]
                results[r].append((gates[r].all_reduce(x, op, None, None), op, i))
        time.sleep(0.05)
        assert not any(res.done() for res, _, _ in results[0])  # rank 0 waits for rank 1
        devices[1].resume()
        for r in range(N):
            for res, op, i in results[r]:
                res.wait(WAIT)
                assert res.status == L.OK, (r, i, res.status)
                a = np.arange(64, dtype=np.float32) + i
                b = a + 10
                want = {"sum": a + b, "mean": (a + b) / 2, "max": np.maximum(a, b)}[op]
                got = res.value(np.uint16 if i % 3 == 0 else np.float32)
                if i % 3 == 0:
                    got = (got.astype(np.uint32) << 16).view(np.float32)
                assert np.array_equal(got, want), (r, i)
        for i in range(12):  # every rank, the same bits
            assert results[0][i][0].data.tobytes() == results[1][i][0].data.tobytes()
        for g in gates:
            g.check()
            assert not g.pending()
    finally:
        close(gates, devices)


def test_ranks_that_call_different_gates_get_a_mismatch_not_data():
    gates, devices = ranks()
    try:
        x = mx.arange(8, dtype=mx.float32)
        r0 = gates[0].all_reduce(x, "sum", None, None)
        r1 = gates[1].all_reduce(x, "max", None, None)
        for r, res in ((0, r0), (1, r1)):
            assert res.wait(WAIT).status == L.MISMATCH
            assert np.all(res.data == 0xFF)
        for r, g in enumerate(gates):
            with pytest.raises(MismatchError, match=f"rank {1 - r} called another collective"):
                g.check()
    finally:
        close(gates, devices)


def test_a_peer_that_exits_is_peer_lost_and_the_gpu_is_released():
    dead = threading.Event()
    gates, devices = ranks(alive=lambda pid: not dead.is_set())
    try:
        x = mx.arange(8, dtype=mx.float32)
        res = gates[0].all_reduce(x, "sum", None, None)  # rank 1 never comes
        time.sleep(0.05)
        assert not res.done()
        t0 = time.monotonic()
        dead.set()
        assert res.wait(WAIT).status == L.ERROR
        assert time.monotonic() - t0 < 1.0
        assert np.all(res.data == 0xFF)
        with pytest.raises(PeerLostError, match="rank 1"):
            gates[0].check()
        with pytest.raises(PeerLostError):  # sticky: no later gate is launched
            gates[0].all_reduce(x, "sum", None, None)
    finally:
        close(gates, devices)


def test_a_peer_that_never_arrives_is_a_timeout_naming_it():
    gates, devices = ranks(timeout=0.3)
    try:
        x = mx.arange(8, dtype=mx.float32)
        t0 = time.monotonic()
        res = gates[0].all_reduce(x, "sum", None, None)
        assert res.wait(WAIT).status == L.ERROR
        assert 0.25 < time.monotonic() - t0 < 3.0
        with pytest.raises(CollectiveTimeoutError, match=r"rank\(s\) \[1\] did not arrive"):
            gates[0].check()
    finally:
        close(gates, devices)


def test_a_spin_that_hits_its_bound_is_reported_and_later_gates_do_not_wait():
    gates, devices = ranks(max_iters=200)
    try:
        x = mx.arange(8, dtype=mx.float32)
        first = gates[0].all_reduce(x, "sum", None, None)
        second = gates[0].all_reduce(x, "sum", None, None)
        assert first.wait(WAIT).status == L.TIMEOUT
        assert second.wait(WAIT).status == L.TIMEOUT and second.iters == 0
        with pytest.raises(CollectiveTimeoutError, match="FASTCOLL_FENCE_MAX_ITERS"):
            gates[0].check()
    finally:
        close(gates, devices)


def test_every_rank_stays_in_the_host_mode_if_one_cannot_share():
    gates, devices = ranks(share=lambda r: (lambda ptr, n: None) if r == 1 else None)
    try:
        assert not any(g.direct for g in gates)
    finally:
        close(gates, devices)


def test_close_releases_a_gate_still_waiting():
    gates, devices = ranks()
    try:
        res = gates[0].all_reduce(mx.arange(8, dtype=mx.float32), "sum", None, None)
        time.sleep(0.02)
        gates[0].close()
        assert res.wait(WAIT).status == L.CLOSED
    finally:
        close(gates, devices)


def test_a_killed_peer_is_dead_before_its_parent_reaps_it():
    """The watcher's liveness check: a SIGKILLed process that its parent has not waited for yet
    (a zombie, as a rank is under a launcher busy elsewhere) counts as gone."""
    import os
    import signal
    import subprocess
    import sys

    from fastcoll.gate.host.direct_mode import _process_alive

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _process_alive(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _process_alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _process_alive(p.pid)  # not reaped yet: still a zombie
        assert p.poll() is not None
    finally:
        p.kill()
        p.wait()
    assert not _process_alive(p.pid)


def test_the_watcher_looks_as_often_as_fastcoll_tuning_says():
    """Each look takes the GIL from the thread building the next token: 5 ms by default,
    FASTCOLL_TUNING=gate_watch_ms=N otherwise."""
    for tuning, nap in (("", 0.005), ("gate_watch_ms=20", 0.020)):
        gates, devices = ranks(tuning=tuning)
        try:
            assert all(g.direct for g in gates)
            assert [g._watcher._nap_s for g in gates] == [nap] * N
        finally:
            close(gates, devices)


class _Gates:
    """The watcher's view of a HostHalf whose gates pass (`moving`) or have stopped."""

    def __init__(self, looks: int, moving: bool):
        self.looks, self.moving, self.acks, self.failed = looks, moving, 0, None

    def pending(self) -> bool:
        self.looks -= 1
        return self.looks >= 0

    def completed(self) -> int:
        self.acks += self.moving  # one more gate passed since the last look, or none
        return self.acks

    def check(self) -> None:
        pass

    def fail(self, e: BaseException) -> None:
        self.failed = e


class _Segment:
    """A gather segment's lines as the watcher reads them: rank 0 is there, rank 1 is behind."""

    rank = 0
    layout = L.GatherLayout(64, N)

    def pid(self, p: int) -> int:
        return 1000 + p

    def flag(self, p: int) -> int:
        return 10**6 if p == 0 else 0


@pytest.mark.parametrize("moving", [True, False])
def test_the_watcher_looks_at_peer_processes_only_once_the_gates_stop(moving):
    """While gates pass, a look costs no system call; once they stop, every look asks whether
    each peer's process is alive (and finds a dead one)."""
    from fastcoll.gate.host.direct_mode import Watcher

    asked: list[int] = []
    gates = _Gates(looks=20, moving=moving)
    w = Watcher(gates, _Segment(), timeout=30.0, alive=lambda pid: asked.append(pid) or True, nap_s=0.001)
    try:
        w.wake()
        deadline = time.monotonic() + WAIT
        while gates.looks >= 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gates.looks < 0, "the watcher did not look 20 times"
        if moving:
            assert asked == []
        else:
            assert asked[:3] == [1001] * 3 and len(asked) >= 15  # every look but the first
        assert gates.failed is None
    finally:
        w.stop()
