"""Mutual challenge-response over the job's token: the token itself never crosses the wire.

    connector -> listener   MAGIC, client nonce (32 B), claimed rank (4 B)
    listener  -> connector  server nonce (32 B), HMAC(token, "s" | both nonces | rank)
    connector -> listener   HMAC(token, "c" | both nonces | rank)

Both nonces are fresh per connection, so a recorded handshake cannot be replayed. Every message
has a fixed size, so nothing is allocated on a stranger's say-so.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct

from fastcoll.errors import AuthenticationError, FastcollError
from fastcoll.transport.stream import recv_exact

log = logging.getLogger("fastcoll.auth")

MAGIC = b"FCOLL\x01"
NONCE = 32
MAC = 32
_RANK = struct.Struct("<I")


def _mac(token: bytes, role: bytes, cn: bytes, sn: bytes, rank: int) -> bytes:
    return hmac.new(token, role + cn + sn + _RANK.pack(rank), hashlib.sha256).digest()


def client_handshake(sock: socket.socket, token: bytes, rank: int, deadline: float) -> None:
    """Prove to the listener that we know the token, and check that it does too."""
    cn = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + cn + _RANK.pack(rank))
    reply = recv_exact(sock, NONCE + MAC, deadline, "the listener's challenge")
    sn, smac = reply[:NONCE], reply[NONCE:]
    if not hmac.compare_digest(smac, _mac(token, b"s", cn, sn, rank)):
        raise AuthenticationError("the listener does not know the job's token (FASTCOLL_TOKEN)")
    sock.sendall(_mac(token, b"c", cn, sn, rank))


def server_handshake(sock: socket.socket, token: bytes, deadline: float) -> int:
    """Check a connector's proof and return the rank it claims; AuthenticationError otherwise."""
    try:
        hello = recv_exact(sock, len(MAGIC) + NONCE + _RANK.size, deadline, "a handshake")
    except FastcollError as e:
        raise AuthenticationError(f"no valid handshake: {e}") from None
    if not hello.startswith(MAGIC):
        raise AuthenticationError("not a fastcoll handshake (bad magic)")
    cn = hello[len(MAGIC) : len(MAGIC) + NONCE]
    (rank,) = _RANK.unpack(hello[len(MAGIC) + NONCE :])
    sn = secrets.token_bytes(NONCE)
    sock.sendall(sn + _mac(token, b"s", cn, sn, rank))
    try:
        proof = recv_exact(sock, MAC, deadline, "a handshake proof")
    except FastcollError as e:
        raise AuthenticationError(f"no handshake proof: {e}") from None
    if not hmac.compare_digest(proof, _mac(token, b"c", cn, sn, rank)):
        raise AuthenticationError(f"a connection claiming rank {rank} does not know the token")
    return rank
