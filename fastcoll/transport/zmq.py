"""ZeroMQ transport: one ROUTER per rank receives from every peer, one DEALER per peer sends.

Every connection runs ZeroMQ's CURVE handshake with keys derived from the job's token, so a
connection that does not know the token is refused by libzmq before any message reaches us, and
the token itself never crosses the wire. Large payloads are sent zero-copy (libzmq reads the
caller's buffer; `flush` waits on the send trackers before the buffer may change). Peer loss is
seen through socket monitors on the DEALERs and ZeroMQ heartbeats.
"""

from __future__ import annotations

import collections
import hashlib
import time

import zmq
import zmq.auth.thread
import zmq.utils.monitor
from zmq.utils import z85

from fastcoll import wire
from fastcoll.errors import CollectiveTimeoutError, FastcollError, PeerLostError
from fastcoll.transport.base import Transport, abort_error, log
from fastcoll.transport.stream import remaining
from fastcoll.wire import ABORT, CLOSE, DATA, Header

COPY_BYTES = 64 * 1024
_HELLO = -2


def _keypair(token: bytes, role: bytes) -> tuple[bytes, bytes]:
    """A CURVE key pair that only holders of the token can derive."""
    secret = z85.encode(hashlib.sha256(b"fastcoll-curve-" + role + b"\0" + token).digest())
    return zmq.curve_public(secret), secret


class _OnlyJobKeys:
    """ZAP policy: accept a CURVE client only if it holds the job's client key."""

    def __init__(self, client_public: bytes):
        self._key = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self._key
        if not ok:
            log.warning("AuthenticationError: refused a ZeroMQ client without the job's key")
        return ok


class ZmqListener:
    """The ROUTER a rank binds before the rendezvous (its address goes into the table)."""

    def __init__(self, host: str, token: bytes, max_message: int):
        self.ctx = zmq.Context()
        self.server_public, server_secret = _keypair(token, b"server")
        self.client_public, self.client_secret = _keypair(token, b"client")
        self.auth = zmq.auth.thread.ThreadAuthenticator(self.ctx, log=log.getChild("zap"))
        self.auth.start()
        self.auth.configure_curve_callback("*", credentials_provider=_OnlyJobKeys(self.client_public))
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.curve_server = True
        self.router.curve_secretkey = server_secret
        self.router.setsockopt(zmq.MAXMSGSIZE, max_message)
        self.router.setsockopt(zmq.RCVHWM, 0)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"

    def close(self) -> None:
        self.router.close(linger=0)
        self.auth.stop()
        self.ctx.term()


class ZmqTransport(Transport):
    """Messages over ZeroMQ: ROUTER in, one DEALER out per peer."""

    def __init__(self, rank: int, size: int, listener: ZmqListener, addresses: list[str], timeout: float, deadline: float):
        super().__init__(rank, size)
        self._listener = listener
        self._router = listener.router
        self._timeout = timeout
        self._dealers: dict[int, zmq.Socket] = {}
        self._monitors: dict[zmq.Socket, int] = {}
        self._queues: dict[int, collections.deque] = {p: collections.deque() for p in range(size) if p != rank}
        self._current: dict[int, zmq.Frame | None] = {}
        self._trackers: list[zmq.MessageTracker] = []
        self._gone: dict[int, tuple[str, float]] = {}
        self._finalized: set[int] = set()
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        ctx = listener.ctx
        for peer in self._queues:
            d = ctx.socket(zmq.DEALER)
            d.curve_serverkey = listener.server_public
            d.curve_publickey = listener.client_public
            d.curve_secretkey = listener.client_secret
            d.setsockopt(zmq.ROUTING_ID, str(rank).encode())
            d.setsockopt(zmq.SNDHWM, 0)
            d.setsockopt(zmq.LINGER, int(timeout * 1000))
            d.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            d.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(max(timeout, 1) * 1000))
            mon = d.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            d.connect(addresses[peer])
            self._dealers[peer] = d
            self._monitors[mon] = peer
            self._poller.register(mon, zmq.POLLIN)
        # Every peer says hello once, so that a job only starts when all connections are up.
        for peer in self._dealers:
            self.send(peer, Header(DATA, _HELLO, "hello", 0, 0), None)
        for peer in self._dealers:
            self.recv(peer, _HELLO, "hello", 0, None, deadline)

    def send(self, peer: int, header: Header, payload: memoryview | None) -> None:
        d = self._dealers[peer]
        frame = wire.pack(header)
        try:
            if payload is None or payload.nbytes == 0:
                d.send(frame, copy=True)
            elif payload.nbytes <= COPY_BYTES:
                d.send_multipart([frame, payload], copy=True)
            else:
                d.send(frame, flags=zmq.SNDMORE, copy=True)
                self._trackers.append(d.send(payload, copy=False, track=True))
        except zmq.ZMQError as e:
            raise PeerLostError(f"sending to rank {peer} failed: {e}") from None

    def flush(self) -> None:
        deadline = time.monotonic() + self._timeout
        for t in self._trackers:
            while not t.done:
                if remaining(deadline) <= 0:
                    raise CollectiveTimeoutError("a peer did not take the data sent to it in time")
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
                event = zmq.utils.monitor.recv_monitor_message(mon)
                if peer in self._gone:
                    continue
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    why = f"rank {peer} closed its connection (it exited or was killed)"
                else:
                    why = f"rank {peer} refused our key: it has another FASTCOLL_TOKEN"
                self._gone[peer] = (why, time.monotonic())

    def _raise_if_gone(self, needed: int | None) -> None:
        """PeerLostError for a lost peer; a peer that finalized cleanly matters only if needed.

        The CLOSE message and the disconnect travel on different connections, so a disconnect
        is only believed after a short grace in which that peer's CLOSE may still arrive."""
        for p, (why, seen) in self._gone.items():
            if p in self._finalized and p != needed:
                continue
            if self._queues[p] and p != needed:
                continue
            if time.monotonic() - seen > 0.1:
                raise PeerLostError(why)

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
        try:
            peer = int(parts[0].bytes)
            if peer not in self._queues or len(parts) not in (2, 3):
                raise ValueError("unknown sender or frame count")
            raw = parts[1].buffer
            n = wire.header_length(raw[: wire.PREFIX.size])
            h = wire.unpack(raw[wire.PREFIX.size : wire.PREFIX.size + n])
            payload = parts[2] if len(parts) == 3 else None
            if h.kind == CLOSE:
                self._finalized.add(peer)
            if (payload.buffer.nbytes if payload is not None else 0) != h.nbytes:
                raise ValueError("payload size differs from its header")
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("dropped a malformed ZeroMQ message: %s", e)
            return
        self._queues[peer].append((h, payload))

    def _next_header(self, peer: int, deadline: float) -> Header:
        q = self._queues[peer]
        while True:
            if q:
                h, payload = q.popleft()
                if h.kind == ABORT:
                    raise abort_error(h)
                if h.kind == CLOSE:
                    why = f"rank {peer} called finalize() while rank {self.rank} still needed it"
                    self._gone[peer] = (why, 0.0)
                    raise PeerLostError(why)
                self._current[peer] = payload
                return h
            self._raise_if_gone(peer)
            for p, pq in self._queues.items():
                if pq and pq[0][0].kind == ABORT:
                    raise abort_error(pq[0][0])
            left = remaining(deadline)
            if left <= 0:
                raise CollectiveTimeoutError(
                    f"rank {self.rank} waited {self._timeout:g}s for rank {peer}, which did not answer"
                )
            self._drain(min(left, 0.05 if self._gone else 1.0) * 1000)

    def _read_payload(self, peer: int, out: memoryview) -> None:
        frame = self._current.pop(peer)
        out.cast("B")[:] = frame.buffer

    def _send_abort(self, header: Header) -> None:
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
                d.send(wire.pack(Header(CLOSE, -1, "", 0, 0)))
        except (zmq.ZMQError, FastcollError):
            pass
        for mon in self._monitors:
            mon.close(linger=0)
        for d in self._dealers.values():
            d.disable_monitor()
            d.close(linger=1000)
        self._listener.close()
