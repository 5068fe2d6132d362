"""The native engine's links behind one interface (fastcoll/engine/csrc/links/fc_link.h): the kinds a
build has, Engine.links.add's keywords and its errors, frames across each kind between two engines
in this process, and the order NativeEngine.over adds links in."""

from __future__ import annotations

import mmap
import os
import socket
import threading

import pytest

from engines import native_missing
from fastcoll import config

pytestmark = pytest.mark.skipif(native_missing() is not None, reason=f"no native engine: {native_missing()}")

RING_CONTROL = 384  # fc_shmring.h's FC_RING_CONTROL
CAPACITY = 4096


def _native():
    from fastcoll.engine import _native

    return _native


def _engine(rank: int):
    return _native().Engine(rank, 2, 1, 0, 0, threading.main_thread().ident, 0)


def test_the_build_names_its_link_kinds():
    kinds = _native().link_kinds()
    assert isinstance(kinds, tuple) and {"tcp", "shm"} <= set(kinds), kinds


def test_an_unknown_kind_is_a_value_error_naming_it_and_the_kinds_built():
    e = _engine(0)
    a, b = socket.socketpair()
    with a, b, pytest.raises(ValueError, match=r"no link kind 'pigeon' in this build \(it has tcp, shm"):
        e.links.add(1, 0, a.fileno(), kind="pigeon")
    e.close(0.0, 0.0)


def test_a_failed_open_is_a_runtime_error_with_the_kinds_reason_and_leaves_the_socket():
    e = _engine(0)
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(RuntimeError, match="the shm link to rank 1 could not open: .*needs a segment"):
            e.links.add(1, 0, a.fileno(), kind="shm")
        os.fstat(a.fileno())  # still open: the caller's to close
        with pytest.raises(ValueError, match="bad peer 0 or channel 0"):
            e.links.add(0, 0, a.fileno())
        os.fstat(a.fileno())
    e.close(0.0, 0.0)


def _pair(kind: str):
    """Engines of ranks 0 and 1 joined by one link of `kind`, and what must outlive them."""
    e0, e1 = _engine(0), _engine(1)
    a, b = socket.socketpair()
    if kind == "shm":
        seg = mmap.mmap(-1, 2 * (RING_CONTROL + CAPACITY))
        far = RING_CONTROL + CAPACITY
        e0.links.add(1, 0, a.detach(), kind="shm", segment=seg, tx_offset=0, rx_offset=far, capacity=CAPACITY)
        e1.links.add(0, 0, b.detach(), kind="shm", segment=seg, tx_offset=far, rx_offset=0, capacity=CAPACITY)
        return e0, e1, seg
    e0.links.add(1, 0, a.detach(), kind="tcp")
    e1.links.add(0, 0, b.detach())  # (tcp: the default)
    return e0, e1, None


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_frames_cross_each_kind_whole_and_in_order(kind):
    """Small payloads through the link's buffer, large ones straight into place (tcp) or through a
    ring far smaller than they are (shm: the writer waits for room and the reader rings)."""
    e0, e1, seg = _pair(kind)
    payloads = [os.urandom(n) for n in (0, 7, 4095, 4096, 100_000, 1 << 20, 33)]
    flushed = []
    for i, p in enumerate(payloads):
        e0.links.send(1, 0, i, b"sig", 0, p or None)
    sender = threading.Thread(target=lambda: flushed.append(e0.links.flush(10.0)))
    sender.start()
    try:
        for i, p in enumerate(payloads):
            kind_, seq, sig, chunk, nbytes = e1.links.next_header(0, 0, 10.0)
            assert (kind_, seq, sig, chunk, nbytes) == (0, i, b"sig", 0, len(p))
            out = bytearray(len(p))
            if p:
                e1.links.read_payload(0, 0, out, 10.0)
            assert bytes(out) == p
    finally:
        sender.join(15)
        e0.close(1.0, 0.0)
        e1.close(1.0, 0.0)
    assert flushed and not sender.is_alive()
    if seg is not None:
        seg.close()


def test_over_adds_links_in_ascending_peer_and_channel_order(monkeypatch):
    """A kind whose open waits for the peer's links.add (verbs) needs every rank to add links in
    one order, or two ranks each wait for the other: over sorts them, whatever order it is given."""
    from fastcoll.engine import native
    added = []

    class Engine:  # records the links in the order they come, and fails at the last
        def __init__(self, **kw):
            self.links = self

        def add(self, peer, channel, fd, **kw):
            added.append((peer, channel, kw.get("kind")))
            if len(added) == 4:
                raise OSError("enough")

        def close(self, *args):
            pass

    class Link:
        kind, segment = "tcp", None

        def __init__(self, sock):
            self.sock = sock

        def close(self):
            self.sock.close()

    monkeypatch.setattr(native._native, "Engine", Engine)
    socks = [socket.socketpair() for _ in range(4)]
    try:
        links = {2: [Link(socks[0][0]), Link(socks[1][0])], 1: [Link(socks[2][0]), Link(socks[3][0])]}
        with pytest.raises(OSError, match="enough"):
            native.NativeEngine.over(config.Config.from_env({}), links)
    finally:
        for a, b in socks:
            a.close()
            b.close()
    assert added == [(1, 0, "tcp"), (1, 1, "tcp"), (2, 0, "tcp"), (2, 1, "tcp")]
