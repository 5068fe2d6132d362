"""Blocking socket helpers with deadlines, shared by the rendezvous, the handshake and TCP."""

from __future__ import annotations

import os
import socket
import time

import msgpack

from fastcoll import wire
from fastcoll.errors import CollectiveTimeoutError, PeerLostError


# A plain int: socket.MSG_DONTWAIT is an IntFlag, whose `&` costs a microsecond in Python code.
DONTWAIT = int(socket.MSG_DONTWAIT)
# Give the core (and the GIL) to whoever needs it, while waiting on a peer without sleeping.
yield_cpu = getattr(os, "sched_yield", lambda: None)


def remaining(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic based), never negative."""
    return max(0.0, deadline - time.monotonic())


def recv_exact(sock: socket.socket, n: int, deadline: float, what: str = "peer") -> bytes:
    """Exactly n bytes, or PeerLostError on EOF and CollectiveTimeoutError past the deadline."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = remaining(deadline)
        if left <= 0:
            raise CollectiveTimeoutError(f"timed out waiting for {what}")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            raise CollectiveTimeoutError(f"timed out waiting for {what}") from None
        except OSError as e:
            raise PeerLostError(f"connection to {what} failed: {e}") from None
        if k == 0:
            raise PeerLostError(f"{what} closed the connection")
        got += k
    return bytes(buf)


def send_message(sock: socket.socket, obj: object, limit: int) -> None:
    """Send one length-prefixed msgpack control message."""
    sock.sendall(wire.pack_message(obj, limit))


def recv_message(sock: socket.socket, limit: int, deadline: float, what: str) -> object:
    """Receive one control message of at most `limit` bytes; ValueError when it claims more."""
    (n,) = wire.PREFIX.unpack(recv_exact(sock, wire.PREFIX.size, deadline, what))
    if n > limit:
        raise ValueError(f"{what} sent a {n}-byte control message, over the {limit}-byte bound")
    try:
        return msgpack.unpackb(recv_exact(sock, n, deadline, what), max_bin_len=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ValueError(f"{what} sent a malformed control message: {e}") from None
