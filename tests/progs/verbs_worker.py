"""One rank of tests/test_verbs_link.py: a native engine whose link to every peer is a verbs (RDMA)
link on the test fabric (FASTCOLL_VERBS_LIB), beside a connected socket the test made and passed
by fd, and a Group over that engine, as fastcoll.init() makes one over its links.

    verbs_worker.py RANK SIZE CASE FDS_JSON

FDS_JSON maps each peer to this rank's end of the socket to it. VERBS_DEVICE names this rank's
device (default fcfab<rank>), VERBS_RELIABLE=1 asks for RC queue pairs, VERBS_TIMEOUT is the
collectives' timeout. Cases:
  collectives  every collective over several dtypes and sizes, exact; then the link's description
  fault        all_reduce until one fails: prints "ERROR <type> <message>" and how long it took
  kill         rank 1 kills itself in the second call; rank 0 prints its error as for `fault`
  open         only the links: "OPENED", or "ERROR <type> <message>" of links.add
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import numpy as np

import fastcoll
from fastcoll.config import Config
from fastcoll.engine import _native
from fastcoll.engine.native import NativeEngine, NativeTransport, spin_us
from fastcoll.group import Group

RANK, SIZE, CASE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
FDS = {int(p): fd for p, fd in json.loads(sys.argv[4]).items()}
TIMEOUT = float(os.environ.get("VERBS_TIMEOUT", "30"))


def open_links(native) -> None:
    device = os.environ.get("VERBS_DEVICE", f"fcfab{RANK % 4}")
    for peer in sorted(FDS):  # ascending (peer, channel), as the job's links are added
        native.links.add(peer, 0, FDS[peer], kind="verbs", device=device,
                         library=os.environ.get("FASTCOLL_VERBS_LIB"), reliable=os.environ.get("VERBS_RELIABLE") == "1",
                         setup_timeout=float(os.environ.get("VERBS_SETUP_TIMEOUT", "10")))


def group() -> tuple[Group, object]:
    config = Config(rank=RANK, world_size=SIZE, timeout=TIMEOUT)
    native = _native.Engine(RANK, SIZE, 1, spin_us(config, SIZE), config.yield_us, threading.main_thread().ident,
                            config.long_wait_us)
    open_links(native)
    connections = [(p, 0, "verbs", None, None) for p in sorted(FDS)]
    transport = NativeTransport(native, RANK, SIZE, TIMEOUT, "verbs", connections)
    return Group(config, NativeEngine(native, transport, TIMEOUT), None, ["localhost"] * SIZE), native


def ints(n: int, dtype: str, rank: int, salt: int) -> np.ndarray:
    """Small integers that sum and multiply exactly in every dtype, different on every rank."""
    rng = np.random.default_rng(salt * 100 + rank)
    return rng.integers(1, 4, size=n).astype(dtype)


def reductions(g: Group, n: int, dtype: str, salt: int) -> int:
    vs = [ints(n, dtype, k, salt) for k in range(SIZE)]
    x = vs[RANK]
    ops = (("sum", np.sum), ("prod", np.prod)) + ((("max", np.max), ("min", np.min)) if "complex" not in dtype else ())
    for op, ref in ops:
        want = ref(np.stack(vs), axis=0).astype(dtype)
        assert np.array_equal(fastcoll.all_reduce(x, op=op, group=g), want), (op, n, dtype)
    whole = np.sum(np.stack(vs), axis=0).astype(dtype)
    got = fastcoll.reduce(x, root=salt % SIZE, group=g)
    assert RANK != salt % SIZE or np.array_equal(got, whole), ("reduce", n, dtype)
    if n % SIZE == 0:
        k = n // SIZE
        assert np.array_equal(fastcoll.reduce_scatter(x, group=g), whole[RANK * k:(RANK + 1) * k]), (n, dtype)
    return 6


def movers(g: Group, n: int, dtype: str, salt: int) -> int:
    vs = [ints(n, dtype, k, salt) for k in range(SIZE)]
    x, root = vs[RANK], salt % SIZE
    assert np.array_equal(fastcoll.all_gather(x, group=g), np.concatenate(vs)), ("all_gather", n, dtype)
    assert np.array_equal(fastcoll.broadcast(x, root=root, group=g), vs[root]), ("broadcast", n, dtype)
    got = fastcoll.gather(x, root=root, group=g)
    assert RANK != root or np.array_equal(np.asarray(got).reshape(-1), np.concatenate(vs)), ("gather", n, dtype)
    if n % SIZE == 0:
        k = n // SIZE
        blocks = [v.reshape(SIZE, k) for v in vs]
        got = fastcoll.all_to_all(blocks[RANK], group=g)
        assert np.array_equal(got, np.stack([b[RANK] for b in blocks])), ("all_to_all", n, dtype)
        got = fastcoll.scatter(blocks[root] if RANK == root else blocks[RANK], root=root, group=g)
        assert np.array_equal(np.asarray(got).reshape(-1), blocks[root][RANK]), ("scatter", n, dtype)
    return 5


def point_to_point(g: Group, n: int) -> None:
    """A message around the ring (even ranks send first: a send ends once its bytes have left)."""
    x = ints(n, "float32", RANK, 7)
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    if RANK % 2 == 0:
        fastcoll.send(x, right, group=g)
    got = fastcoll.recv(x.shape, np.float32, left, group=g)
    if RANK % 2:
        fastcoll.send(x, right, group=g)
    assert np.array_equal(got, ints(n, "float32", left, 7)), "send/recv"


def collectives() -> None:
    g, native = group()
    count, salt = 0, 0
    # 4 B .. 8 MiB: a frame within one slot, frames across slots, and long pipelines of slots.
    for dtype, sizes in (("float32", (1, 12, 1000, 16_384, 262_144, 2_097_152)), ("float64", (3, 65_536)),
                         ("int32", (5, 100_000)), ("int64", (2, 131_072)), ("float16", (7, 33_000)),
                         ("uint8", (1, 65_536, 1_048_576)), ("complex64", (4, 9_000))):
        for n in sizes:
            salt += 1
            n -= n % SIZE if n >= SIZE else 0
            count += movers(g, n, dtype, salt)
            if dtype != "uint8" or n < 100_000:
                count += reductions(g, n, dtype, salt)
    for n in (1, 2_000_000):
        point_to_point(g, n)
    fastcoll.barrier(group=g)
    info = [native.links.info(p, 0) for p in sorted(FDS)]
    nodelay = []
    for fd in FDS.values():  # (the engine's sockets: asked through a duplicate)
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
            nodelay.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    g.finalize()
    print(f"rank {RANK}: {count} checks passed")
    print("LINKS", json.dumps(info), flush=True)
    print("NODELAY", json.dumps(nodelay), flush=True)


def fault() -> None:
    g, _ = group()
    x = np.ones(262_144, np.float32)
    started = time.monotonic()
    try:
        for i in range(200):
            if CASE == "kill" and RANK == 1 and i == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.monotonic()
            fastcoll.all_reduce(x, group=g)
        print("NOERROR", flush=True)
    except fastcoll.FastcollError as e:
        print(f"ERROR {type(e).__name__} {str(e).replace(chr(10), ' ')}", flush=True)
        print(f"AFTER {time.monotonic() - started:.2f}", flush=True)
    g.finalize()


def opened() -> None:
    native = _native.Engine(RANK, SIZE, 1, 0, 0, threading.main_thread().ident, 0)
    try:
        open_links(native)
        print("OPENED", flush=True)
    except Exception as e:
        print(f"ERROR {type(e).__name__} {e}", flush=True)
    native.close(0.0, 0.0)


if __name__ == "__main__":
    {"collectives": collectives, "fault": fault, "kill": fault, "open": opened}[CASE]()
