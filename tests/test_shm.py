"""Shared memory between ranks of one host (fastcoll/transport/shm.py): the ring and the socket
it stands in for, in one process; the upgrade of real jobs' connections, in real processes."""

from __future__ import annotations

import glob
import json
import os
import random
import re
import socket
import threading
import time

import pytest

from conftest import assert_ok
from fastcoll.config import Config
from fastcoll.errors import FastcollError
from fastcoll.transport import shm
from fastcoll.transport.link import SocketLink



def _why_not() -> str | None:
    """Why shared memory cannot be tested here, or None."""
    if not shm.available():
        return "this platform has no safe shared-memory path (see transport/shm.py)"
    try:
        _, _, mem, forget = shm._create(shm.RING_BYTES)
    except OSError as e:
        return f"cannot create a shared-memory segment here ({e}); jobs stay on TCP"
    forget()
    mem.close()
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def timeouts(s: shm.ShmLink, seconds: float) -> None:
    s.set_timeouts(seconds)


def read_exactly(s: shm.ShmLink, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        assert k > 0, f"end of stream after {got} of {n} bytes"
        got += k
    return bytes(buf)


def test_bytes_stream_through_a_small_ring_in_order():
    """Messages of random sizes, many larger than the ring, wrap around it many times; a reader
    thread gets exactly the bytes written, in order, through blocking and non-blocking reads."""
    a, b = shm.pair(1000)
    timeouts(a, 10)
    timeouts(b, 10)
    rng = random.Random(7)
    messages = [rng.randbytes(rng.choice([1, 7, 999, 1000, 1001, 4096, 25_000])) for _ in range(300)]
    got: list[bytes] = []

    def reader() -> None:
        for m in messages:
            got.append(read_exactly(b, len(m)))

    t = threading.Thread(target=reader)
    t.start()
    for i, m in enumerate(messages):
        if i % 3 == 0:
            sent = a.sendmsg([m[:5], m[5:]])  # as a socket's: possibly only part of it
            a.sendall(m[sent:])
        else:
            a.sendall(m)
    t.join(timeout=30)
    assert not t.is_alive()
    assert got == messages
    a.close()
    b.close()


def test_a_sleeping_reader_is_woken_by_the_doorbell():
    a, b = shm.pair(4096)
    timeouts(b, 10)
    box: list[float] = []

    def reader() -> None:
        read_exactly(b, 3)
        box.append(time.monotonic())

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.3)  # long past the spin: the reader sleeps in select() with its flag raised
    assert b.rx.ctl[shm._ASLEEP] == 1
    sent = time.monotonic()
    a.sendall(b"abc")
    t.join(timeout=5)
    assert box and box[0] - sent < 0.25
    a.close()
    b.close()


def test_end_of_stream_after_the_data_and_timeouts():
    a, b = shm.pair(64)
    timeouts(a, 0.3)
    timeouts(b, 0.3)
    with pytest.raises(BlockingIOError):
        b.recv_into(bytearray(8), 0, socket.MSG_DONTWAIT)  # nothing yet: as a socket says it
    t0 = time.monotonic()
    with pytest.raises(BlockingIOError):
        b.recv_into(bytearray(8))  # SO_RCVTIMEO's EAGAIN
    assert 0.25 < time.monotonic() - t0 < 2
    with pytest.raises(BlockingIOError):
        a.sendall(bytes(200))  # the ring (64 B) never drains: SO_SNDTIMEO's EAGAIN
    with pytest.raises(BlockingIOError):
        a.send(bytes(100), socket.MSG_DONTWAIT)
    b2 = bytearray(64)
    assert b.recv_into(b2) == 64  # what was written before the timeout is there
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(BrokenPipeError):
        a.sendall(b"x")
    assert b.recv_into(bytearray(8)) == 0  # end of stream once the ring is empty
    a.close()
    b.close()


def test_a_writer_waiting_for_room_sees_the_peer_go_despite_unread_doorbells():
    """The peer rang a doorbell and then died with this rank's ring to it full: the writer must
    fail at once (BrokenPipeError, which the transport reports as PeerLostError), not time out."""
    a, b = shm.pair(64)
    timeouts(a, 5)
    a.rx.sleep()  # a's flag up: b's next write rings a doorbell that nobody takes
    b.sendall(b"0123456789")
    b.sock.close()
    t0 = time.monotonic()
    with pytest.raises(BrokenPipeError):
        a.sendall(bytes(200))
    assert time.monotonic() - t0 < 1
    a.close()


def test_malformed_offers_are_refused():
    assert shm._check_offer(None, "rank 0") is None
    good = {"name": "/fc" + "0" * 24, "nonce": "ab" * 16, "capacity": shm.RING_BYTES}
    assert shm._check_offer(good, "rank 0") == ({"name": good["name"]}, bytes.fromhex("ab" * 16), shm.RING_BYTES)
    memfd = {"memfd": [1234, 7], "nonce": "ab" * 16, "capacity": shm.RING_BYTES}
    assert shm._check_offer(memfd, "rank 0") == ({"memfd": [1234, 7]}, bytes.fromhex("ab" * 16), shm.RING_BYTES)
    for bad in (
        [1, 2],
        {**good, "name": "/etc/passwd"},
        {**good, "name": "/fc" + "0" * 40},
        {**good, "nonce": "zz"},
        {**good, "nonce": "zz" * 16},  # the right length, not hex
        {**good, "capacity": 1 << 40},
        {**good, "memfd": [1234, 7]},  # both ways at once
        {**memfd, "memfd": [0, 7]},
        {**memfd, "memfd": [1234, -1]},
        {**memfd, "memfd": [1234, 1 << 40]},
        {**memfd, "memfd": [1234, True]},
        {**memfd, "memfd": "/proc/1/fd/7"},
        {"nonce": "ab" * 16, "capacity": shm.RING_BYTES},  # neither
    ):
        with pytest.raises(FastcollError, match="malformed shared-memory offer"):
            shm._check_offer(bad, "rank 0")


def test_a_segment_without_the_nonce_is_not_attached():
    """What another host's rank offers does not exist here, or holds another nonce."""
    where, nonce, mem, forget = shm._create(4096)
    try:
        got = shm._attach(where, nonce, 4096, "rank 0")
        assert got is not None
        got.close()
        assert shm._attach(where, bytes(16), 4096, "rank 0") is None
        assert shm._attach({"name": "/fc" + "f" * 24}, nonce, 4096, "rank 0") is None
        assert shm._attach({"memfd": [os.getpid(), 1 << 20]}, nonce, 4096, "rank 0") is None
        assert shm._attach({"memfd": [os.getpid(), 0]}, nonce, 4096, "rank 0") is None  # not a memfd
    finally:
        forget()
        mem.close()


def test_fastcoll_shm_is_a_flag():
    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}
    assert Config.from_env(base).shm is True
    assert Config.from_env({**base, "FASTCOLL_SHM": "0"}).shm is False
    with pytest.raises(ValueError, match="FASTCOLL_SHM must be 0 or 1"):
        Config.from_env({**base, "FASTCOLL_SHM": "maybe"})


def _segments() -> set[str]:
    """fastcoll's named segments in /dev/shm ("fc" and 24 hex digits; other programs' names
    that start with "fc" are not ours)."""
    return {p for p in glob.glob("/dev/shm/fc*") if re.fullmatch(r"fc[0-9a-f]{24}", os.path.basename(p))}


@pytest.mark.parametrize(
    "flag,expected,info", [("1", ["shm"], "tcp, shared memory on 2 of 2 connections"), ("0", ["tcp"], "tcp")]
)
def test_ranks_of_one_host_use_shared_memory_unless_told_not_to(launch, flag, expected, info):
    """Every connection of a 3-rank local job goes through shared memory (FASTCOLL_SHM=0: none
    does), results stay exact, and no segment is left in /dev/shm, even while the job runs."""
    before = _segments()
    job = launch(3, "shm_worker.py", transport="tcp", FASTCOLL_SHM=flag)
    results = job.wait(timeout=120)
    assert_ok(results)
    for r in results:
        doc = json.loads(r.out.strip().splitlines()[-1])
        assert doc["links"] == expected and doc["info"].split("; ")[0] == info, r.out
    if os.path.isdir("/dev/shm"):
        assert _segments() - before == set()


def test_one_rank_without_shared_memory_keeps_tcp_for_all(launch):
    """Where one end does not want it, the connection stays TCP; the others still upgrade."""
    job = launch(3, "shm_worker.py", transport="tcp", per_rank_env=lambda r: {"FASTCOLL_SHM": "0" if r == 2 else "1"})
    results = job.wait(timeout=120)
    assert_ok(results)
    links = {r.rank: json.loads(r.out.strip().splitlines()[-1])["links"] for r in results}
    assert links == {0: ["shm", "tcp"], 1: ["shm", "tcp"], 2: ["tcp"]}, links


def test_a_malformed_offer_fails_the_upgrade_and_closes_the_connections():
    from fastcoll.transport.stream import send_message

    mine, theirs = socket.socketpair()
    send_message(theirs, {"name": "/elsewhere", "nonce": "00", "capacity": 1}, 4096)
    with pytest.raises(FastcollError, match="rank 0 sent a malformed shared-memory offer"):
        shm.upgrade(1, {0: [SocketLink(mine)]}, True, time.monotonic() + 5)
    assert mine.fileno() == -1  # closed
    theirs.close()


def test_upgrade_between_two_ranks_in_one_process():
    """Both halves of the handshake over a socketpair: the lower rank offers, the higher attaches;
    the segment's name is gone afterwards; bytes then flow through the rings."""
    lo, hi = socket.socketpair()
    box: dict = {}
    before = _segments()
    t = threading.Thread(target=lambda: box.update(hi=shm.upgrade(1, {0: [SocketLink(hi)]}, True, time.monotonic() + 5)))
    t.start()
    got_lo = shm.upgrade(0, {1: [SocketLink(lo)]}, True, time.monotonic() + 5)
    t.join(timeout=10)
    a, b = got_lo[1][0], box["hi"][0][0]
    assert isinstance(a, shm.ShmLink) and isinstance(b, shm.ShmLink)
    assert _segments() - before == set()
    a.sendall(b"hello")
    assert read_exactly(b, 5) == b"hello"
    b.sendall(b"back")
    assert read_exactly(a, 4) == b"back"
    a.close()
    b.close()


def test_no_segment_is_offered_to_a_rank_on_another_host():
    """`here` (from the rendezvous table's host ids) leaves connections to other hosts on TCP
    without creating a segment for them."""
    lo, hi = socket.socketpair()
    before = _segments()
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(hi=shm.upgrade(1, {0: [SocketLink(hi)]}, True, time.monotonic() + 5, {1})))
    t.start()
    got_lo = shm.upgrade(0, {1: [SocketLink(lo)]}, True, time.monotonic() + 5, {0})
    t.join(timeout=10)
    assert got_lo[1][0].sock is lo and box["hi"][0][0].sock is hi
    assert _segments() - before == set()
    lo.close()
    hi.close()
