"""The interface every transport gives the algorithms, and the checks they all share.

A transport connects this rank to every peer. `send` hands a message over (possibly finishing in
the background: the payload must stay unchanged until `flush`), `recv` waits for the next message
from one peer (`recv_first`: from whichever of several sends first), checks that its header is the one this rank expects, and reads the payload into
a buffer the caller sized. While waiting on one peer it watches all of them, so an abort or a
closed connection anywhere ends the wait at once.
"""

from __future__ import annotations

import abc
import logging
import re
import time
from typing import Sequence

from fastcoll import errors
from fastcoll.errors import FastcollError, MismatchError
from fastcoll.wire import ABORT, DATA, Header

log = logging.getLogger("fastcoll.transport")

# After an error, how long finalize() waits for the abort notice to leave for each peer (a
# peer may be reading the rest of a large message first), and for a peer that is not reading
# at all (stopped) before it closes anyway. ZeroMQ lingers as long.
LAST_WORD_SECONDS = 1.0
# What a timed-out rank drops unread of each peer's messages already delivered before it compares
# notices: at most this many messages, each of at most this many bytes, each read within this time.
STALE_MESSAGES = 64
STALE_BYTES = 1 << 20
STALE_READ_SECONDS = 0.05

_ERRORS = {
    cls.__name__: cls
    for cls in (
        errors.PeerLostError,
        errors.CollectiveTimeoutError,
        errors.MismatchError,
        errors.AuthenticationError,
        errors.FastcollError,
    )
}


# What a timeout's message says when the call's limit ran out while data still moved (no rank
# stopped: fastcoll/transport/tcp.py words it), which a peer that hears of it reads too.
STILL_MOVING = "the call's time limit ran out while"


def describe(seq: int, sig: str) -> str:
    """'all_reduce(sum, float32, (4,)) as collective #3' for error messages."""
    return f"{sig} as collective #{seq}"


class Transport(abc.ABC):
    """Messages between this rank and each of its peers."""

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self.aborted = False  # abort() was called: the connections carry nothing more
        self.interrupted: str | None = None  # interrupt(): why the call under way must end

    def interrupt(self, why: str) -> None:
        """From another thread: make the call under way raise FastcollError(why) at its next
        wait (within 0.2 s), so that the thread running it breaks the job and tells the peers."""
        self.interrupted = why

    @abc.abstractmethod
    def send(self, peer: int, header: Header, payload: memoryview | None, deadline: float | None = None) -> None:
        """Queue a message to `peer`; the payload must not change until `flush()` returns. What
        is sent before returning waits on the peer until `deadline` at most."""

    @abc.abstractmethod
    def flush(self, deadline: float | None = None) -> None:
        """Wait until every queued send has left this rank's buffers; CollectiveTimeoutError
        past `deadline` (None: FASTCOLL_TIMEOUT from now, or no bound of its own)."""

    @abc.abstractmethod
    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        """The next header from `peer` (message `chunk`, of `nbytes` if it is the one expected),
        watching every peer meanwhile."""

    @abc.abstractmethod
    def _read_payload(self, peer: int, chunk: int, out: memoryview, deadline: float) -> None:
        """The payload that follows the header just taken from `peer`, into `out`, until
        `deadline` (the call's: CollectiveTimeoutError past it, naming the direction)."""

    @abc.abstractmethod
    def _send_abort(self, header: Header) -> None:
        """Best effort: tell every peer this rank gave up, then stop sending."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every socket."""

    def send_failed(self) -> bool:
        """Whether a send to some peer has failed already (`flush` reports it): a transport whose
        sends can fail before flush() says so here."""
        return False

    def end_at_exit(self) -> None:
        """The interpreter is exiting and nothing closed this transport, nor uses it now: stop
        what would run on past the objects it reads (a transport with I/O threads of its own)."""

    def connections(self) -> list[tuple[int, int, str, object, object]]:
        """Each connection as (peer, channel, kind, this end's address, the peer's); none for a
        transport without connections of its own."""
        return []

    def send_raw(self, peer: int, data: bytes) -> None:
        """For tests only: `data` as it is on the connection to `peer` (see Engine.send_raw)."""
        raise NotImplementedError(f"{type(self).__name__} cannot send raw bytes")

    def describe(self) -> str:
        """What carries this rank's messages, in a few words ('tcp', 'zmq', ...)."""
        return type(self).__name__.removesuffix("Transport").lower()

    def _first_header(self, wanted: Sequence[tuple[int, int]], deadline: float, nbytes: int = 0) -> tuple[int, Header]:
        """The header of whichever of `wanted`'s messages (peer, chunk) comes first, and its index
        in `wanted`, watching every peer meanwhile. This one waits for them in the order given:
        a transport that can wait for several peers at once says so by its own."""
        peer, chunk = wanted[0]
        return 0, self._next_header(peer, chunk, deadline, nbytes)

    def recv(
        self, peer: int, seq: int, sig: str, chunk: int, out: memoryview | None, deadline: float, tracer=None
    ) -> None:
        """Receive message (seq, sig, chunk) from `peer` into `out`; MismatchError if it is another.

        With a tracer, the time spent waiting for the header and reading the payload are
        recorded as `wait` and `receive`."""
        t0 = tracer.now() if tracer is not None else 0
        h = self._next_header(peer, chunk, deadline, 0 if out is None else out.nbytes)
        self._take_message(peer, seq, sig, chunk, out, h, deadline, tracer, t0)

    def recv_first(
        self, wanted: Sequence[tuple[int, int, memoryview | None]], seq: int, sig: str, deadline: float, tracer=None
    ) -> int:
        """Receive whichever of `wanted`'s messages (peer, chunk, out) comes first, as `recv`
        does; its index in `wanted`. A rank that needs a message from each of several peers takes
        them so, and leaves none unread ahead of what its peer says next (a timeout's notice,
        which the rank must hear while it waits on another: fastcoll/diagnosis.py)."""
        t0 = tracer.now() if tracer is not None else 0
        nbytes = max(0 if out is None else out.nbytes for _, _, out in wanted)
        i, h = self._first_header([(peer, chunk) for peer, chunk, _ in wanted], deadline, nbytes)
        peer, chunk, out = wanted[i]
        self._take_message(peer, seq, sig, chunk, out, h, deadline, tracer, t0)
        return i

    def _take_message(self, peer: int, seq: int, sig: str, chunk: int, out: memoryview | None, h: Header,
                      deadline: float, tracer, t0: float) -> None:
        """Check the header `h` just taken from `peer` against the message expected, and read its
        payload into `out` (see `recv`)."""
        nbytes = 0 if out is None else out.nbytes
        if tracer is not None:
            tracer.span("wait", t0, peer=peer)
        if h.seq != seq or h.sig != sig:
            raise other_call(self.rank, peer, seq, sig, h.seq, h.sig)
        if h.chunk != chunk or h.nbytes != nbytes:
            raise other_chunk(self.rank, peer, seq, sig, chunk, nbytes, h.chunk, h.nbytes)
        if nbytes:
            t0 = tracer.now() if tracer is not None else 0
            self._read_payload(peer, chunk, out, deadline)
            if tracer is not None:
                tracer.span("receive", t0, peer=peer, bytes=nbytes)

    def abort(self, error: FastcollError) -> None:
        """Tell every peer why this rank stopped, so that they raise the same kind of error. A
        timeout's notice also carries whom this rank was waiting for (in the header's chunk, as
        that rank + 1), which the peers use to find who stopped answering (fastcoll/diagnosis.py)."""
        self.aborted = True
        try:
            # A peer's error that reached this rank goes on as that peer said it ("rank 1:
            # PeerLostError: ..."), so that every rank names the first cause once, not a chain of
            # ranks that passed it on.
            from_peer = getattr(error, "from_peer", False)
            note = str(error) if from_peer else f"rank {self.rank}: {type(error).__name__}: {error}"
            waits = getattr(error, "waiting_for", None)
            self._send_abort(Header(ABORT, -1, note[:2000], 0 if waits is None else waits + 1, 0))
        except Exception as e:  # the peers may be gone already; nothing more to do
            log.debug("abort notice not delivered: %s", e)

    def notices(self, deadline: float, reports: dict, lost: set) -> None:
        """After a timeout (this rank's abort notice sent): until `deadline`, collect every peer's
        abort notice into `reports` (peer -> whom it waited for, None if not a wait), and the
        peers whose connection ended into `lost`. A peer that sends data instead is alive: it
        goes into `reports` as None, its data left unread. Data already here when this rank gave
        up says nothing of the peer now (a rank whose own network failed holds what came before):
        it is read past first (`_read_past_stale`)."""
        self._read_past_stale(reports, lost)
        while True:
            waiting = [p for p in range(self.size) if p != self.rank and p not in reports and p not in lost]
            if not waiting or time.monotonic() >= deadline:
                return
            peer = waiting[0]
            try:
                self._keep_unread(peer, 0, self._next_header(peer, 0, deadline))
                reports[peer] = None  # it sent data: it answers
            except errors.FastcollError as e:
                self._note(peer, e, reports, lost)

    def _read_past_stale(self, reports: dict, lost: set) -> None:
        """Take every message each peer has already delivered, without waiting, and drop it: a
        notice or a loss among them is noted. A peer whose message is too large to drop cheaply
        (kept unread), or is still arriving (it sends now), counts as answering, as before."""
        now = time.monotonic()
        scratch = None  # one buffer for every dropped payload, made at the first
        for peer in range(self.size):
            if peer == self.rank:
                continue
            for _ in range(STALE_MESSAGES):
                if peer in reports or peer in lost:
                    break
                try:
                    h = self._next_header(peer, 0, now)
                except errors.FastcollError as e:
                    if isinstance(e, errors.CollectiveTimeoutError) and not getattr(e, "from_peer", False):
                        break  # nothing more here yet (a peer's notice is a timeout too, from_peer)
                    self._note(peer, e, reports, lost)
                    continue
                if h.nbytes > STALE_BYTES:
                    self._keep_unread(peer, 0, h)
                    reports[peer] = None
                    break
                if not h.nbytes:
                    continue
                scratch = scratch or memoryview(bytearray(STALE_BYTES))
                try:
                    self._read_payload(peer, 0, scratch[:h.nbytes], now + STALE_READ_SECONDS)
                except errors.FastcollError:
                    reports[peer] = None  # the stream stays mid-payload: read no further
                    break

    @staticmethod
    def _note(peer: int, e: FastcollError, reports: dict, lost: set) -> None:
        """What a read from `peer` during the notices' window raised, into reports or lost."""
        sender = getattr(e, "sender", None)
        if getattr(e, "from_peer", False):
            # (while this rank waited for `peer`, another peer's notice may have come)
            reports[peer if sender is None else sender] = getattr(e, "sender_waits", None)
        elif isinstance(e, errors.PeerLostError):
            lost.add(peer)
        elif not isinstance(e, errors.CollectiveTimeoutError):
            reports[peer] = None  # a peer that broke some other way has still answered

    def _keep_unread(self, peer: int, chunk: int, header: Header) -> None:
        """Hold a header that `_next_header` returned but whose payload will not be read, so that
        the payload is never taken for the next header. Transports that keep each message whole
        (ZeroMQ, in-process) need nothing: the group is broken and reads no more."""

    def explain_broken(self, broken: dict[int, FastcollError]) -> None:
        """Raise why sending to a peer failed. A peer that gave up sent its ABORT (or CLOSE)
        before closing, so what it sent is read first: its error, not the broken pipe it left,
        is what every rank reports. Only if it sent nothing more is `broken`'s error raised."""
        peer, err = next(iter(broken.items()))
        deadline = time.monotonic() + 0.5
        try:
            self._next_header(peer, 0, deadline)
        except errors.CollectiveTimeoutError:
            if time.monotonic() < deadline:
                raise  # a peer's abort notice, not this short wait running out
        raise err



# A point-to-point message's signature, after any group's prefix: both ends name it send(src,
# dst, dtype, shape) so that they match (fastcoll/exchange.py).
_SEND = re.compile(r"^((?:s\d+(?:c\d+|g)/)*)send\(")


def as_received(sig: str) -> str:
    """This rank's call as its messages name it, where this rank receives: a point-to-point
    message's `send(src,dst,...)` is this rank's `recv(src,dst,...)` (a rank only reads a message
    of that signature in a recv), the rest as they are."""
    return _SEND.sub(r"\1recv(", sig, count=1)


def other_call(me: int, peer: int, seq: int, sig: str, their_seq: int, their_sig: str) -> MismatchError:
    """The error when `peer` sent a message of another call than this rank's."""
    return MismatchError(
        f"rank {me} called {describe(seq, as_received(sig))} but rank {peer} called {describe(their_seq, their_sig)}"
        + _threads_hint(sig, their_sig))


def other_chunk(me: int, peer: int, seq: int, sig: str, chunk: int, nbytes: int, their_chunk: int,
                their_nbytes: int) -> MismatchError:
    """The error when `peer` sent another message of this rank's call than the one expected."""
    return MismatchError(
        f"rank {me} expected chunk {chunk} of {nbytes} bytes of {describe(seq, as_received(sig))} "
        f"from rank {peer}, which sent chunk {their_chunk} of {their_nbytes} bytes")


def _threads_hint(mine: str, theirs: str) -> str:
    """What to do when the calls that met came from different threads (Group._thread_tag)."""
    tag = " in thread "
    if tag not in mine and tag not in theirs or mine.partition(tag)[2] == theirs.partition(tag)[2]:
        return ""
    return (": calls of different threads met. A group runs the collectives of one thread at a "
            "time, in the same order on every rank; give each thread its own group (docs/failures.md, "
            "Threads), or name the threads alike on every rank when one hands the group to the next")


def abort_error(header: Header, sender: int | None = None, waiting_for: int | None = None) -> FastcollError:
    """The error an ABORT header reports: 'rank 1: <Class>: text' keeps its class. `sender` is the
    rank it came from, `waiting_for` whom this rank was waiting for when it came."""
    message = header.sig
    _, _, rest = message.partition(": ")
    name, sep, _ = rest.partition(": ")
    cls = _ERRORS.get(name, errors.FastcollError) if sep else errors.FastcollError
    err = cls(message)
    err.from_peer = True  # a peer's error, told to this rank: not this rank's own wait running out
    err.sender = sender
    err.sender_waits = header.chunk - 1 if header.chunk > 0 else None  # whom the sender waited for
    err.waiting_for = waiting_for
    err.moving = STILL_MOVING in message  # the sender's limit ran out while data still moved
    return err


def timeout_notice(header: Header) -> bool:
    """Whether an ABORT says its sender's wait ran out (it carries whom it waited for): every
    rank that hears it stops waiting at once, so that the ranks compare their waits together."""
    return header.kind == ABORT and header.chunk > 0


def data_header(seq: int, sig: str, chunk: int, nbytes: int) -> Header:
    """The header of an ordinary data message."""
    return Header(DATA, seq, sig, chunk, nbytes)
