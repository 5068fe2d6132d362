"""Mutual challenge-response over the job's token: the token itself never crosses the wire.

    connector -> listener   HELLO: MAGIC, client nonce (32 B), claimed rank (4 B)
    listener  -> connector  CHALLENGE: server nonce (32 B), HMAC(token, "s" | both nonces | rank)
    connector -> listener   PROOF: HMAC(token, "c" | both nonces | rank)

Both nonces are fresh per connection, so a recorded handshake cannot be replayed. Every message
has a fixed size, so nothing is allocated on a stranger's say-so. The three steps are plain
functions on bytes, so that TCP sockets and ZeroMQ messages share them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
from dataclasses import dataclass

from fastcoll.errors import AuthenticationError, FastcollError
from fastcoll.transport.stream import recv_exact

MAGIC = b"FCOLL\x01"
NONCE = 32
MAC = 32
_RANK = struct.Struct("<I")
HELLO_BYTES = len(MAGIC) + NONCE + _RANK.size
CHALLENGE_BYTES = NONCE + MAC
PROOF_BYTES = MAC


@dataclass(frozen=True)
class Pending:
    """A handshake in progress: the claimed rank and both nonces."""

    rank: int
    client_nonce: bytes
    server_nonce: bytes


def _mac(token: bytes, role: bytes, p: Pending) -> bytes:
    msg = role + p.client_nonce + p.server_nonce + _RANK.pack(p.rank)
    return hmac.new(token, msg, hashlib.sha256).digest()


def hello(rank: int) -> tuple[bytes, bytes]:
    """The connector's first message, and the nonce it must remember."""
    nonce = secrets.token_bytes(NONCE)
    return MAGIC + nonce + _RANK.pack(rank), nonce


def challenge(token: bytes, message: bytes) -> tuple[bytes, Pending]:
    """The listener's answer to a HELLO; AuthenticationError for anything else."""
    if len(message) != HELLO_BYTES or not message.startswith(MAGIC):
        raise AuthenticationError("not a fastcoll handshake (bad magic or size)")
    (rank,) = _RANK.unpack(message[len(MAGIC) + NONCE :])
    p = Pending(rank, message[len(MAGIC) : len(MAGIC) + NONCE], secrets.token_bytes(NONCE))
    return p.server_nonce + _mac(token, b"s", p), p


def prove(token: bytes, rank: int, nonce: bytes, message: bytes) -> bytes:
    """The connector's proof, after checking that the listener knows the token too."""
    if len(message) != CHALLENGE_BYTES:
        raise AuthenticationError("malformed challenge from the listener")
    p = Pending(rank, nonce, message[:NONCE])
    if not hmac.compare_digest(message[NONCE:], _mac(token, b"s", p)):
        raise AuthenticationError("the listener does not know the job's token (FASTCOLL_TOKEN)")
    return _mac(token, b"c", p)


def verify(token: bytes, p: Pending, proof: bytes) -> int:
    """The rank a connector proved to be; AuthenticationError if the proof is wrong."""
    if len(proof) != PROOF_BYTES or not hmac.compare_digest(proof, _mac(token, b"c", p)):
        raise AuthenticationError(f"a connection claiming rank {p.rank} does not know the token")
    return p.rank


def client_handshake(sock: socket.socket, token: bytes, rank: int, deadline: float) -> None:
    """Prove to the listener at the other end of `sock` that we know the token, and check it."""
    first, nonce = hello(rank)
    sock.sendall(first)
    reply = recv_exact(sock, CHALLENGE_BYTES, deadline, "the listener's challenge")
    sock.sendall(prove(token, rank, nonce, reply))


def server_handshake(sock: socket.socket, token: bytes, deadline: float) -> int:
    """Check a connector's proof and return the rank it claims; AuthenticationError otherwise."""
    try:
        first = recv_exact(sock, HELLO_BYTES, deadline, "a handshake")
        reply, p = challenge(token, first)
        sock.sendall(reply)
        return verify(token, p, recv_exact(sock, PROOF_BYTES, deadline, "a handshake proof"))
    except FastcollError as e:
        if isinstance(e, AuthenticationError):
            raise
        raise AuthenticationError(f"no valid handshake: {e}") from None
