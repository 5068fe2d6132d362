"""The wire format: a small msgpack header before each payload, and its bounds.

A frame is a 4-byte little-endian header length, the msgpack header, then `nbytes` raw payload
bytes. Every length read from the wire is bounded before anything is allocated, and the payload is
only ever read into a buffer the receiver sized itself, so a peer cannot make a rank allocate.
"""

from __future__ import annotations

import functools
import re
import struct
from typing import Any, NamedTuple

import msgpack

# The version of the frames and of the rendezvous, which every rank sends at init(): ranks that
# speak another refuse each other there (a MismatchError naming both versions), rather than meet
# in frames they read differently.
PROTOCOL = 2
# fastcoll's own version, which every rank sends beside PROTOCOL (fastcoll.__version__ is this): a
# leaf, so that the links can say it without importing the collectives above them.
VERSION = "0.1.0"
# The FASTCOLL_TRANSPORT values, which the ranks compare at the rendezvous: Config accepts exactly
# these, and fastcoll.transport's registry must have one entry each (it checks at import).
TRANSPORTS = ("tcp", "zmq", "rdma")
MAX_HEADER = 4096
PREFIX = struct.Struct("<I")
# Ordinary data messages are cut to at most this many bytes (the ZeroMQ message bound follows).
MAX_PIECE_BYTES = 4 << 20

DATA = 0
ABORT = 1  # the sender gave up; `sig` carries its error
CLOSE = 2  # the sender called finalize(); nothing more will come


def parse_address(text: str, what: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); a clear ValueError names `what` otherwise. The
    one form of an address, given (FASTCOLL_COORDINATOR, --coordinator) or exchanged (the
    rendezvous table)."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\s]+):(\d+)", text.strip())
    if not m:
        raise ValueError(f"{what} must be host:port, not {text!r}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 < port < 65536:
        raise ValueError(f"{what} has port {port}, outside 1-65535")
    return host, port


class Header(NamedTuple):
    """What a message claims to be: op sequence number, collective signature, chunk, size.

    A NamedTuple, not a dataclass: one is made for every message sent and received, and a
    tuple is made in a third of the time."""

    kind: int
    seq: int
    sig: str
    chunk: int
    nbytes: int


@functools.lru_cache(maxsize=1024)  # a training loop repeats a handful of signatures
def signature(kind: str, *parts: Any) -> str:
    """'all_reduce(sum,float32,(4, 8))': the `sig` of a call's headers, which every rank must agree on."""
    return kind + "(" + ",".join(map(str, parts)) + ")"


def pair_signature(sig: str, rank: int, peer: int, sends: int, receives: int) -> str:
    """The `sig` of the agreement message between job ranks `rank` and `peer` in a call whose
    counts nothing else checked (all_to_all_v's given recv_counts): the call's signature and the
    elements the pair exchanges each way, as `rank` sends and expects them, written alike from
    either end (lower rank first), so that both ranks of a pair that disagrees raise a
    MismatchError naming both views before any data moves (fc_agree.c writes the same)."""
    lo, hi, up, down = (rank, peer, sends, receives) if rank < peer else (peer, rank, receives, sends)
    return f"{sig} [elements rank {lo} -> rank {hi}: {up}, rank {hi} -> rank {lo}: {down}]"


def pack(h: Header) -> bytes:
    """Header -> length-prefixed bytes."""
    body = msgpack.packb((h.kind, h.seq, h.sig, h.chunk, h.nbytes))
    return PREFIX.pack(len(body)) + body


_INT64 = range(-(1 << 63), 1 << 63)


def unpack(body: bytes | memoryview, size: int | None = None) -> Header:
    """msgpack bytes -> Header; ValueError for anything malformed: a field of the wrong type, an
    integer outside int64, a signature that is not UTF-8, and (given the job's `size`) an ABORT
    whose chunk names no rank of the job. The native engine refuses the same (fc_wire.c)."""
    try:
        items = msgpack.unpackb(
            body, raw=True, max_str_len=MAX_HEADER, max_bin_len=0, max_array_len=8, max_map_len=0
        )
    except Exception as e:  # msgpack raises several unrelated types for garbage
        raise ValueError(f"malformed header: {e}") from None
    if not isinstance(items, list) or len(items) != 5:
        raise ValueError("malformed header: not a 5-field array")
    kind, seq, sig, chunk, nbytes = items
    if not (
        type(kind) is int and kind in (DATA, ABORT, CLOSE)
        and type(seq) is int and seq in _INT64
        and isinstance(sig, bytes)
        and type(chunk) is int and chunk in _INT64
        and type(nbytes) is int and nbytes in _INT64
        and nbytes >= 0
    ):
        raise ValueError("malformed header: field of the wrong type")
    try:
        text = sig.decode()
    except UnicodeDecodeError:
        raise ValueError("malformed header: the signature is not UTF-8") from None
    if kind == ABORT and size is not None and not 0 <= chunk <= size:  # chunk: 1 + whom it waited for
        raise ValueError("malformed header: an ABORT that names no rank of the job")
    return Header(kind, seq, text, chunk, nbytes)


def header_length(prefix: bytes | memoryview) -> int:
    """The bounded header length from a 4-byte prefix; ValueError past MAX_HEADER."""
    (n,) = PREFIX.unpack(prefix)
    if n == 0 or n > MAX_HEADER:
        raise ValueError(f"header length {n} outside 1..{MAX_HEADER}")
    return n


def pack_message(obj: object, limit: int) -> bytes:
    """A length-prefixed msgpack control message (rendezvous), at most `limit` bytes."""
    body = msgpack.packb(obj)
    if len(body) > limit:
        raise ValueError(f"control message of {len(body)} bytes exceeds {limit}")
    return PREFIX.pack(len(body)) + body
