"""A connected peer that sends a malformed or truncated frame: every length read from the wire is
bounded, and the receiving rank raises a FastcollError naming the problem (never a crash, never
an allocation the frame asked for), on both engines (tests/progs/frames_worker.py)."""

from __future__ import annotations

import pytest

from engines import engines

CASES = {
    "zero-length": ("PeerLostError", "malformed frame (header length 0 outside 1..4096)"),
    "huge-length": ("PeerLostError", "malformed frame (header length 1073741824 outside 1..4096)"),
    "garbage": ("PeerLostError", "malformed frame (malformed header"),
    "not-an-array": ("PeerLostError", "malformed frame (malformed header"),
    "negative-size": ("PeerLostError", "malformed frame (malformed header"),
    "huge-payload": ("MismatchError", "expected chunk 0 of 16 bytes of all_reduce(sum,float32,(4,)) as collective #0 "
                                      "from rank 1, which sent chunk 0 of 4611686018427387904 bytes"),
    # The engines once told these apart (the native one took a signature of bad UTF-8 for another
    # call, the Python one a size past int64 for another message); a forged timeout notice named
    # "rank 4611686018427387903" as the rank that stopped answering.
    "bad-utf8-signature": ("PeerLostError", "malformed frame (malformed header: the signature is not UTF-8)"),
    "uint64-size": ("PeerLostError", "malformed frame (malformed header: field of the wrong type)"),
    "abort-naming-no-rank": ("PeerLostError", "malformed frame (malformed header: an ABORT that names no rank of "
                                              "the job)"),
    # Rank 1 exits with rank 0's data unread, so its kernel may reset the connection (which can
    # drop what was in flight) rather than end it: either way the loss is named.
    "truncated-header": ("PeerLostError", ("rank 1 closed its connection", "connection to rank 1 failed")),
    "truncated-payload": ("PeerLostError", ("rank 1 closed its connection", "connection to rank 1 failed")),
}


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_frame_is_a_clear_error(launch, case, transport, engine):
    results = launch(2, "frames_worker.py", case, transport=transport, FASTCOLL_NATIVE=engine).wait(timeout=60)
    zero = results[0]
    assert zero.code == 0, zero.err[-3000:]
    line = zero.out.strip().splitlines()[-1]
    kind, texts = CASES[case]
    assert line.startswith(f"ERROR {kind} "), line
    assert any(text in line for text in ((texts,) if isinstance(texts, str) else texts)), line
