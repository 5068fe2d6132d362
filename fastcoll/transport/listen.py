"""A listening socket that authenticates each connection on its own short-lived thread.

A stranger that connects and says nothing, or says garbage, only ever occupies its own thread
until its handshake deadline; the job's own ranks are accepted meanwhile.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import socket
import threading
import time
from typing import Any

from fastcoll.errors import AuthenticationError, CollectiveTimeoutError, FastcollError
from fastcoll.transport.auth import server_handshake
from fastcoll.transport.stream import remaining

log = logging.getLogger("fastcoll.transport")

HANDSHAKE_SECONDS = 10.0


def bind_hosts(config: Any) -> list[str]:
    """The addresses a rank of `config` (a fastcoll.Config) listens on: FASTCOLL_INTERFACE's
    (one or several), else the one that reaches the coordinator.

    Never every interface: a local job listens on loopback only."""
    if config.interfaces:
        return list(config.interfaces)
    host, port = config.coordinator
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve the coordinator host {host!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    if ipaddress.ip_address(addr[0]).is_loopback:
        return [addr[0]]
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect(addr)  # no packet is sent: this only asks the routing table
        return [probe.getsockname()[0]]
    finally:
        probe.close()


def bind(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e}") from None
    sock.listen(128)
    return sock


class AuthListener:
    """Accepts and authenticates connections in the background until closed.

    It listens on each of `hosts` (one address per network link, say one per Thunderbolt cable),
    each on its own port unless `port` is given. `vet(rank, conn, deadline)`, if given, runs on
    the connection's own thread once it has authenticated: what it returns is kept in
    `notes[rank]` when `accept` takes the connection; a FastcollError it raises refuses it (vet
    tells the connector why) before it can take a rank's place, and one it returns takes the
    rank's place and fails `accept` once every rank is in (or the deadline passed)."""

    def __init__(self, hosts: str | list[str], port: int, token: bytes, handshake_seconds: float = HANDSHAKE_SECONDS,
                 vet=None):
        socks: list[socket.socket] = []
        try:
            for host in [hosts] if isinstance(hosts, str) else hosts:
                socks.append(bind(host, port))
        except OSError:
            for sock in socks:
                sock.close()
            raise
        self._socks = socks
        self._token = token
        self._handshake_seconds = handshake_seconds
        self._vet = vet
        self.notes: dict[int, Any] = {}
        self._ready: queue.Queue[tuple[int, socket.socket, Any]] = queue.Queue()
        self._closed = threading.Event()
        for sock in socks:
            sock.settimeout(0.1)  # here, not on the thread: close() may come before the thread runs
        self._threads = [
            threading.Thread(target=self._accept_loop, args=(sock,), name="fastcoll-accept", daemon=True)
            for sock in socks
        ]
        for t in self._threads:
            t.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of the first address this listener is bound to."""
        return self.addresses[0]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every address this listener is bound to, in the order given."""
        return [sock.getsockname()[:2] for sock in self._socks]

    def _accept_loop(self, sock: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(
                target=self._handshake, args=(conn, addr), name="fastcoll-handshake", daemon=True
            ).start()

    def _handshake(self, conn: socket.socket, addr) -> None:
        deadline = time.monotonic() + self._handshake_seconds
        try:
            rank = server_handshake(conn, self._token, deadline)
        except (AuthenticationError, OSError, ValueError) as e:
            log.warning("AuthenticationError: refused connection from %s: %s", addr, e)
            conn.close()
            return
        note = None
        if self._vet is not None:
            try:
                note = self._vet(rank, conn, deadline)
            except (FastcollError, OSError, ValueError) as e:
                log.warning("%s: refused a connection from %s claiming rank %d: %s", type(e).__name__, addr, rank, e)
                conn.close()
                return
        conn.settimeout(None)
        if self._closed.is_set():
            conn.close()  # too late: nobody will take it
            return
        self._ready.put((rank, conn, note))

    def accept(self, ranks: set[int], deadline: float, notify=None) -> dict[int, socket.socket]:
        """Authenticated sockets from exactly `ranks`, each once, before `deadline`.

        On timeout, or once every rank is in if `vet` returned an error for one (the first
        such), notify(sock, error) tells each rank already connected why (if given), and the
        error is raised."""
        got: dict[int, socket.socket] = {}
        failure: FastcollError | None = None
        while len(got) < len(ranks):
            try:
                rank, conn, note = self._ready.get(timeout=max(0.001, remaining(deadline)))
            except queue.Empty:
                missing = sorted(ranks - set(got))
                error = failure or CollectiveTimeoutError(
                    f"ranks {missing} did not connect to {self.address[0]}:{self.address[1]} in time")
                self._fail(got, error, notify)
                raise error from None
            if rank not in ranks or rank in got:
                log.warning("refused an authenticated connection claiming rank %d twice or unexpectedly", rank)
                conn.close()
                continue
            got[rank] = conn
            self.notes[rank] = note
            if isinstance(note, FastcollError) and failure is None:
                failure = note
        if failure is not None:
            self._fail(got, failure, notify)
            raise failure
        return got

    @staticmethod
    def _fail(got: dict[int, socket.socket], error: FastcollError, notify) -> None:
        for c in got.values():
            if notify is not None:
                notify(c, error)
            c.close()

    def close(self) -> None:
        """Stop accepting; connections already handed out stay open, the others are closed."""
        self._closed.set()
        for sock in self._socks:
            sock.close()
        for t in self._threads:
            t.join(timeout=1)
        while True:
            try:
                _, conn, _ = self._ready.get_nowait()
            except queue.Empty:
                break
            conn.close()
