"""The TCP transport: authenticated connections to every peer, msgpack-framed messages.

Each connection is a link (fastcoll/transport/link.py): a socket with TCP_NODELAY, or, between
two ranks of one host, a pair of shared-memory rings behind the same calls
(fastcoll/transport/shm.py). Small messages go out inline in one `sendmsg` (header and payload
gathered, no copy); large ones go to a sender thread so that a rank can send to its right
neighbour while it receives from its left one (socket calls release the GIL). Receives read into
the caller's preallocated buffer; a small per-peer buffer only batches headers and small
payloads into few system calls.

`connect(config, caps, deadline)` sets the transport up: a listener, the rendezvous, a full mesh
of `FASTCOLL_CONNECTIONS` connections per peer, then the upgrade to shared memory.
"""

from __future__ import annotations

import array
import collections
import fcntl
import functools
import math
import select
import socket
import termios
import threading
import time
from typing import Any, Callable, Sequence

from fastcoll import diagnosis, testhooks, wire
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.transport import rdma, rendezvous, shm
from fastcoll.transport.base import LAST_WORD_SECONDS, STILL_MOVING, Transport, abort_error, log, timeout_notice
from fastcoll.transport.link import SocketLink
from fastcoll.transport.listen import AuthListener, bind_hosts
from fastcoll.transport.stream import DONTWAIT, remaining, yield_cpu
from fastcoll.wire import ABORT, CLOSE, Header

INLINE_BYTES = 64 * 1024
READ_BUFFER = 256 * 1024
# A connection's claimed id in the handshake: rank + channel * _CHANNEL_STRIDE.
_CHANNEL_STRIDE = 1 << 16
# A blocking send or receive on a link gives up after this long (the links' kernel timeouts,
# SO_SNDTIMEO/SO_RCVTIMEO, and shared memory's twin) and looks at the call's deadline again, so
# a peer that stalls in the middle of a message ends the call at its deadline, not at some
# FASTCOLL_TIMEOUT later. Costs nothing while data flows.
SLICE_SECONDS = 0.05
# A link whose bytes moved within this long before a wait ran out was still moving: the call's
# limit was too short for it, and no rank stopped (a live peer on a loaded host can pause for tens
# of milliseconds; one that stopped has moved nothing since, a slice at least).
STILL_MOVING_SECONDS = 0.1
# Linux: the bytes a TCP socket holds that its peer has not acknowledged yet.
_OUTQ = getattr(termios, "TIOCOUTQ", None)


def _lost(peer: int, e: BaseException) -> FastcollError:
    if isinstance(e, (socket.timeout, BlockingIOError)):
        return diagnosis.timed_out(f"rank {peer} did not answer in time", peer)
    if isinstance(e, shm.RingCorrupt):  # said as the native engine says it
        return PeerLostError(f"rank {peer} sent a malformed frame ({e.strerror}); dropping it", peer)
    return PeerLostError(f"connection to rank {peer} failed: {e}", peer)


def send_timeout(me: int, peer: int | None, idle: float | None = None) -> CollectiveTimeoutError:
    """A send's wait ran out; `idle`: how long before that data last moved both ways between
    this rank and the peer (None: not both ways). Bytes that leave prove nothing by themselves
    (the kernel's buffers take them from a peer that stopped); with the peer's bytes arriving too
    within STILL_MOVING_SECONDS, the call's limit was too short for it, and no rank stopped."""
    who = "a peer" if peer is None else f"rank {peer}"
    if idle is not None and idle < STILL_MOVING_SECONDS:
        return diagnosis.timed_out(
            f"rank {me} timed out sending to {who}: {STILL_MOVING} data still moved both ways "
            f"between them (until {idle:.3f} s before)", peer, moving=True)
    return diagnosis.timed_out(f"rank {me} timed out sending to {who}, which stopped taking data", peer)


def wait_timeout(me: int, peer: int, idle: float | None) -> CollectiveTimeoutError:
    """A wait for peer's next message ran out, `idle` seconds after a payload of that link last
    moved (None: none has): within STILL_MOVING_SECONDS its data was still arriving."""
    if idle is not None and idle < STILL_MOVING_SECONDS:
        return diagnosis.timed_out(
            f"rank {me} timed out waiting for rank {peer}'s next message: {STILL_MOVING} its data "
            f"was still arriving (the last bytes came {idle:.3f} s before)", peer, moving=True)
    return diagnosis.timed_out(f"rank {me} timed out waiting for rank {peer}, which did not answer", peer)


def receive_timeout(me: int, peer: int, got: int, total: int, idle: float) -> CollectiveTimeoutError:
    """A payload's wait ran out with `got` of `total` bytes here, the last `idle` seconds before:
    within STILL_MOVING_SECONDS the message was still arriving (the limit was too short for it);
    otherwise the sender stopped in the middle of it."""
    if idle < STILL_MOVING_SECONDS:
        return diagnosis.timed_out(
            f"rank {me} timed out receiving from rank {peer}: {STILL_MOVING} its message was still "
            f"arriving ({got} of {total} bytes arrived, the last {idle:.3f} s before)",
            peer, moving=True)
    return diagnosis.timed_out(
        f"rank {me} timed out receiving from rank {peer}, which stopped sending in the middle of a "
        f"message ({got} of {total} bytes arrived)", peer)


def _write(link: Any, data: Any, deadline: Callable[[], float], me: int, peer: int,
           between: Callable[[], None] | None = None, moved: Callable[[], None] | None = None) -> None:
    """All of `data` on `link`, however slowly the peer reads, until deadline() passes (read
    again after each slice that saw no room); then CollectiveTimeoutError, with the stream cut
    in the middle of the message. `between()` runs after each slice that saw no room, `moved()`
    after each that wrote bytes."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    done, n = 0, view.nbytes
    while done < n:
        try:
            sent = link.send(view[done:])
        except (BlockingIOError, socket.timeout):  # a slice went by without room
            sent = 0
        if sent:
            done += sent
            if moved is not None:
                moved()
        else:
            if time.monotonic() >= deadline():
                raise send_timeout(me, peer) from None
            if between is not None:
                between()


def _rest(frame: bytes, payload: memoryview | None, sent: int) -> tuple[bytes, memoryview | None]:
    """What is left of the message `frame` + `payload` after its first `sent` bytes."""
    if sent < len(frame):
        return frame[sent:], payload
    rest = payload if payload.format == "B" and payload.ndim == 1 else payload.cast("B")
    return b"", rest[sent - len(frame):]


class _Reader:
    """Per-peer receive buffer: headers and small payloads arrive in as few recv calls as possible."""

    def __init__(self, sock: Any, peer: int, me: int = 0, size: int | None = None):
        self.sock = sock  # a link
        self.peer = peer
        self.me = me
        self.size = size  # the job's: an ABORT naming a rank past it is malformed
        self.moved_at: float | None = None  # when payload bytes last arrived (read_into)
        self.buf = bytearray(READ_BUFFER)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0

    def _compact(self) -> None:
        n = self.end - self.start
        self.view[:n] = self.view[self.start : self.end]
        self.start, self.end = 0, n

    def fill(self, flags: int = 0) -> None:
        """Read what the socket has (call only when it is readable, or with MSG_DONTWAIT)."""
        if self.end == len(self.buf):
            self._compact()
        try:
            k = self.sock.recv_into(self.view[self.end :], 0, flags)
        except BlockingIOError:
            if flags:
                return  # nothing there yet
            raise _lost(self.peer, BlockingIOError()) from None
        except OSError as e:
            if self._complete():
                return
            raise _lost(self.peer, e) from None
        if k == 0:
            if self._complete():
                return  # what the peer sent before it closed (an ABORT, a CLOSE) is read first
            raise PeerLostError(f"rank {self.peer} closed its connection (it exited or was killed)", self.peer)
        self.end += k

    def _complete(self) -> bool:
        """True when the buffer holds a whole header (or a bad prefix that parse() reports)."""
        avail = self.end - self.start
        if avail < wire.PREFIX.size:
            return False
        try:
            n = wire.header_length(self.view[self.start : self.start + wire.PREFIX.size])
        except ValueError:
            return True
        return avail >= wire.PREFIX.size + n

    def parse(self) -> Header | None:
        """The next complete header in the buffer, if there is one."""
        avail = self.end - self.start
        if avail < wire.PREFIX.size:
            return None
        try:
            n = wire.header_length(self.view[self.start : self.start + wire.PREFIX.size])
            if avail < wire.PREFIX.size + n:
                if self.start + wire.PREFIX.size + n > len(self.buf):
                    self._compact()
                return None
            body = self.view[self.start + wire.PREFIX.size : self.start + wire.PREFIX.size + n]
            h = wire.unpack(body, self.size)
        except ValueError as e:
            raise PeerLostError(f"rank {self.peer} sent a malformed frame ({e}); dropping it", self.peer) from None
        self.start += wire.PREFIX.size + n
        return h

    def read_into(self, out: memoryview, deadline: float = math.inf, idle: Callable[[], None] | None = None) -> None:
        """Exactly len(out) payload bytes: first what is buffered, then straight from the socket,
        until `deadline` (CollectiveTimeoutError then: the peer stopped in mid-message). `idle()`
        runs after each slice that brought nothing (it may raise to end the wait)."""
        out = out.cast("B") if out.format != "B" or out.ndim != 1 else out
        n = out.nbytes
        k = min(self.end - self.start, n)
        out[:k] = self.view[self.start : self.start + k]
        self.start += k
        if self.start == self.end:
            self.start = self.end = 0
        moved_at = time.monotonic()
        if k:
            self.moved_at = moved_at
        while k < n:
            try:
                got = self.sock.recv_into(out[k:])
            except (BlockingIOError, socket.timeout):  # a slice went by without data
                now = time.monotonic()
                if now >= deadline:
                    raise receive_timeout(self.me, self.peer, k, n, now - moved_at) from None
                if idle is not None:
                    idle()
                continue
            except OSError as e:
                raise _lost(self.peer, e) from None
            if got == 0:
                raise PeerLostError(f"rank {self.peer} closed its connection mid-message", self.peer)
            k += got
            moved_at = self.moved_at = time.monotonic()


class _Sender:
    """A thread that sends large messages in order, so that receiving goes on meanwhile.

    It waits on a slow peer for as long as it takes: the caller bounds the call (flush() takes
    the call's deadline). Only once the job aborts (`abort`) or closes does the message going
    out get a bound of its own, after which the thread says the last words (the ABORT) on the
    links of its channel. A link with no message half-written on it hears them at once, between
    two slices of the message that waits (a peer that stopped must not keep the others from
    learning of the abort)."""

    def __init__(self, me: int = 0, cut: set | None = None):
        self._me = me
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._outstanding = 0
        self.broken: dict[int, FastcollError] = {}  # peers whose connection broke: sends dropped
        self._cut = set() if cut is None else cut  # links cut in the middle of a message
        self._half: set = set()  # links whose message the caller began: the rest is queued here
        self._closed = False
        self._current_peer: int | None = None  # whom the message going out now is for
        self._stop_at = math.inf  # when the message going out now is given up (abort, close)
        self._last: tuple[bytes, list[tuple[int, Any]]] | None = None  # see abort()
        self._told: set = set()  # links that heard the last words already (_tell_the_others)
        self._aborted = False
        self._moved_at: float | None = None  # when the message going out now last moved bytes
        self.heard_at: Callable[[int], float | None] | None = None  # when a peer's bytes last arrived
        self._thread = threading.Thread(target=self._loop, name="fastcoll-sender", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self._outstanding == 0

    def abort(self, frame: bytes, links: list[tuple[int, Any]], until: float) -> None:
        """Drop what is queued; finish the message going out now (until `until` at most: written
        into the middle of a message the ABORT would corrupt the stream), then write `frame`
        (the ABORT) on each of `links` ((peer, link) pairs) and shut them for writing."""
        with self._cond:
            self._aborted = True
            self._outstanding -= len(self._items)
            self._items.clear()
            self._stop_at = until
            self._last = (frame, links)
            self._cond.notify_all()

    def put(self, peer: int, sock: Any, frame: bytes, payload: memoryview | None, rest: bool = False) -> None:
        """Queue a message; `rest`: the rest of one the caller began writing on `sock`."""
        with self._cond:
            if rest:
                self._half.add(sock)  # until its rest has gone: no ABORT into its middle
            if self._aborted:
                return  # the group has failed: nothing more goes out
            self._items.append((peer, sock, frame, payload))
            self._outstanding += 1
            self._cond.notify_all()

    def flush(self, deadline: float = math.inf) -> None:
        if not self._outstanding:
            return  # nothing queued (only the caller's thread queues): no lock to take
        with self._cond:
            while self._outstanding:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise send_timeout(self._me, self._current_peer, self._idle(self._current_peer))
                self._cond.wait(left)

    def _bound(self) -> float:
        return self._stop_at

    def _moved(self) -> None:
        self._moved_at = time.monotonic()

    def _idle(self, peer: int | None) -> float | None:
        """How long since data last moved both ways between this rank and `peer`: its message
        going out, and (heard_at) the peer's arriving; None where either never moved."""
        heard = None if peer is None or self.heard_at is None else self.heard_at(peer)
        moved = self._moved_at
        return None if heard is None or moved is None else time.monotonic() - min(heard, moved)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed and self._last is None:
                    self._cond.wait()
                if not self._items:
                    last, self._last = self._last, None
                    if last is None:
                        return  # closed
                    item = None
                else:
                    item = self._items.popleft()
                    self._current_peer = item[0]
                    self._moved_at = None
            if item is None:
                self._say_last_words(*last)
                continue
            peer, sock, frame, payload = item
            between = functools.partial(self._tell_the_others, sock)
            try:
                if peer not in self.broken:
                    _write(sock, frame, self._bound, self._me, peer, between, self._moved)
                    if payload is not None:
                        _write(sock, payload, self._bound, self._me, peer, between, self._moved)
            except CollectiveTimeoutError:  # given up after an abort: the stream is cut here
                self._cut.add(sock)
            except OSError as e:  # reported by TcpTransport.flush, after what the peer sent is read
                self.broken.setdefault(peer, _lost(peer, e))
            with self._cond:
                self._half.discard(sock)  # its message is whole, or the link is cut or broken
                self._current_peer = None
                self._outstanding -= 1
                self._cond.notify_all()

    def _say_last_words(self, frame: bytes, links: list[tuple[int, Any]], busy: Any = None) -> None:
        """`frame` (the ABORT) on every link whose stream is whole, however slowly the peer
        reads, until the bound; then shut each for writing (which also wakes a peer's reads).
        With `busy` (the link a message is half-written on): every other link, once, and none
        is shut yet."""
        for peer, link in links:
            if link is busy:
                continue
            whole = link not in self._cut and link not in self._half
            if link not in self._told and whole and peer not in self.broken:
                try:
                    _write(link, frame, self._bound, self._me, peer)
                except (OSError, FastcollError):
                    pass  # the peer is gone, or stopped: the shutdown still tells it
            if busy is not None:
                self._told.add(link)
                continue
            try:
                link.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _tell_the_others(self, busy: Any) -> None:
        """Between two slices of a message waiting on `busy`: if the job has aborted, the last
        words on every other link now."""
        with self._cond:
            last = self._last
        if last is not None:
            self._say_last_words(*last, busy=busy)

    def close(self, until: float = 0.0) -> None:
        """Stop once the last words (if any) are said, waiting for them until `until` at most."""
        with self._cond:
            self._closed = True
            self._stop_at = min(self._stop_at, until)
            self._cond.notify_all()
        self._thread.join(timeout=max(0.0, until - time.monotonic()) + 2 * SLICE_SECONDS)


Link = tuple[int, int]  # (peer, channel): one connection


class TcpTransport(Transport):
    """Messages over authenticated connections: `channels` per peer (FASTCOLL_CONNECTIONS).

    Message `chunk` of a collective travels on channel chunk % channels, so consecutive pieces
    of a large message are striped over the connections (each with its own sender thread) the
    way MLX's ring stripes over several Thunderbolt cables; both ends derive the channel alike.
    `links` maps each peer to its links (fastcoll/transport/link.py), one per channel.
    """

    def __init__(self, rank: int, size: int, links: dict[int, list[Any]], timeout: float,
                 spin_reads: int = 10, yield_reads: int = 20):
        super().__init__(rank, size)
        self._links = {(p, ch): link for p, ls in links.items() for ch, link in enumerate(ls)}
        self._channels = len(next(iter(links.values())))
        self._timeout = timeout
        self._spin_reads = spin_reads
        self._yield_reads = yield_reads
        self._readers = {key: _Reader(link, key[0], rank, size) for key, link in self._links.items()}
        # each link's idle() for a stalled payload read, made once: a small message reads one too
        self._heed = {key: functools.partial(self._heed_notices, key) for key in self._links}
        self._pending: dict[Link, Header | FastcollError] = {}
        self._fd_link = {link.fileno(): key for key, link in self._links.items()}
        self._poll = select.poll()
        self._watched: set[int] = set()  # the fds registered with _poll
        for link in self._links.values():
            link.set_timeouts(SLICE_SECONDS)  # each blocking wait looks at the call's deadline this often
            self._watch(link.fileno())
        # Links that hold data poll() cannot see (shared-memory rings): looked at before a sleep.
        self._buffered = {link.fileno(): link for link in self._links.values() if link.recheck_s is not None}
        self._recheck_s = min((link.recheck_s for link in self._buffered.values()), default=None)
        self._cut: set = set()  # links whose stream a timeout cut in the middle of a message
        self._senders = [_Sender(rank, self._cut) for _ in range(self._channels)]
        for sender in self._senders:
            sender.heard_at = self._heard_at
        self._closed_peers: set[int] = set()
        self._broken: dict[int, FastcollError] = {}  # peers a send to failed (sends dropped)
        self._last_word_until = 0.0  # abort(): until when the notice may take to leave
        self._gave_up: set[int] = set()  # peers that aborted or are gone: none of them reads on

    def describe(self) -> str:
        shared = sum(link.kind == "shm" for link in self._links.values())
        if not shared:
            return "tcp"
        return f"tcp, shared memory on {shared} of {len(self._links)} connections"

    def connections(self) -> list[tuple[int, int, str, object, object]]:
        return [(p, ch, link.kind) + ends(link.sock) for (p, ch), link in sorted(self._links.items())]

    def send_raw(self, peer: int, data: bytes) -> None:
        self.flush()
        self._links[(peer, 0)].sendall(data)

    def send(self, peer: int, header: Header, payload: memoryview | None, deadline: float | None = None) -> None:
        frame = wire.pack(header)
        ch = header.chunk % self._channels
        sock = self._links[(peer, ch)]
        sender = self._senders[ch]
        if payload is not None and payload.nbytes == 0:
            payload = None
        if peer in self._broken:
            return
        small = payload is None or payload.nbytes <= INLINE_BYTES
        # A link that can say a large message fits without waiting (a shared-memory ring) takes
        # it now, sparing the hand-off to the sender thread (which needs the GIL to copy).
        if not (sender.idle() and (small or sock.fits(len(frame) + payload.nbytes))):
            sender.put(peer, sock, frame, payload)
            return
        try:
            try:
                sent = sock.send(frame) if payload is None else sock.sendmsg([frame, payload])
            except BlockingIOError:  # a slice went by without room: the peer is slow
                sent = 0
        except OSError as e:
            # A peer that gave up sent its ABORT (or a header that shows a mismatch) before it
            # closed: report the break in flush(), once that has been read.
            self._broken.setdefault(peer, _lost(peer, e))
            return
        except BaseException:
            # Stopped part-way (a Ctrl-C): no ABORT may follow on this link, where it would
            # land in the middle of the message.
            self._cut.add(sock)
            raise
        if sent < len(frame) + (0 if payload is None else payload.nbytes):
            # No room for the rest now: the sender thread writes it, and this rank goes on to
            # its receives. Waiting here could hang a ring of ranks each writing to the next.
            sender.put(peer, sock, *_rest(frame, payload, sent), rest=sent > 0)

    def _heard_at(self, peer: int) -> float | None:
        """When a payload of `peer`'s last arrived, on any of its links (None: none has)."""
        times = [self._readers[(peer, ch)].moved_at for ch in range(self._channels)]
        return max((t for t in times if t is not None), default=None)

    def send_failed(self) -> bool:
        return bool(self._broken) or any(sender.broken for sender in self._senders)

    def flush(self, deadline: float | None = None) -> None:
        for sender in self._senders:
            sender.flush(math.inf if deadline is None else deadline)
            for peer, err in sender.broken.items():
                self._broken.setdefault(peer, err)
        if self._broken:
            self.explain_broken(self._broken)

    def _watch(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)
        self._watched.add(fd)

    def _unwatch(self, fd: int) -> None:
        self._poll.unregister(fd)
        self._watched.discard(fd)

    def _wait(self, seconds: float) -> list[tuple[int, int]]:
        """poll() the watched links. A buffered one (shared memory) is ready when it holds data;
        what poll() sees of it only wakes the sleep, and a sleeper looks again every
        `recheck_s` in case that wake-up was never sent (see transport/shm.py)."""
        if not self._buffered:
            return self._poll.poll(seconds * 1000)
        buffered = [(fd, link) for fd, link in self._buffered.items() if fd in self._watched]
        ready = [(fd, select.POLLIN) for fd, link in buffered if not link.prepare_sleep()]
        if ready:
            return ready
        events = self._poll.poll(min(seconds, self._recheck_s) * 1000)
        seen = {fd for fd, _ in events}
        for fd in seen & self._buffered.keys():
            self._buffered[fd].woken()
        return events + [(fd, select.POLLIN) for fd, link in buffered if fd not in seen and link.ready()]

    def _finalized(self, peer: int) -> PeerLostError:
        return PeerLostError(f"rank {peer} called finalize() while rank {self.rank} still needed it", peer)

    def _take(self, link: Link, h: Header) -> Header:
        if h.kind == ABORT:
            self._gave_up.add(link[0])
            raise abort_error(h, link[0], link[0])
        if h.kind == CLOSE:
            self._closed_peers.add(link[0])
            self._unwatch(self._links[link].fileno())
            raise self._finalized(link[0])
        return h

    def _ready_header(self, link: Link) -> Header | None:
        """The header `link` has brought already (kept as running ahead, or read with what came
        before it), or None, without waiting."""
        h = self._pending.pop(link, None)
        if isinstance(h, FastcollError):
            raise h  # that peer was lost while this rank waited on another one
        if h is not None:
            self._watch(self._links[link].fileno())
            return self._take(link, h)
        if link[0] in self._closed_peers:
            raise self._finalized(link[0])
        h = self._readers[link].parse()
        return None if h is None else self._take(link, h)

    def _first_header(self, wanted: Sequence[tuple[int, int]], deadline: float, nbytes: int = 0) -> tuple[int, Header]:
        if len(wanted) == 1:
            peer, chunk = wanted[0]
            return 0, self._next_header(peer, chunk, deadline, nbytes)
        links = [(peer, chunk % self._channels) for peer, chunk in wanted]
        for i, link in enumerate(links):
            h = self._ready_header(link)
            if h is not None:
                return i, h
        # First what every link holds already (a notice may have come with the last payload
        # read), then what poll() says has come.
        events = [(fd, select.POLLIN) for fd in list(self._watched)]
        while True:
            for fd, _ in events:
                if fd not in self._watched:
                    continue  # (a link this loop stopped watching: its header is kept)
                other = self._fd_link[fd]
                link = other if other in links else links[0]
                h = self._look(fd, link)
                if h is not None:
                    return links.index(link), self._take(link, h)
            left = remaining(deadline)
            if left <= 0:
                moved = self._readers[links[0]].moved_at
                raise wait_timeout(self.rank, links[0][0], None if moved is None else time.monotonic() - moved)
            events = self._wait(min(left, 0.2))
            if self.interrupted:
                raise FastcollError(self.interrupted)

    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        link = (peer, chunk % self._channels)
        h = self._ready_header(link)
        if h is None:
            reader = self._readers[link]
            # In a lock-step exchange the peer's message has often landed by now, or is about
            # to: a few non-blocking reads save a poll() and the wake-up that follows it.
            tries = 0
            # A large piece is not a lock-step reply, and yielding would hand the core to this
            # rank's own sender thread for nothing: poll() as before (bench/NOTES.md, entry 11).
            spin = self._spin_reads
            limit = spin + (self._yield_reads if nbytes <= INLINE_BYTES else 0)
            while h is None and tries < limit:
                if tries >= spin:
                    yield_cpu()
                reader.fill(DONTWAIT)
                h = reader.parse()
                tries += 1
        if h is not None:
            return self._take(link, h)
        while True:
            left = remaining(deadline)
            if left <= 0:
                moved = reader.moved_at
                raise wait_timeout(self.rank, peer, None if moved is None else time.monotonic() - moved)
            events = self._wait(min(left, 0.2))
            if self.interrupted:
                raise FastcollError(self.interrupted)
            for fd, _ in events:
                h = self._look(fd, link)
                if h is not None:
                    return self._take(link, h)

    def _look(self, fd: int, link: Link) -> Header | None:
        """Read what the watched link behind `fd` has while this rank waits for `link`: the
        header `link` brought, if that is the one, else None, having kept or acted on what
        another link brought (raises at a peer's timeout notice)."""
        other = self._fd_link[fd]
        r = self._readers[other]
        try:
            # Not blocking: a shared-memory connection's doorbell may come after its data was
            # already read, and poll() must go on watching the others.
            r.fill(DONTWAIT)
        except FastcollError as e:
            self._gave_up.add(other[0])
            if other == link:
                raise
            # Lost while this rank waits on another peer: what that peer owed this collective
            # has arrived (it came before the end of its stream), so the collective may still
            # complete; the loss is raised when it is next needed.
            self._pending[other] = e
            self._unwatch(fd)
            return None
        h = r.parse()
        if h is None:
            return None
        if h.kind == CLOSE and other[0] != link[0]:
            # A clean finalize elsewhere is an error only for whoever still needs that peer.
            self._closed_peers.add(other[0])
            self._unwatch(fd)
            return None
        if other == link:
            return h
        if timeout_notice(h):  # a peer's wait ran out: stop waiting, compare waits
            self._gave_up.add(other[0])
            raise abort_error(h, other[0], link[0])
        # A message on another socket that runs ahead: keep its header, read its payload when
        # that message's turn comes, and stop watching it till then. That holds for an ABORT
        # too: that peer finished what this rank awaits from it before it gave up, so the
        # collective under way may still complete; the abort is raised when this rank next
        # needs that peer. (Everyone else heard it as well, so whoever this rank waits for
        # answers or aborts in turn.)
        self._pending[other] = h
        self._unwatch(fd)
        return None

    def _heed_notices(self, reading: Link) -> None:
        """While a payload from `reading` has stalled: look at every other watched link, so that
        a peer whose wait ran out stops this wait too, as it stops a wait for a header."""
        for fd in [fd for fd in self._watched if self._fd_link[fd] != reading]:
            self._look(fd, reading)

    def _keep_unread(self, peer: int, chunk: int, header: Header) -> None:
        # As for a message that runs ahead: keep its header and stop watching the socket, whose
        # next bytes are that message's payload.
        link = (peer, chunk % self._channels)
        self._pending[link] = header
        self._unwatch(self._links[link].fileno())

    def _read_payload(self, peer: int, chunk: int, out: memoryview, deadline: float = math.inf) -> None:
        link = (peer, chunk % self._channels)
        self._readers[link].read_into(out, deadline, self._heed[link])

    def _send_abort(self, header: Header) -> None:
        frame = wire.pack(header)
        # Each channel's sender thread says the last word on that channel's links, in the
        # background (a full buffer must not hold up the caller's error), once the message it
        # may be sending is out: written into the middle of a message it would corrupt the stream.
        self._last_word_until = time.monotonic() + LAST_WORD_SECONDS
        for ch, sender in enumerate(self._senders):
            links = [(p, link) for (p, c), link in self._links.items() if c == ch]
            sender.abort(frame, links, self._last_word_until)

    def _linger(self, until: float) -> None:
        """Until `until` at most: wait for the peers to take what the TCP sockets still hold
        (the abort notice last). A peer that reads it only after this rank has exited would
        otherwise lose it: its own next send reaches a closed socket, whose reset discards
        what had not reached it yet. (Shared memory needs no wait: the rings outlive this rank.)"""
        if _OUTQ is None:
            return
        socks = [link.sock for (peer, _), link in self._links.items()
                 if link.kind == "tcp" and peer not in self._gave_up and peer not in self._closed_peers]
        buf = array.array("i", [0])
        while socks and time.monotonic() < until:
            still = []
            for sock in socks:
                try:
                    fcntl.ioctl(sock.fileno(), _OUTQ, buf, True)
                except OSError:
                    continue
                if buf[0] > 0:
                    still.append(sock)
            socks = still
            if socks:
                time.sleep(0.002)

    def close(self) -> None:
        if not self.aborted:
            until = time.monotonic() + LAST_WORD_SECONDS
            try:
                self.flush(time.monotonic() + self._timeout)
                frame = wire.pack(Header(CLOSE, -1, "", 0, 0))
                for (peer, _), sock in self._links.items():
                    if peer not in self._broken and sock not in self._cut:
                        _write(sock, frame, lambda: until, self.rank, peer)
            except (OSError, FastcollError):
                pass
        else:  # the abort notice goes out before any socket closes
            until = self._last_word_until
        for sender in self._senders:
            sender.close(until)
        if self.aborted:
            self._linger(until)
        for sock in self._links.values():
            try:
                sock.close()
            except OSError:
                pass
        log.debug("rank %d: tcp transport closed", self.rank)


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[TcpTransport, rendezvous.Table]:
    """Listen, rendezvous, connect to every peer, upgrade the links to ranks of this host to
    shared memory, and return the transport with the rendezvous table."""
    links, table = establish(config, caps, deadline)
    return over(config, links), table


def over(config: Any, links: dict[int, list[Any]]) -> TcpTransport:
    """The transport over links that `establish` made (closed if it cannot be made)."""
    try:
        return TcpTransport(config.rank, config.world_size, links, config.timeout,
                            spin_reads=config.spin_reads, yield_reads=config.yield_reads)
    except BaseException:
        close_links(links)
        raise


def establish(config: Any, caps: dict[str, Any], deadline: float,
              engine_problem: str | None = None) -> tuple[dict[int, list[Any]], rendezvous.Table]:
    """The links to every peer (FASTCOLL_CONNECTIONS each; shared memory to the ranks of this
    host where it can be had; under FASTCOLL_TRANSPORT=rdma, verbs links where this rank has a
    device toward the peer) and the rendezvous table; an engine takes the links over.
    `engine_problem`: why the engine cannot open verbs links (the engine's own answer, for rdma)."""
    verbs = rdma.Setup(config, engine_problem) if config.transport == "rdma" else None
    listener = AuthListener(bind_hosts(config), 0, config.token)
    try:
        caps = {**caps, "connections": config.connections}  # (caps["host"]: lifecycle's host_id())
        if verbs is not None:
            caps["rdma"] = verbs.caps()
        table = rendezvous.rendezvous(config, rendezvous.join_addresses(listener.addresses), caps, deadline)
        rendezvous.agree(table.caps, {"transport": "FASTCOLL_TRANSPORT", "connections": "FASTCOLL_CONNECTIONS"})
        hosts = [str(c.get("host", "")).partition("/")[0] for c in table.caps]
        devices = {} if verbs is None else verbs.plan(table.caps, hosts)
        socks = _mesh(config, listener, table.addresses, deadline)
    finally:
        listener.close()
    links = {p: [SocketLink(s) for s in ss] for p, ss in socks.items()}
    try:
        testhooks.point("tcp-mesh-done")
        near = table.same_host(config.rank)
        here = near - set(devices)  # a peer over RDMA is not one over shared memory
        links = rdma.upgrade(shm.upgrade(config.rank, links, config.shm, deadline, here), devices, near)
        testhooks.point("setup-done")
    except BaseException:  # nothing is kept open when the job cannot start
        close_links(links)
        raise
    return links, table


def ends(sock: socket.socket) -> tuple[object, object]:
    """(this end's address, the peer's) of a connected socket; None for an end already gone."""
    out = []
    for name in (sock.getsockname, sock.getpeername):
        try:
            out.append(name())
        except OSError:
            out.append(None)
    return out[0], out[1]


def close_links(links: dict[int, list[Any]]) -> None:
    """Close every link of a job that could not start."""
    for ls in links.values():
        for link in ls:
            link.close()


def _mesh(config: Any, listener: AuthListener, addresses: list[str], deadline: float) -> dict[int, list[socket.socket]]:
    """FASTCOLL_CONNECTIONS authenticated sockets to every peer: this rank connects to the
    lower ranks and accepts the higher ones, so no two ranks wait on each other.

    Connection ch goes to the peer's address ch (modulo how many it listens on): with one
    address per cable, as MLX's ring does with a hostfile's "ips", the channels stripe a large
    message over every cable."""
    c, me = config.connections, config.rank
    got: dict[int, socket.socket] = {}
    try:
        for p in range(me):
            theirs = rendezvous.split_addresses(addresses[p], f"rank {p}'s address")
            for ch in range(c):
                phost, pport = theirs[ch % len(theirs)]
                got[p + ch * _CHANNEL_STRIDE] = rendezvous.connect(
                    phost, pport, config.token, me + ch * _CHANNEL_STRIDE, deadline, f"rank {p}"
                )
        higher = {p + ch * _CHANNEL_STRIDE for p in range(me + 1, config.world_size) for ch in range(c)}
        accepted = listener.accept(higher, deadline)
    except BaseException:
        for s in got.values():
            s.close()
        raise
    # What a lower rank accepted from us arrived under our id; what we accepted, under theirs.
    got.update(accepted)
    return {
        p: [got[p + ch * _CHANNEL_STRIDE] for ch in range(c)]
        for p in range(config.world_size)
        if p != me
    }
