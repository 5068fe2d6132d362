"""A Group: this rank's place in the job, its transport, its service thread and its state."""

from __future__ import annotations

import atexit
import functools
import ipaddress
import logging
import socket
import threading
import time
from typing import Any, Callable

from fastcoll.algorithms import Call
from fastcoll.config import Config, parse_address
from fastcoll.errors import FastcollError, MismatchError
from fastcoll.service import Service
from fastcoll.transport import shm
from fastcoll.transport.base import Transport

log = logging.getLogger("fastcoll")

# Ordinary data messages are cut to at most this many bytes (the ZeroMQ message bound follows).
MAX_PIECE_BYTES = 4 << 20


class Group:
    """The ranks of a job, as in mx.distributed.Group: `rank()` and `size()`.

    Collectives on a group run on its service thread in call order. After any error (a peer
    lost, a timeout, a mismatch) the group is broken: every later call raises that error again.
    """

    def __init__(self, config: Config, transport: Transport | None = None, gate: Any = None):
        self.config = config
        self._transport = transport
        self.gate = gate
        self.root: Group = self  # the group that owns the connections (a sub-group's differs)
        self._service = Service() if transport is not None else None
        self._lock = threading.Lock()
        self._seq = 0
        self._p2p_seq: dict[tuple[str, int], int] = {}  # ("send", dst) / ("recv", src) -> count
        self._error: FastcollError | None = None
        self._closed = False
        self._tracer = None
        if config.trace and transport is not None:
            from fastcoll.trace import Tracer

            self._tracer = Tracer(config.trace, config.rank)
            atexit.register(self._write_trace)

    def rank(self) -> int:
        """This process's rank, 0 <= rank < size."""
        return self.config.rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self.config.world_size

    def __repr__(self) -> str:
        return f"<fastcoll.Group rank={self.rank()} size={self.size()} transport={self.config.transport}>"

    def transport_info(self) -> str:
        """What carries this group's messages: 'tcp', 'tcp, shared memory on 1 of 1
        connections', 'zmq', or 'none' for a world of one."""
        t = self.root._transport
        return "none" if t is None else t.describe()

    def split(self, color: int, key: int = -1) -> "Group":
        """Split into sub-groups by `color` (every rank must call it), as mx.distributed does.

        Ranks with the same color form a group, ordered by `key` (negative: by rank here). The
        sub-group shares this group's connections; see fastcoll.subgroup for the ordering rule.
        """
        from fastcoll.subgroup import split

        return split(self, color, key)

    def check(self) -> None:
        """Raise the error that broke this group (or a gate's pending error), if any."""
        if self._closed:
            raise FastcollError("this group was finalized")
        if self._error is not None:
            raise type(self._error)(str(self._error))
        if self.gate is not None:
            self.gate.check()

    def run(
        self,
        sig: str,
        body: Callable[[Call], Any],
        timeout: float | None = None,
        async_op: bool = False,
        p2p: tuple[str, int] | None = None,
    ) -> Any:
        """Run body(call) on the service thread as the next collective; its result or a Work.

        Collectives are numbered in one sequence that every rank shares; a point-to-point
        message (`p2p` = ("send", dst) or ("recv", src)) in a sequence of that pair of ranks."""
        self.check()
        limit = self.config.timeout if timeout is None else float(timeout)
        if limit <= 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        with self._lock:
            if p2p is None:
                seq = self._seq
                self._seq += 1
            else:
                seq = self._p2p_seq.get(p2p, 0)
                self._p2p_seq[p2p] = seq + 1
            queued = self._tracer.now() if self._tracer is not None else 0
            # Claiming the run lock while still holding the order lock keeps call order.
            inline = not async_op and self._service.claim_if_idle()
            if not inline:
                work = self._service.submit(functools.partial(self._execute, seq, sig, body, limit, queued))
        if inline:
            try:
                return self._execute(seq, sig, body, limit, queued)
            finally:
                self._service.release()
        return work if async_op else work.wait()

    def _execute(self, seq: int, sig: str, body: Callable[[Call], Any], limit: float, queued: int = 0) -> Any:
        if self._error is not None:
            raise type(self._error)(str(self._error))
        call = Call(self._transport, seq, sig, time.monotonic() + limit, tracer=self._tracer)
        try:
            if self._tracer is None:
                return body(call)
            self._tracer.span("queue", queued, seq=seq)
            with self._tracer.phase(sig, seq=seq):
                return body(call)
        except FastcollError as e:
            self._fail(e)
            raise
        except Exception as e:
            # Arguments were checked before the call was queued, so this is a bug; the peers may
            # be mid-message, so it must still break the group on every rank, not hang it.
            err = FastcollError(f"internal error in {sig}: {e!r}")
            self._fail(err)
            raise err from e
        except BaseException:  # Ctrl-C mid-collective: tell the peers rather than leave them waiting
            self._fail(FastcollError(f"rank {self.rank()} was interrupted during {sig}"))
            raise

    def _fail(self, error: FastcollError) -> None:
        if self._error is None:
            self._error = error
            log.error("rank %d: %s: %s", self.rank(), type(error).__name__, error)
            if self.gate is not None:
                self.gate.abort(error)  # release every issued gate, so no GPU spins on
            self._transport.abort(error)

    def finalize(self) -> None:
        """Finish queued work, tell the peers, and release sockets and threads."""
        if self._closed:
            return
        self._closed = True
        if self.gate is not None:
            # Evaluate what was gated while the peers still answer, then release the rest, so
            # that the service thread is never left waiting on a GPU nobody will run.
            if self._error is None and self.gate.pending():
                try:
                    self.gate.drain()
                except Exception as e:  # finalize goes on; the error was recorded for check()
                    log.warning("rank %d: gated results failed at finalize: %s", self.rank(), e)
            self.gate.close()
        if self._service is not None:
            self._service.close(timeout=self.config.timeout)
        if self._transport is not None:
            self._transport.close()
        self._write_trace()

    def _write_trace(self) -> None:
        if self._tracer is not None:
            path = self._tracer.write()
            log.info("rank %d: wrote the trace %s", self.rank(), path)


def bind_hosts(config: Config) -> list[str]:
    """The addresses to listen on: FASTCOLL_INTERFACE's (one or several), else the one that
    reaches the coordinator.

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


def _join_addresses(addresses: list[tuple[str, int]]) -> str:
    """[("10.0.0.1", 5000), ("::1", 5001)] -> '10.0.0.1:5000,[::1]:5001' (the rendezvous form)."""
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)


def _split_addresses(text: str, what: str) -> list[tuple[str, int]]:
    if not isinstance(text, str) or not text:
        raise FastcollError(f"{what} is missing from the rendezvous table")
    return [parse_address(part, what) for part in text.split(",")]


def connect_group(config: Config, gate: Any = None) -> Group:
    """Rendezvous with every rank and connect the transport the job asked for."""
    from fastcoll.transport import rendezvous as rdv

    deadline = time.monotonic() + config.timeout
    hosts = bind_hosts(config)
    caps = {"transport": config.transport, "gate": gate is not None, "connections": config.connections,
            "host": shm.host_id()}
    if config.transport == "zmq":
        from fastcoll.transport.zmq import ZmqListener, ZmqTransport

        if len(hosts) > 1:
            log.info("the zmq transport listens on the first of FASTCOLL_INTERFACE's addresses only: %s", hosts[0])
        zl = ZmqListener(hosts[0], config.token, MAX_PIECE_BYTES + 64 * 1024)
        try:
            table = rdv.rendezvous(config, zl.address, caps, deadline)
            _agree(config, table.caps)
            transport: Transport = ZmqTransport(
                config.rank, config.world_size, zl, table.addresses, config.timeout, deadline
            )
        except BaseException:
            zl.close()
            raise
    else:
        from fastcoll.transport.listen import AuthListener
        from fastcoll.transport.tcp import TcpTransport

        listener = AuthListener(hosts, 0, config.token)
        try:
            table = rdv.rendezvous(config, _join_addresses(listener.addresses), caps, deadline)
            _agree(config, table.caps)
            socks = _tcp_mesh(config, listener, table.addresses, deadline)
        finally:
            listener.close()
        here = {r for r, c in enumerate(table.caps) if c.get("host") == caps["host"]}
        socks = shm.upgrade(config.rank, socks, config.shm, deadline, here)
        transport = TcpTransport(config.rank, config.world_size, socks, config.timeout)
    if gate is not None and not all(c.get("gate") for c in table.caps):
        log.info("the fence gate is off: not every rank can run it")
        gate.close()
        gate = None
    return Group(config, transport, gate)


# A connection's claimed id in the handshake: rank + channel * _CHANNEL_STRIDE.
_CHANNEL_STRIDE = 1 << 16


def _tcp_mesh(config: Config, listener: Any, addresses: list[str], deadline: float) -> dict[int, list[socket.socket]]:
    """FASTCOLL_CONNECTIONS authenticated sockets to every peer: this rank connects to the
    lower ranks and accepts the higher ones, so no two ranks wait on each other.

    Connection ch goes to the peer's address ch (modulo how many it listens on): with one
    address per cable, as MLX's ring does with a hostfile's "ips", the channels stripe a large
    message over every cable."""
    from fastcoll.transport import rendezvous as rdv

    c, me = config.connections, config.rank
    got: dict[int, socket.socket] = {}
    try:
        for p in range(me):
            theirs = _split_addresses(addresses[p], f"rank {p}'s address")
            for ch in range(c):
                phost, pport = theirs[ch % len(theirs)]
                got[p + ch * _CHANNEL_STRIDE] = rdv.connect(
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


def _agree(config: Config, caps: list[dict]) -> None:
    for key, var in (("transport", "FASTCOLL_TRANSPORT"), ("connections", "FASTCOLL_CONNECTIONS")):
        if len({c.get(key) for c in caps}) > 1:
            which = {r: c.get(key) for r, c in enumerate(caps)}
            raise MismatchError(f"ranks disagree on {var}: {which}")
