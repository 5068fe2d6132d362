"""Exceptions raised by fastcoll. Every error a collective can raise derives from FastcollError."""

from __future__ import annotations


class FastcollError(RuntimeError):
    """Base class of every fastcoll error."""


class PeerLostError(FastcollError):
    """A peer closed its connection or died; the group cannot be used any more. `peer`: the
    job rank lost, where it is known (the job names its host in the message it raises)."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class CollectiveTimeoutError(FastcollError):
    """A peer did not answer within the timeout; the group cannot be used any more."""


class MismatchError(FastcollError):
    """Ranks disagree on a collective's kind, shape, dtype, op or call order."""


class AuthenticationError(FastcollError):
    """A connection could not prove that it knows the job's token."""
