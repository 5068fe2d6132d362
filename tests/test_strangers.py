"""Strangers: connections to every port a job listens on, that do not know the job's token.

The coordinator (rank 0, during the rendezvous) and each rank's ZeroMQ ROUTER (bound for the
whole job) get: a connection that sends nothing and holds the socket open, a handshake with no
token, one with a wrong token, a replayed handshake (recorded from a real rank through a proxy,
or from a real exchange), a header claiming a 2**62-byte payload, and random bytes. Each must be
refused (logged as AuthenticationError, or dropped by libzmq) without the rank allocating what
it claims (its resident size does not jump) and without delaying the job's collectives by more
than a few milliseconds (median latency with and without the strangers, compared).

Also here: where a local job listens (loopback only; FASTCOLL_INTERFACE chooses), IPv6, and the
wire-level bounds against a peer that does know the token but lies about sizes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from conftest import PROGS, Job, free_port, rank_env
from fastcoll import wire
from fastcoll.errors import MismatchError
from fastcoll.transport import auth
from fastcoll.wire import DATA, Header

TOKEN = "stranger-test-token"
HUGE = 2**62
DELAY_LIMIT = 0.003  # "a few milliseconds" of median latency
RSS_LIMIT_KIB = 16 * 1024


# --- looking at a process from outside ----------------------------------------------------------


def _addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return ip, int(port, 16)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(_addr(cols[1]))
    return found


def is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- rank processes started one by one -----------------------------------------------------------


class Ranks:
    """Rank processes started individually (so that strangers can come in between)."""

    def __init__(self):
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, rank: int, size: int, port: int, transport: str, args: list[str], **env: str) -> subprocess.Popen:
        e = rank_env(rank, size, port, transport, token=TOKEN, **env)
        p = subprocess.Popen(
            [sys.executable, os.path.join(PROGS, "fault_stranger.py"), *args],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.procs[rank] = p
        return p

    def finish(self, timeout: float) -> dict[int, tuple[int, str, str]]:
        order = sorted(self.procs)
        results = Job([self.procs[r] for r in order]).wait(timeout)
        return {r: (x.code, x.out, x.err) for r, x in zip(order, results)}

    def kill(self):
        Job(list(self.procs.values())).kill()


@pytest.fixture
def ranks():
    r = Ranks()
    yield r
    r.kill()


class Proxy:
    """A TCP relay in front of the coordinator that records what the client sends."""

    def __init__(self, port: int):
        self.upstream = port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.sent = bytearray()
        threading.Thread(target=self._run, daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, record: bool):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if record:
                    self.sent += data
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _run(self):
        client, _ = self.sock.accept()
        server = socket.create_connection(("127.0.0.1", self.upstream))
        threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()


# --- strangers -----------------------------------------------------------------------------------


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return s


def _closed_by_peer(s: socket.socket, timeout: float = 5.0) -> bool:
    """True if the other end closes `s` (EOF or reset) within `timeout`, whatever it sent first."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _hmac(token: bytes, role: bytes, cn: bytes, sn: bytes, rank: int) -> bytes:
    return hmac.new(token, role + cn + sn + struct.pack("<I", rank), hashlib.sha256).digest()


def handshake_with(host: str, port: int, token: bytes, rank: int) -> socket.socket:
    """The client side of the handshake, done by someone with `token` (a wrong one here)."""
    s = _connect(host, port)
    cn = secrets.token_bytes(auth.NONCE)
    s.sendall(auth.MAGIC + cn + struct.pack("<I", rank))
    s.settimeout(5)
    reply = b""
    while len(reply) < auth.NONCE + auth.MAC:
        chunk = s.recv(auth.NONCE + auth.MAC - len(reply))
        if not chunk:
            break
        reply += chunk
    if len(reply) == auth.NONCE + auth.MAC:
        s.sendall(_hmac(token, b"c", cn, reply[: auth.NONCE], rank))
    return s


def replay(host: str, port: int, recorded: bytes) -> socket.socket:
    """Send a recorded client handshake again: HELLO, wait for the challenge, then the old proof."""
    hello, proof = recorded[: auth.HELLO_BYTES], recorded[auth.HELLO_BYTES : auth.HELLO_BYTES + auth.PROOF_BYTES]
    s = _connect(host, port)
    s.sendall(hello)
    s.settimeout(5)
    got = b""
    while len(got) < auth.CHALLENGE_BYTES:
        chunk = s.recv(auth.CHALLENGE_BYTES - len(got))
        if not chunk:
            break
        got += chunk
    s.sendall(proof)
    return s


def huge_header() -> bytes:
    """A fastcoll frame whose header claims a 2**62-byte payload (and is long enough to be read)."""
    return wire.pack(Header(DATA, 0, "all_reduce(sum,float32,(4611686018427387904,))", 0, HUGE))


def coordinator_strangers(port: int, recorded: bytes) -> tuple[list[socket.socket], list[socket.socket]]:
    """Strangers at the coordinator. Returns (refused ones, silent ones held open)."""
    host = "127.0.0.1"
    silent = [_connect(host, port) for _ in range(8)]
    refused = [
        handshake_with(host, port, b"", 2),  # no token
        handshake_with(host, port, b"wrong-token", 2),  # wrong token
        replay(host, port, recorded),  # rank 1's real handshake, replayed
    ]
    s = _connect(host, port)
    s.sendall(huge_header())
    refused.append(s)
    s = _connect(host, port)
    s.sendall(os.urandom(4096))
    refused.append(s)
    return refused, silent


ZMTP_GREETING = (
    b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
)


def _zmtp_ready() -> bytes:
    body = b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
    return bytes([0x04, len(body)]) + body


def flood(port: int, count: int, size: int) -> int:
    """A ZMTP/3.0 peer that pushes `count` messages of `size` bytes; returns the bytes it got out."""
    s = _connect("127.0.0.1", port)
    sent = 0
    try:
        s.sendall(ZMTP_GREETING + _zmtp_ready())
        frame = b"\x02" + struct.pack(">Q", size) + b"\0" * size
        for _ in range(count):
            s.sendall(frame)
            sent += len(frame)
    except OSError:
        pass
    finally:
        s.close()
    return sent


class RouterStrangers:
    """Strangers at ZeroMQ ROUTERs: raw sockets and DEALERs that do not know the token."""

    KINDS = ("silent", "random", "zmtp_huge", "no_token", "wrong_token", "replay", "huge_header")

    def __init__(self, pause: float = 0.0):
        self.ctx = zmq.Context()
        self.socks: list = []
        self.raw_refused: list[socket.socket] = []
        self.pause = pause  # between a DEALER's connect and its sends (a test opens that window)

    def _dealer(self, port: int, frames: list[bytes]):
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(self.pause)
        for f in frames:
            try:
                d.send(f, zmq.NOBLOCK)
            except zmq.Again:
                # A rank whose door is closed refused this stranger in the ZAP handshake before
                # it sent, and libzmq dropped the DEALER's only peer: nothing can go any more (a
                # blocking send would wait for ever). That is what refusing it means.
                break
        self.socks.append(d)

    def add(self, kind: str, port: int) -> None:
        if kind == "silent":
            self.socks.append(_connect("127.0.0.1", port))
        elif kind == "random":
            # libzmq may take bytes that do not start 0xFF for an old ZMTP/1.0 peer and cut
            # them into "messages" (each bounded by ZMQ_MAXMSGSIZE): they reach the rank from
            # an identity that never proved the token and are dropped there.
            s = _connect("127.0.0.1", port)
            s.sendall(os.urandom(4096))
            self.socks.append(s)
        elif kind == "zmtp_huge":
            # A well-formed ZMTP 3.0 greeting, then a message frame claiming 2**62 bytes.
            s = _connect("127.0.0.1", port)
            s.sendall(ZMTP_GREETING + _zmtp_ready() + b"\x02" + struct.pack(">Q", HUGE) + b"x" * 64)
            self.raw_refused.append(s)
        elif kind == "no_token":
            # A data message straight away, no handshake at all.
            self._dealer(port, [wire.pack(Header(DATA, 0, "barrier()", 0, 0))])
        elif kind == "wrong_token":
            hello, nonce = auth.hello(1)
            self._dealer(port, [hello, _hmac(b"wrong-token", b"c", nonce, b"\x00" * auth.NONCE, 1)])
        elif kind == "replay":
            # A genuine exchange with the job's token (as a rank and a ROUTER make it), replayed.
            hello, nonce = auth.hello(1)
            challenge, _ = auth.challenge(TOKEN.encode(), hello)
            proof = auth.prove(TOKEN.encode(), 1, nonce, challenge)
            self._dealer(port, [hello, proof])
        elif kind == "huge_header":
            self._dealer(port, [huge_header()])
        else:
            raise ValueError(kind)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        for s in self.raw_refused:
            s.close()
        self.socks.clear()
        self.raw_refused.clear()

    def term(self) -> None:
        self.close()
        self.ctx.term()


# --- the tests -----------------------------------------------------------------------------------


def _phase(folder: str, phase: str, world: int, timeout: float = 60) -> list[dict]:
    open(os.path.join(folder, f"go.{phase}"), "w").close()
    paths = [os.path.join(folder, f"done.{phase}.{r}") for r in range(world)]
    wait_for(lambda: all(os.path.exists(p) for p in paths), timeout, f"phase {phase}")
    out = []
    for p in paths:
        with open(p) as f:
            out.append(json.load(f))
    return out


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_strangers_are_refused_and_do_not_delay_the_job(ranks, tmp_path, transport):
    world, port = 3, free_port()
    folder = str(tmp_path)
    report: list[str] = []
    zmq_phases = ["stranger_" + k for k in RouterStrangers.KINDS] + ["stranger_all"]
    phases = ["base1"] + (zmq_phases if transport == "zmq" else []) + ["base2"]
    args = [folder, ",".join(phases), "300", "256"]
    env = {"timeout": "10"}

    # Rendezvous: rank 0 waits at the coordinator; rank 1 comes through a recording proxy.
    r0 = ranks.start(0, world, port, transport, args, **env)
    wait_for(lambda: any(p == port for _, p in listening(r0.pid)), 10, "the coordinator to listen")
    proxy = Proxy(port)
    r1 = ranks.start(1, world, proxy.port, transport, args, **env)
    wait_for(lambda: len(proxy.sent) >= auth.HELLO_BYTES + auth.PROOF_BYTES, 10, "rank 1's handshake")
    time.sleep(0.2)
    rss_before = rss_kib(r0.pid)

    refused, silent = coordinator_strangers(port, bytes(proxy.sent))
    early = RouterStrangers()
    if transport == "zmq":  # the ROUTERs are bound already, before the rendezvous ends
        for pid in (r0.pid, r1.pid):
            for _, p in listening(pid):
                if p != port:
                    for kind in RouterStrangers.KINDS:
                        early.add(kind, p)
    for s in refused:
        assert _closed_by_peer(s), "the coordinator kept a refused stranger's connection open"
    rss_after = rss_kib(r0.pid)
    assert rss_after - rss_before < RSS_LIMIT_KIB, (rss_before, rss_after)
    report.append(f"{transport} coordinator: rank 0 RSS {rss_before} -> {rss_after} KiB with strangers")

    # The last rank joins while 8 silent strangers still hold connections to the coordinator.
    r2 = ranks.start(2, world, port, transport, args, **env)
    ready = {}
    for r, p in ((0, r0), (1, r1), (2, r2)):
        line = p.stdout.readline().split()
        assert line and line[0] == "READY", f"rank {r} did not start: {line}"
        ready[r] = float(line[3])
    report.append(f"{transport} rendezvous with 8 silent strangers held open: rank 2 init {ready[2] * 1000:.0f} ms")
    assert ready[2] < 3.0, ready

    # A local job listens on loopback only; over TCP nothing listens once the mesh is up.
    for r, p in ((0, r0), (1, r1), (2, r2)):
        addrs = listening(p.pid)
        assert all(is_loopback(ip) for ip, _ in addrs), (r, addrs)
        if transport == "tcp":
            assert addrs == [], f"rank {r} still listens on {addrs} after the mesh is up"
        else:
            assert len(addrs) == 1, (r, addrs)  # its ROUTER

    results = {"base1": _phase(folder, "base1", world)}
    if transport == "zmq":
        routers = [listening(p.pid)[0][1] for p in (r0, r1, r2)]
        late = RouterStrangers()
        for kind in RouterStrangers.KINDS + ("all",):
            kinds = RouterStrangers.KINDS if kind == "all" else (kind,)
            for k in kinds:
                for rp in routers:
                    for _ in range(2):
                        late.add(k, rp)
            time.sleep(0.1)
            results["stranger_" + kind] = _phase(folder, "stranger_" + kind, world)
            for s in late.raw_refused:
                assert _closed_by_peer(s, 2.0), f"a ROUTER kept a {kind} stranger's raw connection open"
            late.close()
        late.term()
        # A flood while the ranks are idle (between phases nobody drains the ROUTER): a ZMTP
        # peer pushing 64 messages of 4 MiB at every rank. Refused in libzmq's handshake, so
        # nothing is queued for the rank to hold.
        before = {p.pid: rss_kib(p.pid) for p in (r0, r1, r2)}
        sent = [flood(rp, 64, 4 << 20) for rp in routers]
        time.sleep(0.5)
        grew = {pid: rss_kib(pid) - kib for pid, kib in before.items()}
        report.append(f"zmq idle flood of 3 x 256 MiB: {sum(sent) >> 20} MiB got through; RSS grew {grew} KiB")
        assert all(g < RSS_LIMIT_KIB for g in grew.values()), grew
    results["base2"] = _phase(folder, "base2", world)
    for s in silent:
        s.close()
    early.term()

    out = ranks.finish(30)
    for r, (code, o, e) in out.items():
        assert code == 0 and "OK" in o, f"rank {r} exit {code}\n{o}\n{e[-3000:]}"
    # The refusals were logged on the listener (5 at the coordinator, DEALERs at the ROUTERs).
    refusals = out[0][2].count("AuthenticationError")
    assert refusals >= len(refused), out[0][2][-3000:]
    if transport == "zmq":
        for r in range(world):
            assert "refused a ZeroMQ connection" in out[r][2], out[r][2][-2000:]

    base = min(np.median([x["median"] for x in results[b]]) for b in ("base1", "base2"))
    rss0 = max(x["rss_kib"] for x in results["base1"])
    lines = [f"{transport} baseline all_reduce(1 KiB) median {base * 1e6:.0f} us"]
    for phase, res in results.items():
        med = float(np.median([x["median"] for x in res]))
        rss = max(x["rss_kib"] for x in res)
        lines.append(f"  {phase:22s} median {med * 1e6:7.0f} us  (+{(med - base) * 1e6:6.0f} us)  max RSS {rss} KiB")
        assert med - base < DELAY_LIMIT, f"{phase}: median {med * 1e3:.2f} ms vs {base * 1e3:.2f} ms"
        assert rss - rss0 < RSS_LIMIT_KIB, f"{phase}: RSS grew from {rss0} to {rss} KiB"
    print("\n" + "\n".join(report + lines))


# --- listening addresses ---------------------------------------------------------------------------


def _other_address() -> str | None:
    """A non-loopback address of this host, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent
        ip = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if ip.startswith("127.") else ip


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
@pytest.mark.parametrize("where", ["loopback", "interface-127.0.0.2", "interface-host", "ipv6"])
def test_listening_addresses(ranks, tmp_path, transport, where):
    """Rank 0, alone, listens where the job's addresses say; the job then runs."""
    port = free_port()
    env = {"timeout": "10"}
    coordinator_host = "127.0.0.1"
    want = "127.0.0.1"
    if where == "interface-127.0.0.2":
        env["FASTCOLL_INTERFACE"] = want = "127.0.0.2"
    elif where == "interface-host":
        ip = _other_address()
        if ip is None:
            pytest.skip("this host has no non-loopback IPv4 address")
        env["FASTCOLL_INTERFACE"] = want = ip
    elif where == "ipv6":
        if not socket.has_ipv6 or not os.path.exists("/proc/net/if_inet6"):
            pytest.skip("no IPv6 here")
        coordinator_host = want = "::1"
    coordinator = f"[{coordinator_host}]:{port}" if ":" in coordinator_host else f"{coordinator_host}:{port}"
    args = [str(tmp_path), "base1", "50", "16"]
    r0 = ranks.start(0, 2, port, transport, args, FASTCOLL_COORDINATOR=coordinator, **env)
    wait_for(lambda: len(listening(r0.pid)) == 2, 10, "rank 0 to listen (coordinator and data)")
    addrs = listening(r0.pid)
    coord = [a for a in addrs if a[1] == port]
    data = [a for a in addrs if a[1] != port]
    assert coord == [(coordinator_host, port)], addrs  # the coordinator: the address it was given
    assert len(data) == 1 and data[0][0] == want, addrs  # data: FASTCOLL_INTERFACE, else the route
    assert not any(ip in ("0.0.0.0", "::") for ip, _ in addrs), addrs
    ranks.start(1, 2, port, transport, args, FASTCOLL_COORDINATOR=coordinator, **env)
    _phase(str(tmp_path), "base1", 2)
    for r, (code, o, e) in ranks.finish(30).items():
        assert code == 0 and "OK" in o, f"rank {r} exit {code}\n{o}\n{e[-3000:]}"


# --- a peer that knows the token but lies about sizes ---------------------------------------------


def test_wire_bounds_before_allocating():
    """Lengths from the wire are bounded before anything is allocated."""
    with pytest.raises(ValueError):
        wire.header_length(struct.pack("<I", 0xFFFFFFFF))
    with pytest.raises(ValueError):
        wire.header_length(struct.pack("<I", wire.MAX_HEADER + 1))
    # msgpack strings longer than MAX_HEADER are refused, not materialised
    with pytest.raises(ValueError):
        wire.unpack(b"\x95\x00\x00\xdb\xff\xff\xff\xff")
    from fastcoll.transport.stream import recv_message

    a, b = socket.socketpair()
    try:
        a.sendall(struct.pack("<I", 0xFFFFFFF0))
        with pytest.raises(ValueError):
            recv_message(b, 1 << 20, time.monotonic() + 2, "a stranger")
    finally:
        a.close()
        b.close()


def test_tcp_header_claiming_huge_payload_is_a_mismatch():
    """An authenticated peer announcing 2**62 bytes: MismatchError, nothing allocated."""
    from fastcoll.transport.link import SocketLink
    from fastcoll.transport.tcp import TcpTransport

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    b = socket.create_connection(server.getsockname())
    a, _ = server.accept()
    server.close()
    t = TcpTransport(0, 2, {1: [SocketLink(a)]}, timeout=2.0)
    try:
        before = rss_kib(os.getpid())
        b.sendall(wire.pack(Header(DATA, 0, "all_reduce(sum,float32,(256,))", 0, HUGE)) + b"\0" * 4096)
        out = np.empty(256, np.float32)
        with pytest.raises(MismatchError, match="4611686018427387904"):
            t.recv(1, 0, "all_reduce(sum,float32,(256,))", 0, memoryview(out).cast("B"), time.monotonic() + 2)
        assert rss_kib(os.getpid()) - before < 4096
    finally:
        t.close()
        b.close()


def test_a_stranger_refused_before_it_sends_does_not_block():
    # The refusal can beat a DEALER's first send (it happened once in a suite run, and the
    # stranger's blocking send hung the test): here it always does, after a pause.
    from fastcoll.transport.zmq import ZmqListener

    listener = ZmqListener("127.0.0.1", TOKEN.encode(), 1 << 20)
    strangers = RouterStrangers(pause=0.5)
    try:
        listener.close_door()
        port = int(listener.address.rsplit(":", 1)[1])
        done = threading.Event()
        threading.Thread(target=lambda: (strangers.add("no_token", port), done.set()), daemon=True).start()
        assert done.wait(10), "a stranger refused before its first send blocked in send()"
    finally:
        strangers.close()
        listener.close()


def test_a_listener_closed_before_its_accept_thread_runs_ends_it_quietly(monkeypatch):
    # CI once printed "Exception in thread fastcoll-accept ... Bad file descriptor": a rank gave
    # up (its rendezvous failed) and closed its listener before the accept thread had started.
    # Here the thread always starts only after close().
    from fastcoll.transport import listen

    closed = threading.Event()
    errors: list[BaseException] = []

    class LateThread(threading.Thread):
        def run(self):
            closed.wait(10)
            super().run()

    monkeypatch.setattr(listen.threading, "Thread", LateThread)
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    listener = listen.AuthListener("127.0.0.1", 0, TOKEN.encode())
    threads = list(listener._threads)
    listener.close()
    closed.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert errors == []
