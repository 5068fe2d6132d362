"""The fence gate's host half against a device played by a thread (tests/gate_sim.py).

Covers: ordinary releases in several dtypes, a peer dying mid-gate, a spin that hits its bound,
a gate closed or aborted before it arrives, a gate released with an error before its error is
recorded, sequence numbers wrapping at 2**32, the profile, and that the arrival poll leaves the
caller's Python thread its speed.
"""

from __future__ import annotations

import logging
import threading
import time

import mlx.core as mx
import numpy as np
import pytest

from fastcoll.config import Config
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.gate import Gate
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.host import serve
from fastcoll.gate.host.serve import GateClosedError
from fastcoll.gate.protocol.layout import ControlLayout
from fastcoll.gate.host.poll import Poller

from gate_sim import SerialService, SimDevice, loop_rate

WAIT = 10.0  # seconds a test waits on a simulated gate before calling it hung


RANKS = 2  # the gates here play rank 0 of two


def make(max_bytes=4096, max_iters=10**9, start_seq=1, profile=False, poller=None, timeout=30.0):
    config = Config(world_size=RANKS, fast_sync=True, gate_host_min_bytes=1, fence_max_iters=max_iters, gate_max_bytes=max_bytes,
                    gate_profile=profile, timeout=timeout)
    device = SimDevice(ControlLayout(max_bytes, RANKS))
    gate = Gate(device, config, start_seq=start_seq, poller=poller)
    service = SerialService()
    return gate, device, service


def two_rank_sum(x: mx.array, op: str = "sum"):
    """An exchange that plays two ranks holding the same x: both slots get this rank's bytes
    (the device reduces them)."""
    assert op == "sum"

    def exchange(send: np.ndarray, gathered: np.ndarray) -> None:
        k = send.size
        gathered[:k] = send
        gathered[k : 2 * k] = send

    return exchange


def host_bytes(x: mx.array) -> np.ndarray:
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.array(x).reshape(-1).view(np.uint8)


def close_all(gate, device, service):
    gate.close()
    service.close()
    device.close()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_ordinary_releases(dtype):
    gate, device, service = make()
    try:
        xs = [(mx.arange(1, 1 + 64 + i) % 50).astype(dtype) for i in range(12)]
        mx.eval(xs)
        results = [gate.all_reduce(x, "sum", two_rank_sum(x), service.submit) for x in xs]
        for x, r in zip(xs, results):
            r.wait(WAIT)
            assert r.status == L.OK
            assert np.array_equal(r.data, host_bytes(x * 2)), f"{dtype} gate {r.seq}"
        assert not gate.pending()
        gate.check()
        assert device.page.view(np.uint32)[L.ACK] == results[-1].seq
    finally:
        close_all(gate, device, service)


def test_results_wait_for_the_host():
    # The GPU is spinning before the host has served it: the result must not come early.
    gate, device, service = make()
    go = threading.Event()
    try:
        x = mx.arange(16, dtype=mx.float32)

        def slow(send, gathered):  # the other rank holds ones
            go.wait(WAIT)
            gathered[: send.size] = send
            gathered[send.size :] = np.ones(16, np.float32).view(np.uint8)

        r = gate.all_reduce(x, "sum", slow, service.submit)
        time.sleep(0.05)
        assert not r.done()
        assert gate.pending()
        go.set()
        r.wait(WAIT)
        assert np.array_equal(r.value(np.float32), np.arange(16, dtype=np.float32) + 1)
    finally:
        go.set()
        close_all(gate, device, service)


def test_peer_dies_mid_gate():
    gate, device, service = make()
    try:
        x = mx.arange(32, dtype=mx.float32)
        ok = gate.all_reduce(x, "sum", two_rank_sum(x), service.submit)

        issued = threading.Event()

        def dies(send, gathered):
            issued.wait(WAIT)
            raise PeerLostError("rank 1 closed its connection")

        futures = []
        dead = gate.all_reduce(x, "sum", dies, lambda fn: futures.append(service.submit(fn)))
        # Issued before the failure is seen; the core would skip its host half: never served.
        queued = gate.all_reduce(x, "sum", two_rank_sum(x), lambda fn: None)
        issued.set()
        assert ok.wait(WAIT).status == L.OK
        # The GPU is never left waiting: both later gates are released, with an error status.
        for r in (dead, queued):
            r.wait(WAIT)
            assert r.status == L.ERROR
            assert np.all(r.data == 0xFF)  # all-ones: NaN, never plausible data
        with pytest.raises(PeerLostError):
            futures[0].result(WAIT)  # re-raised to the core, which fails the group
        with pytest.raises(PeerLostError, match="closed its connection"):
            gate.check()
        with pytest.raises(PeerLostError):  # sticky: no later gate is launched
            gate.all_reduce(x, "sum", two_rank_sum(x), service.submit)
        assert not gate.pending()
    finally:
        close_all(gate, device, service)


def test_spin_that_hits_its_bound_is_an_error():
    gate, device, service = make(max_iters=300)
    late = threading.Event()
    try:
        x = mx.arange(8, dtype=mx.float32)

        def stuck(send, gathered):
            late.wait(WAIT)  # the host is stuck past the spin's bound
            two_rank_sum(x)(send, gathered)

        r = gate.all_reduce(x, "sum", stuck, service.submit)
        r.wait(WAIT)
        assert r.status == L.TIMEOUT
        assert np.all(r.data == 0xFF)
        with pytest.raises(CollectiveTimeoutError, match="FASTCOLL_FENCE_MAX_ITERS"):
            gate.check()
        late.set()  # the exchange ends after all: its late release must not revive the gate
        time.sleep(0.05)
        with pytest.raises(CollectiveTimeoutError):
            gate.check()
        with pytest.raises(CollectiveTimeoutError):
            gate.all_reduce(x, "sum", two_rank_sum(x), service.submit)
    finally:
        late.set()
        close_all(gate, device, service)


def test_later_spins_do_not_wait_after_a_timeout():
    gate, device, service = make(max_iters=200)
    try:
        x = mx.arange(8, dtype=mx.float32)
        first = gate.all_reduce(x, "sum", two_rank_sum(x), lambda fn: None)  # never served
        second = gate.all_reduce(x, "sum", two_rank_sum(x), lambda fn: None)
        assert first.wait(WAIT).status == L.TIMEOUT
        assert second.wait(WAIT).status == L.TIMEOUT
        assert second.iters == 0  # its predecessor's timeout (in the token) short-circuits it
        with pytest.raises(CollectiveTimeoutError):
            gate.check()
    finally:
        close_all(gate, device, service)


def test_close_releases_a_gate_that_never_arrived():
    gate, device, service = make()
    try:
        device.hold()  # the GPU is busy elsewhere: the arrival does not come
        x = mx.arange(8, dtype=mx.float32)
        futures = []
        r = gate.all_reduce(x, "sum", two_rank_sum(x), lambda fn: futures.append(service.submit(fn)))
        time.sleep(0.02)
        assert gate.pending()
        gate.close()  # finalize: the service thread stops polling, the gate is released
        with pytest.raises(GateClosedError):
            futures[0].result(WAIT)
        device.resume()
        assert r.wait(WAIT).status == L.CLOSED
    finally:
        device.resume()
        close_all(gate, device, service)


def test_abort_from_the_core_releases_unserved_gates():
    gate, device, service = make()
    try:
        x = mx.arange(8, dtype=mx.float32)
        r = gate.all_reduce(x, "sum", two_rank_sum(x), lambda fn: None)  # the core never runs it
        gate.abort(PeerLostError("rank 1 vanished during a host-path all_gather"))
        assert r.wait(WAIT).status == L.ERROR
        with pytest.raises(PeerLostError, match="vanished"):
            gate.check()
    finally:
        close_all(gate, device, service)


def test_a_gate_released_with_an_error_before_it_is_recorded_still_raises_it(monkeypatch):
    # The native engine stores the error release first and records the error from another
    # thread after: check() in between waits for it, and says so if it never comes.
    gate, device, service = make()
    try:
        words = device.page.view(np.uint32)
        words[L.STATUS], words[L.RELEASE] = L.ERROR, 1  # as the native server's store does
        late = threading.Timer(0.2, gate.abort, (PeerLostError("rank 1 vanished during gate 1"),))
        late.start()
        start = time.monotonic()
        with pytest.raises(PeerLostError, match="vanished"):
            gate.check()
        assert 0.1 < time.monotonic() - start < serve.RECORD_WAIT_S
        late.join()
    finally:
        close_all(gate, device, service)
    monkeypatch.setattr(serve, "RECORD_WAIT_S", 0.3)
    gate, device, service = make()
    try:
        words = device.page.view(np.uint32)
        words[L.STATUS], words[L.RELEASE] = L.ERROR, 1
        with pytest.raises(FastcollError, match="released gate 1 with an error status, but no error was recorded"):
            gate.check()
        with pytest.raises(FastcollError, match="no error was recorded"):  # recorded now: at once
            gate.check()
    finally:
        close_all(gate, device, service)


def test_submit_failure_releases_the_gate():
    gate, device, service = make()
    try:
        x = mx.arange(8, dtype=mx.float32)

        def broken_submit(fn):
            raise PeerLostError("the group already failed")

        with pytest.raises(PeerLostError):
            gate.all_reduce(x, "sum", two_rank_sum(x), broken_submit)
        with pytest.raises(PeerLostError):
            gate.check()
        # The kernels of that gate were already in the graph: they must pass, not spin.
        assert device.page.view(np.uint32)[L.RELEASE] == 1
    finally:
        close_all(gate, device, service)


def test_a_failing_exchange_is_an_error_not_data():
    gate, device, service = make()
    try:
        x = mx.arange(8, dtype=mx.float32)

        def broken(send, gathered):
            gathered[:3] = 7  # partly written, then a bug: the GPU must not take it for data
            raise ZeroDivisionError("a bug in the exchange")

        r = gate.all_reduce(x, "sum", broken, service.submit)
        assert r.wait(WAIT).status == L.ERROR
        assert np.all(r.data == 0xFF)
        with pytest.raises(FastcollError, match="fence gate failed"):
            gate.check()
    finally:
        close_all(gate, device, service)


def test_sequence_wraps_at_2_to_the_32():
    gate, device, service = make(start_seq=2**32 - 3)
    try:
        x = mx.arange(16, dtype=mx.float32)
        results = [gate.all_reduce(x + i, "sum", two_rank_sum(x + i), service.submit) for i in range(8)]
        seqs = [r.seq for r in results]
        assert seqs == [2**32 - 3, 2**32 - 2, 2**32 - 1, 0, 1, 2, 3, 4]
        for i, r in enumerate(results):
            assert r.wait(WAIT).status == L.OK
            assert np.array_equal(r.value(np.float32), 2 * (np.arange(16, dtype=np.float32) + i))
        gate.check()
    finally:
        close_all(gate, device, service)


def test_profile_records_and_summarizes(caplog):
    caplog.set_level(logging.INFO, logger="fastcoll.gate")
    gate, device, service = make(profile=True)
    try:
        x = mx.arange(32, dtype=mx.float32)
        results = [gate.all_reduce(x, "sum", two_rank_sum(x), service.submit) for _ in range(14)]
        for r in results:
            r.wait(WAIT)
        service.submit(lambda: None).result(WAIT)  # the last host half has finished
        s = gate.profile().summary()
        assert s is not None and s["gates"]["total"] == 14
        assert s["gates"]["steady"] + s["gates"]["missing_acks"] == 4
        for field in ("arrival_us", "exchange_us", "host_us", "release_us", "spin_iters"):
            assert s[field]["median"] >= 0
        gate.close()
        text = caplog.text
        assert "gate 3: arrival wait" in text
        assert "steady state" in text
    finally:
        close_all(gate, device, service)


def test_arrival_poll_does_not_starve_the_caller():
    # A poll that never sleeps (spin_s huge): the worst case for the caller's thread.
    gate, device, service = make(poller=Poller(spin_s=3600.0))
    try:
        base = loop_rate(0.25)
        device.hold()  # the arrival will not come: the service thread polls all along
        x = mx.arange(8, dtype=mx.float32)
        r = gate.all_reduce(x, "sum", two_rank_sum(x), service.submit)
        time.sleep(0.01)
        polled = loop_rate(0.25)
        device.resume()
        r.wait(WAIT)
        ratio = polled / base
        print(f"\ncaller's Python loop: {base:.3g}/s alone, {polled:.3g}/s with a pending poll ({ratio:.0%})")
        assert ratio > 0.5
    finally:
        device.resume()
        close_all(gate, device, service)


def test_the_native_host_half_takes_the_layout_by_name_and_its_words_from_layout_py():
    """Engine.gate.attach takes the page's ControlLayout itself (read by name) and the words and status
    codes from gate/fc_gate_page.h, generated from fastcoll/gate/protocol/layout.py: a release
    lands on layout.py's RELEASE and STATUS words, and a layout this build does not share (another
    send mailbox) or a page too small for it is refused with a message that says so."""
    from types import SimpleNamespace

    _native = pytest.importorskip("fastcoll.engine._native", reason="the native engine is not built")
    e = _native.Engine(0, 2, 1, 0, 0, threading.main_thread().ident, 0)
    try:
        lay = ControlLayout(4096, 2)
        page = np.zeros(lay.total_bytes, np.uint8)
        other = SimpleNamespace(send_offset=2 * L.SEND_OFFSET, recv_offset=lay.recv_offset,
                                mailbox_bytes=lay.mailbox_bytes, ranks=lay.ranks)
        with pytest.raises(ValueError, match=f"send mailbox is at byte {2 * L.SEND_OFFSET}, this build's at "
                                             f"{L.SEND_OFFSET}"):
            e.gate.attach(page, other, 1, False)
        with pytest.raises(ValueError, match="lie outside its page"):
            e.gate.attach(page[: lay.recv_offset + lay.mailbox_bytes], lay, 1, False)
        with pytest.raises(AttributeError, match="recv_offset"):
            e.gate.attach(page, SimpleNamespace(send_offset=L.SEND_OFFSET), 1, False)
        e.gate.attach(page, lay, 1, False)
        e.gate.release(1, L.ERROR)
        words = page.view(np.uint32)
        assert (words[L.RELEASE], words[L.STATUS]) == (1, L.ERROR)
        assert words[L.ARRIVAL] == words[L.ACK] == 0  # nothing else written
    finally:
        e.close(0.0, 0.0)
