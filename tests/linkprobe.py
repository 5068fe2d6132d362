"""What a link of the bed gives: round trips of small messages and one TCP stream's rate
(tests/netbed.py's `Bed.probe_link` runs it between two hosts: bench/hostbed.py records the delay
and rate actually got, tests/test_netbed_built.py checks that the shaping took).

    python tests/linkprobe.py serve PORT SECONDS     # UDP echo, TCP echo and TCP sink on PORT
    python tests/linkprobe.py probe ADDR PORT [COUNT] [MIB]

`probe` prints one JSON line: UDP and TCP (TCP_NODELAY) round trips of 64 B (microseconds:
min, p10, median, p90 over COUNT after 20 unmeasured) and the rate of one TCP stream of MIB MiB
(Gbit/s, from the first byte sent to the receiver's count coming back). Standard library only.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time


def _udp_echo(port: int, until: float) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", port))
        s.settimeout(0.5)
        while time.monotonic() < until:
            try:
                data, peer = s.recvfrom(2048)
            except socket.timeout:
                continue
            s.sendto(data, peer)


def _tcp_client(conn: socket.socket) -> None:
    """First byte b"e": echo 64-byte messages until EOF; b"s": count bytes to EOF, send the count."""
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = conn.recv(1)
        if kind == b"e":
            while (data := conn.recv(64)):
                conn.sendall(data)
        elif kind == b"s":
            total, buf = 0, bytearray(1 << 20)
            while (n := conn.recv_into(buf)):
                total += n
            conn.sendall(struct.pack("!Q", total))


def serve(port: int, seconds: float) -> None:
    until = time.monotonic() + seconds
    threading.Thread(target=_udp_echo, args=(port, until), daemon=True).start()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(4)
        s.settimeout(0.5)
        print("listening", flush=True)
        while time.monotonic() < until:
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            threading.Thread(target=_tcp_client, args=(conn,), daemon=True).start()


def _summary(us: list[float]) -> dict:
    q = statistics.quantiles(us, n=10)
    return {"min": round(min(us), 1), "p10": round(q[0], 1), "median": round(statistics.median(us), 1),
            "p90": round(q[-1], 1), "count": len(us)}


def _connect(addr: str, port: int, kind: bytes) -> socket.socket:
    """A connection to `serve` (listening before it said so) of this kind, Nagle off."""
    s = socket.create_connection((addr, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(kind)
    return s


def _echoed(s: socket.socket, n: int) -> None:
    if len(s.recv(n, socket.MSG_WAITALL)) != n:
        raise ConnectionError("the echo server closed the connection")


def _round_trips(send, recv, count: int) -> list[float]:
    out = []
    for i in range(count + 20):
        t = time.perf_counter()
        send()
        recv()
        if i >= 20:
            out.append((time.perf_counter() - t) * 1e6)
    return out


def probe(addr: str, port: int, count: int, mib: int) -> dict:
    msg = b"x" * 64
    with _connect(addr, port, b"e") as t:
        tcp = _round_trips(lambda: t.sendall(msg), lambda: _echoed(t, 64), count)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(2)
        u.connect((addr, port))
        udp = _round_trips(lambda: u.send(msg), lambda: u.recv(2048), count)
    chunk = bytes(1 << 20)
    with _connect(addr, port, b"s") as s:
        t0 = time.perf_counter()
        for _ in range(mib):
            s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
        got = struct.unpack("!Q", s.recv(8))[0]
        seconds = time.perf_counter() - t0
    return {"udp_rtt_us": _summary(udp), "tcp_rtt_us": _summary(tcp), "stream_mib": mib,
            "stream_bytes_received": got, "stream_gbit_s": round(got * 8 / seconds / 1e9, 3)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4:
        serve(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1:2] == ["probe"] and len(sys.argv) in (4, 5, 6):
        extra = [int(x) for x in sys.argv[4:]]
        print(json.dumps(probe(sys.argv[2], int(sys.argv[3]), *(extra + [500, 64][len(extra):]))))
    else:
        sys.exit(__doc__)
