"""One rank of tests/test_frames.py: rank 1 sends rank 0 a frame that breaks the wire's rules
through the engine's test-only send_raw (as a buggy or hostile peer that passed the handshake
would); rank 0, waiting in all_reduce, must raise a FastcollError that names the problem, and
exit as usual.

    frames_worker.py CASE
"""

from __future__ import annotations

import os
import struct
import sys

import msgpack
import numpy as np

import fastcoll
from fastcoll import wire

CASE = sys.argv[1]
SIG = "all_reduce(sum,float32,(4,))"  # what rank 0 calls: its collective #0


def body(items: object) -> bytes:
    packed = msgpack.packb(items)
    return wire.PREFIX.pack(len(packed)) + packed


def raw(packed: bytes) -> bytes:
    return wire.PREFIX.pack(len(packed)) + packed


FRAMES = {
    "zero-length": struct.pack("<I", 0),
    "huge-length": struct.pack("<I", 1 << 30),
    "garbage": struct.pack("<I", 8) + b"\xc1" * 8,
    "not-an-array": body(12345),
    "negative-size": body([wire.DATA, 0, SIG, 0, -5]),
    "huge-payload": wire.pack(wire.Header(wire.DATA, 0, SIG, 0, 1 << 62)),
    "bad-utf8-signature": raw(b"\x95\x00\x00\xa2\xff\xfe\x00\x10"),  # [0, 0, a 2-byte str of no UTF-8, 0, 16]
    "uint64-size": body([wire.DATA, 0, SIG, 0, (1 << 64) - 1]),
    "abort-naming-no-rank": wire.pack(wire.Header(wire.ABORT, -1, "rank 1: CollectiveTimeoutError: forged",
                                                  1 << 62, 0)),
    "truncated-header": struct.pack("<I", 50) + b"\x95\x00",
    "truncated-payload": wire.pack(wire.Header(wire.DATA, 0, SIG, 0, 16)) + b"\0" * 5,
}

g = fastcoll.init()
if g.rank() == 1:
    g._job.engine.transport.send_raw(0, FRAMES[CASE])
    if CASE.startswith("truncated"):
        os._exit(0)  # the rest never comes: the connection ends mid-frame
    try:  # until rank 0, having given up, tells this rank so (no finalize: its CLOSE would race)
        fastcoll.barrier(timeout=20)
    except fastcoll.FastcollError:
        pass
    os._exit(0)
try:
    fastcoll.all_reduce(np.ones(4, np.float32), timeout=20)
    print("NOERROR", flush=True)
except fastcoll.FastcollError as e:
    print("ERROR", type(e).__name__, str(e).replace("\n", " "), flush=True)
fastcoll.finalize()
