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

import collections
import select
import socket
import threading
from typing import Any

from fastcoll import wire
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.transport import rendezvous, shm
from fastcoll.transport.base import Transport, abort_error, log
from fastcoll.transport.link import SocketLink
from fastcoll.transport.listen import AuthListener, bind_hosts
from fastcoll.transport.stream import DONTWAIT, remaining, yield_cpu
from fastcoll.wire import ABORT, CLOSE, Header

INLINE_BYTES = 64 * 1024
READ_BUFFER = 256 * 1024
# A connection's claimed id in the handshake: rank + channel * _CHANNEL_STRIDE.
_CHANNEL_STRIDE = 1 << 16


def _lost(peer: int, e: BaseException) -> FastcollError:
    if isinstance(e, (socket.timeout, BlockingIOError)):
        return CollectiveTimeoutError(f"rank {peer} stopped taking data (send timed out)")
    return PeerLostError(f"connection to rank {peer} failed: {e}")


class _Reader:
    """Per-peer receive buffer: headers and small payloads arrive in as few recv calls as possible."""

    def __init__(self, sock: Any, peer: int):
        self.sock = sock  # a link
        self.peer = peer
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
            raise PeerLostError(f"rank {self.peer} closed its connection (it exited or was killed)")
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
            h = wire.unpack(body)
        except ValueError as e:
            raise PeerLostError(f"rank {self.peer} sent a malformed frame ({e}); dropping it") from None
        self.start += wire.PREFIX.size + n
        return h

    def read_into(self, out: memoryview) -> None:
        """Exactly len(out) payload bytes: first what is buffered, then straight from the socket."""
        out = out.cast("B") if out.format != "B" or out.ndim != 1 else out
        n = out.nbytes
        k = min(self.end - self.start, n)
        out[:k] = self.view[self.start : self.start + k]
        self.start += k
        if self.start == self.end:
            self.start = self.end = 0
        while k < n:
            try:
                got = self.sock.recv_into(out[k:])
            except OSError as e:
                raise _lost(self.peer, e) from None
            if got == 0:
                raise PeerLostError(f"rank {self.peer} closed its connection mid-message")
            k += got


class _Sender:
    """A thread that sends large messages in order, so that receiving goes on meanwhile."""

    def __init__(self):
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._outstanding = 0
        self._error: FastcollError | None = None
        self.broken: dict[int, FastcollError] = {}  # peers whose connection broke: sends dropped
        self._closed = False
        self._current: Any = None  # the link a message is going out on now
        self._last_word: tuple[Any, bytes] | None = None  # see abort()
        self._aborted = False
        self._thread = threading.Thread(target=self._loop, name="fastcoll-sender", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self._outstanding == 0

    def abort(self, frame: bytes) -> Any:
        """Drop what is queued. If a message is going out now, return its socket: `frame` (the
        ABORT) follows on it once that message is out, then the socket is shut for writing.
        Written into the middle of a message it would corrupt the stream."""
        with self._cond:
            self._aborted = True
            self._outstanding -= len(self._items)
            self._items.clear()
            if self._current is not None:
                self._last_word = (self._current, frame)
            self._cond.notify_all()
            return self._current

    def put(self, peer: int, sock: Any, frame: bytes, payload: memoryview | None) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._aborted:
                return  # the group has failed: nothing more goes out
            self._items.append((peer, sock, frame, payload))
            self._outstanding += 1
            self._cond.notify_all()

    def flush(self) -> None:
        if not self._outstanding and self._error is None:
            return  # nothing queued (only the caller's thread queues): no lock to take
        with self._cond:
            while self._outstanding and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    @property
    def error(self) -> FastcollError | None:
        return self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                peer, sock, frame, payload = self._items.popleft()
                self._current = sock
            try:
                if self._error is None and peer not in self.broken:
                    sock.sendall(frame)
                    if payload is not None:
                        sock.sendall(payload)
            except OSError as e:
                err = _lost(peer, e)
                if isinstance(err, CollectiveTimeoutError):
                    self._error = err
                else:  # reported by TcpTransport.flush, after what the peer sent is read
                    self.broken.setdefault(peer, err)
            with self._cond:
                self._current = None
                self._outstanding -= 1
                last, self._last_word = self._last_word, None
                self._cond.notify_all()
            if last is not None:
                _say_last_word(*last)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1)


def _say_last_word(sock: Any, frame: bytes) -> None:
    """Best effort: `frame` (an ABORT) on `sock`, then shut it for writing, which also wakes a
    thread blocked sending on it."""
    try:
        sock.send(frame, socket.MSG_DONTWAIT)
    except OSError:
        pass  # a full buffer (a stopped peer): the shutdown still tells it
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


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
        self._readers = {key: _Reader(link, key[0]) for key, link in self._links.items()}
        self._pending: dict[Link, Header | FastcollError] = {}
        self._fd_link = {link.fileno(): key for key, link in self._links.items()}
        self._poll = select.poll()
        self._watched: set[int] = set()  # the fds registered with _poll
        for link in self._links.values():
            link.set_timeouts(timeout)
            self._watch(link.fileno())
        # Links that hold data poll() cannot see (shared-memory rings): looked at before a sleep.
        self._buffered = {link.fileno(): link for link in self._links.values() if link.recheck_s is not None}
        self._recheck_s = min((link.recheck_s for link in self._buffered.values()), default=None)
        self._senders = [_Sender() for _ in range(self._channels)]
        self._closed_peers: set[int] = set()
        self._broken: dict[int, FastcollError] = {}  # peers a send to failed (sends dropped)

    def describe(self) -> str:
        shared = sum(link.kind == "shm" for link in self._links.values())
        if not shared:
            return "tcp"
        return f"tcp, shared memory on {shared} of {len(self._links)} connections"

    def send(self, peer: int, header: Header, payload: memoryview | None) -> None:
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
        if sender.idle() and (small or sock.fits(len(frame) + payload.nbytes)):
            try:
                if payload is None:
                    sock.sendall(frame)
                else:
                    sent = sock.sendmsg([frame, payload])
                    if sent < len(frame) + payload.nbytes:
                        rest = (frame + payload.cast("B").tobytes())[sent:]
                        sock.sendall(rest)
            except OSError as e:
                err = _lost(peer, e)
                if isinstance(err, CollectiveTimeoutError):
                    raise err from None
                # A peer that gave up sent its ABORT (or a header that shows a mismatch) before
                # it closed: report the break in flush(), once that has been read.
                self._broken.setdefault(peer, err)
        else:
            sender.put(peer, sock, frame, payload)

    def flush(self) -> None:
        for sender in self._senders:
            sender.flush()
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
        return PeerLostError(f"rank {peer} called finalize() while rank {self.rank} still needed it")

    def _take(self, link: Link, h: Header) -> Header:
        if h.kind == ABORT:
            raise abort_error(h)
        if h.kind == CLOSE:
            self._closed_peers.add(link[0])
            self._unwatch(self._links[link].fileno())
            raise self._finalized(link[0])
        return h

    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        link = (peer, chunk % self._channels)
        h = self._pending.pop(link, None)
        if isinstance(h, FastcollError):
            raise h  # that peer was lost while this rank waited on another one
        if h is not None:
            self._watch(self._links[link].fileno())
            return self._take(link, h)
        if peer in self._closed_peers:
            raise self._finalized(peer)
        reader = self._readers[link]
        h = reader.parse()
        if h is None:
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
                raise CollectiveTimeoutError(
                    f"rank {self.rank} timed out waiting for rank {peer}, which did not answer"
                )
            events = self._wait(min(left, 1.0))
            for sender in self._senders:
                if sender.error is not None:
                    raise sender.error
            for fd, _ in events:
                other = self._fd_link[fd]
                r = self._readers[other]
                try:
                    # Not blocking: a shared-memory connection's doorbell may come after its
                    # data was already read, and poll() must go on watching the others.
                    r.fill(DONTWAIT)
                except FastcollError as e:
                    if other == link:
                        raise
                    # Lost while this rank waits on another peer: what that peer owed this
                    # collective has arrived (it came before the end of its stream), so the
                    # collective may still complete; the loss is raised when it is next needed.
                    self._pending[other] = e
                    self._unwatch(fd)
                    continue
                h = r.parse()
                if h is None:
                    continue
                if h.kind == CLOSE and other[0] != peer:
                    # A clean finalize elsewhere is an error only for whoever still needs that peer.
                    self._closed_peers.add(other[0])
                    self._unwatch(fd)
                    continue
                if other == link:
                    return self._take(other, h)
                # A message on another socket that runs ahead: keep its header, read its
                # payload when that message's turn comes, and stop watching it till then.
                # That holds for an ABORT too: that peer finished what this rank awaits from
                # it before it gave up, so the collective under way may still complete; the
                # abort is raised when this rank next needs that peer. (Everyone else heard
                # it as well, so whoever this rank waits for answers or aborts in turn.)
                self._pending[other] = h
                self._unwatch(fd)

    def _read_payload(self, peer: int, chunk: int, out: memoryview) -> None:
        self._readers[(peer, chunk % self._channels)].read_into(out)

    def _send_abort(self, header: Header) -> None:
        frame = wire.pack(header)
        # A sender thread in the middle of a message on a socket says the last word there itself.
        busy = {sender.abort(frame) for sender in self._senders}
        for sock in self._links.values():
            if sock not in busy:
                _say_last_word(sock, frame)

    def close(self) -> None:
        if not self.aborted:  # after an abort nothing more is owed, and a peer may never read
            try:
                self.flush()
                frame = wire.pack(Header(CLOSE, -1, "", 0, 0))
                for sock in self._links.values():
                    sock.sendall(frame)
            except (OSError, FastcollError):
                pass
        for sender in self._senders:
            sender.close()
        for sock in self._links.values():
            try:
                sock.close()
            except OSError:
                pass
        log.debug("rank %d: tcp transport closed", self.rank)


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[TcpTransport, rendezvous.Table]:
    """Listen, rendezvous, connect to every peer, upgrade the links to ranks of this host to
    shared memory, and return the transport with the rendezvous table."""
    listener = AuthListener(bind_hosts(config), 0, config.token)
    try:
        caps = {**caps, "connections": config.connections, "host": shm.host_id()}
        table = rendezvous.rendezvous(config, rendezvous.join_addresses(listener.addresses), caps, deadline)
        rendezvous.agree(table.caps, {"transport": "FASTCOLL_TRANSPORT", "connections": "FASTCOLL_CONNECTIONS"})
        socks = _mesh(config, listener, table.addresses, deadline)
    finally:
        listener.close()
    links = {p: [SocketLink(s) for s in ss] for p, ss in socks.items()}
    links = shm.upgrade(config.rank, links, config.shm, deadline, table.same_host(config.rank))
    transport = TcpTransport(config.rank, config.world_size, links, config.timeout,
                             spin_reads=config.spin_reads, yield_reads=config.yield_reads)
    return transport, table


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
