"""One rank of tests/test_shm_peer.py: a peer on the same host that holds the job's token and
misbehaves through the shared memory it shares with rank 1 (rank 0, the segments' creator,
which reaches the rings through the Python objects that mapped them, whichever engine then
takes them over), and rank 1, its victim. Both run the engine FASTCOLL_NATIVE says (a job runs
one engine on every rank).

    shm_peer_worker.py SCENARIO

    head-negative, head-past, tail-negative, tail-past
              rank 0 writes a ring counter out of range (a head below zero or past the tail by
              more than the capacity, a tail below zero or past the head) into the rings it
              shares with rank 1, then idles; rank 1 calls a broadcast that reads that counter
              (from rank 0 for a head, to it for a tail) and must raise
    shrink    rank 0 tries to shrink every shared-memory segment it holds (ftruncate on each
              of its fds that is one); then both ranks run collectives through the rings
    pause     rank 0 stops once it has offered its segments (the shm-offered hook) until the
              test kills it; rank 1 reports what init() or its first call raised

Lines the test reads:

    CORRUPTED <counter> <value>        rank 0 wrote it
    SHRINK <done> <refused>            rank 0: how many segments it shrank, how many refused
    OFFERED                            rank 0 stopped at the hook
    ERROR <class> <elapsed> <message>  rank 1: what its call raised
    OK                                 the rank finished
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

import numpy as np

import fastcoll
from fastcoll import testhooks
from fastcoll.transport import shm

SCENARIO = sys.argv[1]
faulthandler.dump_traceback_later(60, exit=True)
RANK = int(os.environ["FASTCOLL_RANK"])
rings: list = []  # (tx, rx, segment) of each shared-memory link this rank made


def say(*parts) -> None:
    print(*parts, flush=True)


def spy() -> None:
    made = shm._rings

    def rings_kept(mem, capacity, lower):
        got = made(mem, capacity, lower)
        rings.append(got)
        return got

    shm._rings = rings_kept


def corrupt() -> None:
    tx, rx, _ = rings[0]  # tx: rank 1 reads it (its head is rank 0's); rx: rank 1 writes it (its tail is rank 0's)
    word, ring, value = {
        "head-negative": ("head", tx, -5),
        "head-past": ("head", tx, tx.ctl[shm._TAIL] + tx.cap + 1),
        "tail-negative": ("tail", rx, -5),
        "tail-past": ("tail", rx, rx.ctl[shm._HEAD] + 1),
    }[SCENARIO]
    ring.ctl[shm._HEAD if word == "head" else shm._TAIL] = value
    say("CORRUPTED", word, value)


def shrink() -> None:
    done = refused = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/memfd:") or target.startswith("/dev/shm/fc"):
            try:
                os.ftruncate(int(name), 4096)
                done += 1
            except OSError:
                refused += 1
    say("SHRINK", done, refused)


def collectives(g) -> None:
    n = g.size()
    for count in (4, 3000, 800_000):  # the last larger than a ring: it streams through
        y = fastcoll.all_reduce(np.arange(count, dtype=np.float32) + g.rank())
        assert np.array_equal(y, n * np.arange(count, dtype=np.float32) + sum(range(n))), f"all_reduce of {count}"


def victim() -> None:
    start = time.monotonic()
    try:
        g = fastcoll.init()
        if SCENARIO == "shrink":
            collectives(g)
            fastcoll.finalize()
            say("OK")
            return
        time.sleep(0.5)  # rank 0 has written its counter by now
        start = time.monotonic()
        # A broken head is read by the receiver of rank 0's data, a broken tail by the sender
        # to rank 0: a broadcast from rank 0, or to it.
        fastcoll.broadcast(np.ones(4, np.float32), root=1 if SCENARIO.startswith("tail") else 0)
        say("NOERROR")
    except fastcoll.FastcollError as e:
        say("ERROR", type(e).__name__, f"{time.monotonic() - start:.3f}", str(e).replace("\n", " ")[:500])
    os._exit(0)  # (a finalize() would wait on a peer that does not answer)


def hostile() -> None:
    spy()
    if SCENARIO == "pause":
        testhooks.set_hook(lambda point: (say("OFFERED"), time.sleep(60)) if point == "shm-offered" else None)
    g = fastcoll.init()
    if SCENARIO == "shrink":
        shrink()
        collectives(g)
        fastcoll.finalize()
        say("OK")
        return
    corrupt()
    time.sleep(4)  # rank 1 fails meanwhile
    say("OK")
    os._exit(0)


if RANK == 0:
    hostile()
else:
    victim()
