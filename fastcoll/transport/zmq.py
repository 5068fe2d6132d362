"""ZeroMQ transport: one ROUTER per rank receives from every peer, one DEALER per peer sends.

Each DEALER connection runs the same HMAC challenge-response as TCP (transport/auth.py) as its
first messages; the ROUTER maps a connection to a rank only once its proof checks out and drops
whatever an unknown connection sends, and ZMQ_MAXMSGSIZE bounds any message before libzmq
allocates it. (ZeroMQ's own CURVE would also do, but it encrypts every byte: on loopback here it
cut 1 MiB messages from 4.6 to 0.5 GB/s and tripled a 4 KiB round trip; bench/NOTES.md.) Large
payloads are sent zero-copy (libzmq reads the caller's buffer; `flush` waits on the send
trackers before the buffer may change). Peer loss is seen through socket monitors on the
DEALERs and ZeroMQ heartbeats; DEALERs never reconnect, so a lost connection stays lost.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import time
from typing import Any, Sequence

import zmq
import zmq.auth.thread
import zmq.utils.garbage  # noqa: F401 -- before any exit hook of fastcoll's (end_at_exit says why)
import zmq.utils.monitor

from fastcoll import diagnosis, testhooks, wire
from fastcoll.errors import AuthenticationError, CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.transport import auth, rendezvous
from fastcoll.transport.base import Transport, abort_error, log, timeout_notice
from fastcoll.transport.listen import bind_hosts
from fastcoll.transport.stream import remaining
from fastcoll.wire import ABORT, CLOSE, MAX_PIECE_BYTES, Header

COPY_BYTES = 64 * 1024
_INT32_MAX = (1 << 31) - 1  # ZeroMQ's millisecond options are C ints

_swallowed = False  # a KeyboardInterrupt that a deallocator swallowed (see _catch_interrupts)
_previous_hook: Any = None


def _catch_interrupts() -> None:
    """Keep the Ctrl-C that pyzmq would lose. Its Frame.__dealloc__ checks for signals (through
    _check_rc), so a SIGINT that arrives then raises KeyboardInterrupt inside a deallocator,
    where it cannot propagate: Python hands it to sys.unraisablehook ("Exception ignored in:
    'zmq.backend.cython._zmq.Frame.__dealloc__'") and the rank would run on. This hook notes it
    instead (every other unraisable goes to the hook it replaces), and the transport raises it
    again at its next step (`_reraise_interrupt`)."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        global _swallowed
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _swallowed = True
            return
        _previous_hook(unraisable)

    sys.unraisablehook = hook


def _reraise_interrupt() -> None:
    global _swallowed
    if _swallowed:
        _swallowed = False
        raise KeyboardInterrupt


class _ZapLog(logging.LoggerAdapter):
    """pyzmq's authenticator reports a refusal at debug level; fastcoll logs it as a warning."""

    def debug(self, msg, *args, **kwargs):
        if str(msg).startswith("DENIED"):
            self.warning("AuthenticationError: refused a ZeroMQ connection: " + str(msg), *args, **kwargs)


class ZmqListener:
    """The ROUTER a rank binds before the rendezvous (its address goes into the table).

    A ZAP handler admits connections only while the job sets up; `close_door()` then refuses
    every new one in libzmq's handshake, before it can send a byte. Without it, a stranger could
    connect at any time and have libzmq queue its messages (up to RCVHWM of ZMQ_MAXMSGSIZE each)
    while the rank is idle: 150 x 4 MiB sent to an idle rank grew it by 600 MiB (measured). With
    ZAP on, libzmq also drops ZMTP/1.0 peers (random bytes) instead of reading them as messages."""

    def __init__(self, host: str, token: bytes, max_message: int):
        self.ctx = zmq.Context()
        self.token = token
        self.auth = zmq.auth.thread.ThreadAuthenticator(self.ctx, log=_ZapLog(log, {}))
        try:
            self.auth.start()
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.zap_domain = b"fastcoll"
            self.router.setsockopt(zmq.MAXMSGSIZE, max_message)
            # Per connection: a peer that fills it is only slowed (libzmq stops reading its
            # socket until this rank catches up); a stranger that connected during the set-up
            # window can park at most this many messages here while the rank is idle, not 1000.
            self.router.setsockopt(zmq.RCVHWM, 64)
            self.router.setsockopt(zmq.LINGER, 0)
            if ":" in host:  # an IPv6 address: ZeroMQ wants it bracketed, and IPv6 turned on
                self.router.setsockopt(zmq.IPV6, 1)
                host = f"[{host}]"
            port = self.router.bind_to_random_port(f"tcp://{host}")
        except BaseException:
            self.auth.stop()
            self.ctx.destroy(linger=0)
            raise
        self.address = f"tcp://{host}:{port}"

    def close_door(self) -> None:
        """Every rank is connected: refuse all new connections from now on."""
        self.auth.allow("fastcoll: no new connections once the job is set up")

    def close(self) -> None:
        """Close the ROUTER, the authenticator and the context. Every socket still open on the
        context (a set-up that failed half-way) is closed too, with no linger: ctx.term()
        alone would wait for them for ever."""
        self.router.close(linger=0)
        self.auth.stop()
        self.ctx.destroy(linger=0)


class ZmqTransport(Transport):
    """Messages over ZeroMQ: ROUTER in, one DEALER out per peer."""

    def __init__(self, rank: int, size: int, listener: ZmqListener, addresses: list[str], timeout: float,
                 deadline: float, spin_reads: int = 40):
        super().__init__(rank, size)
        self._spin_reads = spin_reads
        self._listener = listener
        self._token = listener.token
        self._router = listener.router
        self._timeout = timeout
        self._dealers: dict[int, zmq.Socket] = {}
        self._monitors: dict[zmq.Socket, int] = {}
        self._queues: dict[int, collections.deque] = {p: collections.deque() for p in range(size) if p != rank}
        self._current: dict[int, memoryview] = {}
        # Peers' timeout notices not yet raised, by peer: every one, since two can come at once
        # and the ranks compare notes by them (fastcoll/diagnosis.py).
        self._notices: dict[int, Header] = {}
        self._trackers: list[tuple[int, zmq.MessageTracker]] = []
        self._gone: dict[int, tuple[str, float]] = {}
        self._finalized: set[int] = set()
        self._broken: dict[int, FastcollError] = {}  # peers a send to failed (sends dropped)
        self._ranks: dict[bytes, int] = {}  # ROUTER routing id -> the rank it proved to be
        self._handshakes: dict[bytes, auth.Pending] = {}
        self._strangers: set[bytes] = set()
        self._setting_up = True
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        _catch_interrupts()
        try:
            for peer in self._queues:
                d = listener.ctx.socket(zmq.DEALER)
                self._dealers[peer] = d
                d.setsockopt(zmq.SNDHWM, 0)
                # The linger set here, not the one close() passes, is what ctx.term() waited on
                # for a lost peer (FASTCOLL_TIMEOUT seconds after an error; measured): keep it short.
                d.setsockopt(zmq.LINGER, 1000)
                d.setsockopt(zmq.RECONNECT_IVL, -1)
                d.setsockopt(zmq.HEARTBEAT_IVL, 1000)
                # In milliseconds, a C int: a FASTCOLL_TIMEOUT past 24.8 days is clamped there.
                d.setsockopt(zmq.HEARTBEAT_TIMEOUT, min(_INT32_MAX, int(max(timeout, 1) * 1000)))
                mon = d.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
                self._monitors[mon] = peer
                if "[" in addresses[peer]:
                    d.setsockopt(zmq.IPV6, 1)
                d.connect(addresses[peer])
                self._poller.register(mon, zmq.POLLIN)
            testhooks.point("zmq-handshake")
            self._handshake(deadline)
        except BaseException:  # close what was opened: the context could not end otherwise
            self._close_sockets(linger=0)
            raise

    def _handshake(self, deadline: float) -> None:
        """Authenticate every DEALER (as connector) and every peer's connection (as listener)."""
        nonces, hellos = {}, {}
        for peer in self._dealers:
            hellos[peer], nonces[peer] = auth.hello(self.rank)
        waiting = set(self._dealers)
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        for d in self._dealers.values():
            poller.register(d, zmq.POLLIN)
        while waiting or len(self._ranks) < len(self._queues):
            # NOBLOCK: a DEALER blocks a send until its connection is up, and one whose peer
            # died before it connected never gets one (it does not reconnect): a blocking send
            # would outwait the deadline for ever.
            for peer in list(hellos):
                try:
                    self._dealers[peer].send(hellos[peer], flags=zmq.NOBLOCK)
                    del hellos[peer]
                except zmq.Again:
                    pass
            left = remaining(deadline)
            if left <= 0:
                missing = sorted(set(self._queues) - set(self._ranks.values()) | waiting)
                raise CollectiveTimeoutError(f"ZeroMQ handshake with ranks {missing} did not finish in time")
            events = dict(poller.poll(min(left, 0.01 if hellos else 1.0) * 1000))
            if self._router in events:
                self._drain(0)
            for peer in list(waiting):
                d = self._dealers[peer]
                if d in events:
                    try:  # connected (it answered), so this goes at once unless the peer just died
                        d.send(auth.prove(self._token, self.rank, nonces[peer], d.recv()), flags=zmq.NOBLOCK)
                    except zmq.Again:
                        continue  # its connection is gone: the deadline names it
                    waiting.discard(peer)
        self._setting_up = False
        self._handshakes.clear()
        self._listener.close_door()

    def _authenticate(self, ident: bytes, frames: list) -> None:
        """One handshake step of a connection that has not proved its rank yet."""
        if len(frames) != 1 or ident in self._strangers:
            return
        data = frames[0].bytes
        try:
            p = self._handshakes.pop(ident, None)
            if p is None:
                if not self._setting_up:
                    raise AuthenticationError("a connection arrived after the job was set up")
                reply, self._handshakes[ident] = auth.challenge(self._token, data)
                self._router.send_multipart([ident, reply])
                return
            rank = auth.verify(self._token, p, data)
            if rank not in self._queues or rank in self._ranks.values():
                raise AuthenticationError(f"a connection proved rank {rank}, which is taken or not a peer")
            self._ranks[ident] = rank
        except AuthenticationError as e:
            self._strangers.add(ident)
            log.warning("AuthenticationError: refused a ZeroMQ connection: %s", e)

    def send(self, peer: int, header: Header, payload: memoryview | None, deadline: float | None = None) -> None:
        # NOBLOCK: a DEALER whose only connection is gone would block for ever (it never
        # reconnects); with an unbounded send queue, Again can only mean that.
        d = self._dealers[peer]
        if peer in self._broken:
            return
        frame = wire.pack(header)
        try:
            if payload is None or payload.nbytes == 0:
                d.send(frame, flags=zmq.NOBLOCK)
            elif payload.nbytes <= COPY_BYTES:
                # One frame: each frame costs a wake-up of libzmq's I/O thread.
                d.send(frame + payload, flags=zmq.NOBLOCK)
            else:
                d.send(frame, flags=zmq.NOBLOCK | zmq.SNDMORE)
                self._trackers.append((peer, d.send(payload, flags=zmq.NOBLOCK, copy=False, track=True)))
        except zmq.ZMQError as e:
            # What the peer sent before it went (its ABORT, or a header that shows a mismatch)
            # explains this better: flush() reports the break once that has been read.
            err = PeerLostError(f"sending to rank {peer} failed: its connection is gone ({e})", peer)
            self._broken.setdefault(peer, err)

    def flush(self, deadline: float | None = None) -> None:
        if self._broken:
            self.explain_broken(self._broken)
        if deadline is None:
            deadline = time.monotonic() + self._timeout
        for peer, t in self._trackers:
            while not t.done:
                if remaining(deadline) <= 0:
                    raise diagnosis.timed_out(
                        f"rank {self.rank} timed out sending to rank {peer}, which stopped taking data", peer)
                if self.interrupted:
                    raise FastcollError(self.interrupted)
                _reraise_interrupt()
                self._raise_if_gone(None)
                try:
                    t.wait(0.01)
                except zmq.NotDone:
                    pass
                self._check_monitors()
        self._trackers.clear()

    def _check_monitors(self) -> None:
        for mon, peer in self._monitors.items():
            while mon.poll(0):
                zmq.utils.monitor.recv_monitor_message(mon)  # only disconnects are subscribed
                if peer in self._gone:
                    continue
                why = (
                    f"rank {peer}'s connection closed (it exited or was killed, or stopped "
                    "answering ZeroMQ heartbeats for FASTCOLL_TIMEOUT)"
                )
                self._gone[peer] = (why, time.monotonic())

    def _raise_if_gone(self, needed: int | None) -> None:
        """PeerLostError for a lost peer; a peer that finalized cleanly matters only if needed.

        The CLOSE message and the disconnect travel on different connections, so a disconnect
        is only believed after a short grace in which that peer's CLOSE may still arrive."""
        for p, (why, seen) in self._gone.items():
            if needed is not None and p != needed:
                # A lost peer this rank is not waiting on: the collective under way may still
                # complete; the loss is raised when that peer is next needed (or reaches this
                # rank through the peer it waits on, which needs it too).
                continue
            if needed is None and (p in self._finalized or self._queues[p]):
                continue
            if time.monotonic() - seen > 0.1:
                raise PeerLostError(why, p)

    def _spin(self) -> bool:
        """Non-blocking receives before sleeping in poll (as the TCP transport's spin_reads, but
        four times as many: libzmq's I/O threads put a reply further away). True if a message
        came. 4 B all-reduce, 2 ranks, median: 405 us without, ~190 with 10 tries, ~150 with 40."""
        for _ in range(self._spin_reads):
            try:
                parts = self._router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            self._file(parts)
            return True
        return False

    def _drain(self, block_ms: float) -> None:
        """Move every waiting message into its sender's queue; watch the monitors."""
        events = dict(self._poller.poll(block_ms))
        if self._router in events:
            while True:
                try:
                    parts = self._router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._file(parts)
        if len(events) > (self._router in events):
            self._check_monitors()

    def _file(self, parts: list) -> None:
        ident = parts[0].bytes
        peer = self._ranks.get(ident)
        if peer is None:
            self._authenticate(ident, parts[1:])
            return
        try:
            if len(parts) not in (2, 3):
                raise ValueError("wrong frame count")
            raw = parts[1].buffer
            n = wire.header_length(raw[: wire.PREFIX.size])
            h = wire.unpack(raw[wire.PREFIX.size : wire.PREFIX.size + n], self.size)
            # Small payloads share the header's frame; large ones come as a frame of their own.
            payload = parts[2].buffer if len(parts) == 3 else raw[wire.PREFIX.size + n :]
            if payload.nbytes != h.nbytes:
                raise ValueError("payload size differs from its header")
        except ValueError as e:
            # An authenticated peer never sends this: treat the connection as broken.
            self._gone.setdefault(peer, (f"rank {peer} sent a malformed message ({e})", 0.0))
            return
        if h.kind == CLOSE:
            self._finalized.add(peer)
        if timeout_notice(h) and not self._queues[peer]:
            # A peer's wait ran out: whoever waits on another stops too (unless that peer's
            # earlier messages come first: they are what this rank meets when it next needs it).
            self._notices[peer] = h
        self._queues[peer].append((h, payload))

    def _next_header(self, peer: int, chunk: int, deadline: float, nbytes: int = 0) -> Header:
        return self._first_header([(peer, chunk)], deadline, nbytes)[1]

    def _first_header(self, wanted: Sequence[tuple[int, int]], deadline: float, nbytes: int = 0) -> tuple[int, Header]:
        peers = [peer for peer, _ in wanted]
        while True:
            _reraise_interrupt()  # a Ctrl-C that a frame's deallocator swallowed, if any
            for i, peer in enumerate(peers):
                if self._queues[peer]:
                    return i, self._pop(peer)
            # Another peer's ABORT waits in its queue until this rank needs that peer (as on
            # TCP: the collective under way may still complete); _raise_if_gone passes over
            # lost peers whose queue still holds something, such as that notice.
            for peer in peers:
                self._raise_if_gone(peer)
            if self.interrupted:
                raise FastcollError(self.interrupted)
            if self._notices:
                other = next((p for p in self._notices if p not in peers), None)
                if other is not None:  # it stays in its queue too
                    raise abort_error(self._notices.pop(other), other, peers[0])
            if self._spin():
                continue
            left = remaining(deadline)
            if left <= 0:
                raise diagnosis.timed_out(
                    f"rank {self.rank} timed out waiting for rank {peers[0]}, which did not answer", peers[0])
            self._drain(min(left, 0.05 if self._gone else 0.2) * 1000)

    def _pop(self, peer: int) -> Header:
        """The next message in `peer`'s queue: its header (the payload kept for `_read_payload`)."""
        q = self._queues[peer]
        h, payload = q.popleft()
        if h.kind == ABORT:
            self._notices.pop(peer, None)  # raised here: not once more for another wait
            raise abort_error(h, peer, peer)
        if h.kind == CLOSE:
            why = f"rank {peer} called finalize() while rank {self.rank} still needed it"
            self._gone[peer] = (why, 0.0)
            raise PeerLostError(why, peer)
        if q and timeout_notice(q[0][0]):
            # That peer's wait ran out after it sent this: now nothing of it comes first, so
            # whoever waits on another hears it (see _file).
            self._notices[peer] = q[0][0]
        self._current[peer] = payload
        return h

    def _read_payload(self, peer: int, chunk: int, out: memoryview, deadline: float = math.inf) -> None:
        payload = self._current.pop(peer)
        out.cast("B")[:] = payload
        testhooks.point("zmq-frame")
        del payload  # the frame goes here, and a Ctrl-C in its deallocator with it
        _reraise_interrupt()

    def _send_abort(self, header: Header) -> None:
        self._trackers.clear()  # a broken group's close() must not wait for a lost peer
        frame = wire.pack(header)
        for d in self._dealers.values():
            try:
                d.send(frame, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self) -> None:
        try:
            self.flush()
            for d in self._dealers.values():
                d.send(wire.pack(Header(CLOSE, -1, "", 0, 0)), flags=zmq.NOBLOCK)
        except (zmq.ZMQError, FastcollError):
            pass
        self._close_sockets()
        self._listener.close()

    def end_at_exit(self) -> None:
        """Drop what libzmq holds unsent and stop its I/O threads. pyzmq's exit hook frees the
        buffers of zero-copy sends whether or not libzmq still reads them (a send that a failed
        call left in flight: a SIGSEGV at exit); this runs first, since atexit runs the hooks
        registered last first and pyzmq's was registered when this module imported it."""
        self._trackers.clear()
        self._close_sockets(linger=0)
        self._listener.close()

    def _close_sockets(self, linger: int | None = None) -> None:
        """The monitors and DEALERs; each DEALER lingers 1 s (LAST_WORD_SECONDS) to deliver
        what it holds (a CLOSE or an ABORT), unless `linger` says otherwise."""
        for d in self._dealers.values():
            try:
                d.disable_monitor()
            except zmq.ZMQError:
                pass
        for mon in self._monitors:
            mon.close(linger=0)
        for peer, d in self._dealers.items():
            # Lingering on a peer that is gone only holds ctx.term() up (seconds, measured).
            gone = peer in self._gone or peer in self._broken
            d.close(linger=linger if linger is not None else 0 if gone else 1000)


def spin_reads(config: Any, local_ranks: int) -> int:
    """How many non-blocking receives a wait tries before it sleeps in poll: four times
    config.spin_reads (ZmqTransport._spin says why), or none where this host's ranks outnumber its
    CPUs, unless FASTCOLL_TUNING set spin_reads. There a spinning rank holds a core that a peer, or
    the libzmq I/O thread that carries the message, needs (four ranks on 2 cores: a 4 B
    all_gather took about 1.7 times as long with the spin, bench/NOTES.md), as the native engine's
    spin_us rule says for its waits."""
    if "spin_reads" not in config.tuned and local_ranks > (os.cpu_count() or 1):
        return 0
    return 4 * config.spin_reads


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[ZmqTransport, rendezvous.Table]:
    """Bind a ROUTER, rendezvous, connect a DEALER to every peer and authenticate them all."""
    hosts = bind_hosts(config)
    if len(hosts) > 1:
        log.info("the zmq transport listens on the first of FASTCOLL_INTERFACE's addresses only: %s", hosts[0])
    listener = ZmqListener(hosts[0], config.token, MAX_PIECE_BYTES + 64 * 1024)
    try:
        table = rendezvous.rendezvous(config, listener.address, caps, deadline)
        rendezvous.agree(table.caps, {"transport": "FASTCOLL_TRANSPORT"})
        transport = ZmqTransport(config.rank, config.world_size, listener, table.addresses, config.timeout,
                                 deadline, spin_reads=spin_reads(config, len(table.same_host(config.rank))))
        testhooks.point("setup-done")
    except BaseException:
        listener.close()
        raise
    return transport, table
