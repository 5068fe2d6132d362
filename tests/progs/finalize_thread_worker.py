"""One rank of tests/test_finalize_thread.py: finalize() on the main thread while another thread
of this rank is inside a collective, repeated over fresh jobs (init() again after finalize()).

    finalize_thread_worker.py SCENARIO REPEATS

    blocked   rank 0's thread waits in an all_reduce that rank 1 joins only after rank 0 has
              finalized: the window (a thread in a wait, finalize() on another) is open every time
    busy      both ranks run a 64 MiB all_reduce, rank 1 from a moment that varies per
              repetition; rank 0 finalizes 20-100 ms into its call, its thread mid-frame as
              often as not

Lines the test reads:

    CALLER <class> <message>   rank 0: what its thread's collective raised (or CALLER ok)
    PEER <class> <message>     rank 1: what its collective raised (or PEER ok)
    OK <repeats>               every repetition ended as expected
"""

from __future__ import annotations

import faulthandler
import random
import sys
import threading
import time

import numpy as np

import fastcoll

SCENARIO, REPEATS = sys.argv[1], int(sys.argv[2])
faulthandler.dump_traceback_later(100, exit=True)  # a hang shows its stack (the test allows less)


def say(*parts) -> None:
    print(*parts, flush=True)


def outcome(fn) -> tuple[str, str]:
    """("ok", "") if fn() returned the sum of two ranks' ones, ("WRONG", ...) if it returned
    anything else, or the class and message of what it raised."""
    try:
        y = fn()
    except Exception as e:  # every kind is reported: a bare RuntimeError is a failure the test reads
        return type(e).__name__, str(e).replace("\n", " ")[:400]
    return ("ok", "") if y[0] == 2 and y[-1] == 2 else ("WRONG", f"{y[0]} .. {y[-1]}")


def rank0(rng: random.Random) -> None:
    x = np.ones(4 if SCENARIO == "blocked" else 16 << 20, np.float32)
    box: list = []
    inside = threading.Event()

    def call() -> None:
        inside.set()  # (the call begins microseconds later; the wait below is far longer)
        box.append(outcome(lambda: fastcoll.all_reduce(x)))

    t = threading.Thread(target=call, name="caller")
    t.start()
    inside.wait()
    time.sleep(0.3 if SCENARIO == "blocked" else rng.uniform(0.02, 0.1))
    fastcoll.finalize()
    t.join(30)
    say("CALLER", *(box[0] if box else ("hung", "the thread did not return within 30 s")))


def rank1(rng: random.Random) -> None:
    x = np.ones(4 if SCENARIO == "blocked" else 16 << 20, np.float32)
    # blocked: rank 0 has finalized by the time this rank calls. busy: this rank's call begins
    # before or after rank 0's finalize(), which then finds rank 0's thread mid-message as often
    # as not (its socket or ring full while this rank does not read yet, or bytes flowing).
    time.sleep(0.6 if SCENARIO == "blocked" else rng.uniform(0.0, 0.15))
    box: list = []
    # A thread of the name rank 0's caller has: the two calls are one collective.
    t = threading.Thread(target=lambda: box.append(outcome(lambda: fastcoll.all_reduce(x))), name="caller")
    t.start()
    t.join(30)
    say("PEER", *(box[0] if box else ("hung", "the thread did not return within 30 s")))
    fastcoll.finalize()


def main() -> None:
    rng = random.Random(45)
    for _ in range(REPEATS):
        g = fastcoll.init()
        if g.rank() == 0:
            rank0(rng)
        else:
            rank1(rng)
    say("OK", REPEATS)


main()
