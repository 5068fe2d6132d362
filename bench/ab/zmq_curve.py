"""ZeroMQ on loopback with and without CURVE: 64 x 1 MiB one way, and a 4 KiB round trip.

    python bench/ab/zmq_curve.py
"""

from __future__ import annotations

import time

import numpy as np
import zmq


def run(curve: bool) -> tuple[float, float]:
    ctx = zmq.Context()
    spub, ssec = zmq.curve_keypair()
    cpub, csec = zmq.curve_keypair()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    if curve:
        r.curve_server, r.curve_secretkey = True, ssec
        d.curve_serverkey, d.curve_publickey, d.curve_secretkey = spub, cpub, csec
    port = r.bind_to_random_port("tcp://127.0.0.1")
    d.connect(f"tcp://127.0.0.1:{port}")
    payload = np.ones((1 << 20) // 4, np.float32)
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(64):
            d.send(payload, copy=False)
            r.recv_multipart(copy=False)
        rates.append(64 * payload.nbytes / (time.perf_counter() - t) / 1e9)
    small, rtts = np.ones(1024, np.float32), []
    for _ in range(2000):
        t = time.perf_counter()
        d.send(small)
        ident, body = r.recv_multipart()
        r.send_multipart([ident, body])
        d.recv()
        rtts.append(time.perf_counter() - t)
    ctx.destroy(linger=0)
    return float(np.median(rates)), float(np.median(rtts) * 1e6)


if __name__ == "__main__":
    for curve in (False, True, False, True):
        gbps, rtt = run(curve)
        print(f"{'CURVE' if curve else 'NULL '}: 1 MiB messages {gbps:.2f} GB/s; 4 KiB round trip {rtt:.0f} us (medians)")
