"""What a same-host peer that holds the job's token can do through shared memory
(fastcoll/transport/shm.py, fastcoll/engine/csrc/links/fc_shmring.c), and a segment's creator killed
while its peer attaches (docs/failures.md, "A same-host peer").

In one process: a ring whose counters the other side wrote out of range (a head below zero or
past the tail by more than the capacity, a tail below zero or past the head) raises RingCorrupt
from every read of it, never an index outside the ring; a Linux segment is a memfd whose size
neither side can change; a named segment (macOS) loses its name as soon as the peer holds it.

In real jobs (tests/progs/shm_peer_worker.py, both engines): rank 0 writes such a counter into
the rings it shares with rank 1, whose next collective raises a PeerLostError naming rank 0 as
malformed at once (the native engine crashed with SIGSEGV on a negative position; the Python
engine timed out, or took the bytes past the head); rank 0 tries to shrink its segments under
rank 1 (SIGBUS on both engines), which the seals refuse; rank 0 is killed (SIGTERM, SIGKILL)
right after offering its segment, which leaves nothing in /dev/shm (a 4 MiB /dev/shm/fc* stayed).
"""

from __future__ import annotations

import glob
import os
import re
import select
import signal
import sys
import time

import pytest

from conftest import assert_ok
from engines import engines
from fastcoll.errors import FastcollError
from fastcoll.transport import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="this platform has no shared-memory path (shm.py)")
LINUX = sys.platform.startswith("linux")
COUNTERS = ["head-negative", "head-past", "tail-negative", "tail-past"]


def segments() -> set[str]:
    """fastcoll's named segments in /dev/shm ("fc" and 24 hex digits; other programs' names
    that start with "fc" are not ours)."""
    return {p for p in glob.glob("/dev/shm/fc*") if re.fullmatch(r"fc[0-9a-f]{24}", os.path.basename(p))}


# --- in one process -------------------------------------------------------------------------


def pair(capacity: int = 4096) -> tuple[shm.ShmLink, shm.ShmLink]:
    a, b = shm.pair(capacity)
    a.set_timeouts(2)
    b.set_timeouts(2)
    return a, b


@pytest.mark.parametrize("value", [-5, -(1 << 63), 4096 + 1, 1 << 62])
def test_a_head_out_of_range_is_a_malformed_peer_for_the_reader(value):
    a, b = pair()
    a.sendall(b"x" * 10)
    b.rx.ctl[shm._HEAD] = value  # what a hostile writer could publish
    with pytest.raises(shm.RingCorrupt, match=f"head {value} where this side is at 0, capacity 4096"):
        b.recv_into(bytearray(64))
    assert b.rx.ready()  # a poll finds it readable, so the reader gets to the error at once
    a.close()
    b.close()


@pytest.mark.parametrize("value", [-5, 11, 1 << 62])
def test_a_tail_out_of_range_is_a_malformed_peer_for_the_writer(value):
    a, b = pair()
    a.sendall(b"x" * 10)
    a.tx.ctl[shm._TAIL] = value  # what a hostile reader could publish (the head is at 10)
    assert not a.fits(1)  # (the send that follows reports it)
    with pytest.raises(shm.RingCorrupt, match=f"tail {value} where this side is at 10"):
        a.sendall(b"y")
    a.close()
    b.close()


def test_a_negative_start_spoils_the_ring():
    """The counters a side starts from are in memory its peer could have written first."""
    mem = bytearray(shm._segment_size(4096))
    view = memoryview(mem)[shm._PREAMBLE:]
    view[:shm._CONTROL].cast("q")[shm._TAIL] = -3
    ring = shm.Ring(view, 4096)
    with pytest.raises(shm.RingCorrupt, match="a start -3"):
        ring.get(bytearray(8))


@pytest.mark.skipif(not LINUX, reason="sealed memfds are Linux's; docs/failures.md says what holds on macOS")
def test_a_linux_segment_is_a_sealed_memfd_that_no_side_can_shrink():
    before = segments()
    where, nonce, mem, forget = shm._create(4096)
    try:
        assert segments() == before  # no name anywhere
        pid, fd = where["memfd"]
        assert pid == os.getpid() and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:fastcoll-shm")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)  # the creator
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1 << 30)  # nor grow it
        theirs = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)  # what the peer opens
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(theirs, 4096)
        finally:
            os.close(theirs)
        got = shm._attach(where, nonce, 4096, "rank 0")
        assert got is not None and got[:16] == mem[:16]
        got.close()
    finally:
        forget()
        mem.close()


@pytest.mark.skipif(not LINUX, reason="sealed memfds are Linux's")
def test_an_unsealed_memfd_is_refused():
    """A peer that offers a memfd it could still shrink is a malformed peer."""
    size = shm._segment_size(4096)
    fd = os.memfd_create("fastcoll-shm", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, shm._MAGIC + bytes(16), 0)
        with pytest.raises(FastcollError, match="rank 0 offered a shared-memory segment whose size is not sealed"):
            shm._attach({"memfd": [os.getpid(), fd]}, bytes(16), 4096, "rank 0")
    finally:
        os.close(fd)


def test_a_named_segment_loses_its_name_once_the_peer_holds_it(monkeypatch):
    """The macOS way (named POSIX shared memory), here forced: the attaching side removes the
    name, so a creator killed afterwards leaves nothing behind."""
    monkeypatch.setattr(shm, "_memfd_usable", lambda: False)
    before = segments()
    where, nonce, mem, forget = shm._create(4096)
    try:
        assert "name" in where
        if os.path.isdir("/dev/shm"):
            assert segments() - before == {"/dev/shm" + where["name"]}
        got = shm._attach(where, nonce, 4096, "rank 0")
        assert got is not None
        got.close()
        if os.path.isdir("/dev/shm"):
            assert segments() - before == set()
    finally:
        forget()  # (the name is gone already: nothing to do, and no error)
        mem.close()


# --- a hostile peer in a real job -----------------------------------------------------------


def run(launch, native: str, scenario: str):
    job = launch(2, "shm_peer_worker.py", scenario, FASTCOLL_NATIVE=native, timeout="10")
    results = job.wait(timeout=60)
    detail = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.out}\n{r.err[-3000:]}" for r in results)
    return results, detail


@pytest.mark.parametrize("native", engines())
@pytest.mark.parametrize("scenario", COUNTERS)
def test_a_counter_out_of_range_is_a_clear_error_never_a_crash(launch, native, scenario):
    results, detail = run(launch, native, scenario)
    assert_ok(results)
    assert "CORRUPTED" in results[0].out, detail
    line = next((x for x in results[1].out.splitlines() if x.startswith("ERROR ")), None)
    assert line is not None, detail
    _, cls, elapsed, message = line.split(" ", 3)
    assert cls == "PeerLostError" and "rank 0 sent a malformed frame" in message, detail
    assert "shared-memory ring counter out of range" in message and scenario.split("-")[0] in message, detail
    assert float(elapsed) < 2.0, detail  # at once, not at the 10 s timeout


@pytest.mark.skipif(not LINUX, reason="sealed memfds are Linux's; docs/failures.md says what holds on macOS")
@pytest.mark.parametrize("native", engines())
def test_the_creator_cannot_shrink_a_segment_under_its_peer(launch, native):
    results, detail = run(launch, native, "shrink")
    assert_ok(results)  # (rank 1 ended with SIGBUS when the shrink went through)
    shrink = next(x for x in results[0].out.splitlines() if x.startswith("SHRINK "))
    assert shrink == "SHRINK 0 1", detail  # one segment, and its shrink refused
    assert all("OK" in r.out for r in results), detail


def read_line(stream, word: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.1)
        if ready:
            line = stream.readline()
            if not line:
                return None
            if line.startswith(word):
                return line
    return None


@pytest.mark.skipif(not LINUX, reason="/dev/shm is Linux's; on macOS a named segment's window is documented")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_creator_killed_while_its_peer_attaches_leaves_no_segment(launch, sig):
    before = segments()
    job = launch(2, "shm_peer_worker.py", "pause", timeout="5")
    creator = job.procs[0]
    assert read_line(creator.stdout, "OFFERED", 30) is not None, "rank 0 never reached the shm-offered hook"
    time.sleep(0.3)  # rank 1 reads the offer and attaches meanwhile
    during = segments() - before
    os.killpg(creator.pid, sig)
    results = job.wait(timeout=30)
    assert results[0].code == -sig, results[0]
    assert during == set() and segments() - before == set(), (during, segments() - before)
    line = next((x for x in results[1].out.splitlines() if x.startswith("ERROR ")), None)
    assert line is not None and line.split()[1] in ("PeerLostError", "CollectiveTimeoutError"), results[1]
