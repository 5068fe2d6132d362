"""One rank of a job in which something goes wrong on purpose (tests/test_faults.py).

    fault_worker.py SCENARIO VICTIM [SIZE]

VICTIM is the rank that misbehaves (dies, stops, calls something else, finalizes early, is
slow); SIZE the number of float32 elements per collective. Every rank prints lines the test
parses (times from time.time(), durations in seconds):

    READY <rank> <pid>
    FAULT <what> <wall time>                   the victim, just before it misbehaves
    ERROR <class> <elapsed> <wall time>        a fastcoll error: class, seconds since the call began
    AGAIN <class> <elapsed>                    the next call on the broken group
    FINALIZE <elapsed>                         finalize() after the error
    OK <n>                                     the rank finished without an error

Exit status: 0 after OK, 3 after a fastcoll error, 4 when a call that should fail succeeded.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

import numpy as np

import fastcoll

faulthandler.dump_traceback_later(40, exit=True)  # a hang shows its stack (the tests allow far less)

SCENARIO, VICTIM = sys.argv[1], int(sys.argv[2])
SIZE = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
TIMEOUT = float(os.environ["FASTCOLL_TIMEOUT"])


def say(*parts) -> None:
    print(*parts, flush=True)


def settle() -> None:
    """Let the victim's last collective reach the others before the fault.

    ZeroMQ sends are asynchronous: a rank killed or stopped the instant its collective returns
    can take its last message to the others with it (libzmq's I/O thread stops too), and then
    they rightly fail in that collective, not in the next one the scenario is about."""
    time.sleep(0.2)


def fault(what: str, sig: int | None = None) -> None:
    say("FAULT", what, f"{time.time():.6f}")
    if sig is not None:
        os.kill(os.getpid(), sig)


def expect_error(fn, *args, **kwargs) -> int:
    """Run fn; report the fastcoll error it raises (and how the broken group behaves after)."""
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
    except fastcoll.FastcollError as e:
        elapsed = time.monotonic() - start
        say("ERROR", type(e).__name__, f"{elapsed:.4f}", f"{time.time():.6f}")
        say("MESSAGE", str(e).replace("\n", " ")[:300])
        start = time.monotonic()
        try:
            fastcoll.all_reduce(np.ones(4, np.float32))
        except fastcoll.FastcollError as again:
            say("AGAIN", type(again).__name__, f"{time.monotonic() - start:.4f}")
        else:
            say("AGAIN none")
        start = time.monotonic()
        fastcoll.finalize()
        say("FINALIZE", f"{time.monotonic() - start:.4f}")
        return 3
    say("NOERROR", f"{time.monotonic() - start:.4f}")
    return 4


def loop(n: int, x) -> None:
    for _ in range(n):
        fastcoll.all_reduce(x)


def init_error() -> int:
    """init() itself is expected to fail (a rank missing, a wrong token): report how."""
    start = time.monotonic()
    try:
        fastcoll.init()
    except fastcoll.FastcollError as e:
        say("ERROR", type(e).__name__, f"{time.monotonic() - start:.4f}", f"{time.time():.6f}")
        say("MESSAGE", str(e).replace("\n", " ")[:300])
        return 3
    say("NOERROR", f"{time.monotonic() - start:.4f}")
    return 4


def main() -> int:
    if SCENARIO == "kill-before-init":
        # The victim dies before it joins; the others' init() must not wait for ever.
        if int(os.environ["FASTCOLL_RANK"]) == VICTIM:
            fault("sigkill", signal.SIGKILL)
        return init_error()
    if SCENARIO == "wrong-token":  # the victim was started with another FASTCOLL_TOKEN
        return init_error()
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    say("READY", r, os.getpid())
    x = np.full(SIZE, r + 1, np.float32)
    want = np.full(SIZE, n * (n + 1) / 2, np.float32)
    assert np.array_equal(fastcoll.all_reduce(x), want)
    fastcoll.barrier()
    victim = r == VICTIM

    if SCENARIO == "kill-before":
        # The others already wait inside the collective when the victim dies without entering it.
        if victim:
            time.sleep(0.5)
            fault("sigkill", signal.SIGKILL)
        return expect_error(fastcoll.all_reduce, x)

    if SCENARIO == "kill-during":
        if victim:
            threading.Timer(0.4, fault, ("sigkill", signal.SIGKILL)).start()
        return expect_error(loop, 1_000_000, x)

    if SCENARIO == "kill-while-sending":
        # The window on purpose: every other rank sends the victim more than its connection holds
        # (a shared-memory ring or a socket's buffers), which the victim never takes, and waits
        # for room when the victim dies. The send must fail at once, not wait out the timeout.
        if victim:
            time.sleep(0.5)
            fault("sigkill", signal.SIGKILL)
        return expect_error(fastcoll.send, np.ones(SIZE, np.float32), VICTIM)

    if SCENARIO == "kill-after":
        fastcoll.all_reduce(x)
        if victim:
            settle()
            fault("sigkill", signal.SIGKILL)
        time.sleep(0.5)  # the victim is long dead when the others call again
        return expect_error(fastcoll.all_reduce, x)

    if SCENARIO == "kill-async":
        if victim:
            time.sleep(0.5)
            fault("sigkill", signal.SIGKILL)
        works = [fastcoll.all_reduce(x, async_op=True) for _ in range(4)]
        return expect_error(lambda: [w.wait() for w in works])

    if SCENARIO == "stop":
        # The victim stops answering without closing anything.
        if victim:
            settle()
            fault("sigstop", signal.SIGSTOP)
        return expect_error(fastcoll.all_reduce, x)

    if SCENARIO == "stop-call-timeout":
        # A per-call timeout shorter than FASTCOLL_TIMEOUT wins (argv SIZE may be large: the
        # sender thread is then stuck in a full socket buffer).
        if victim:
            settle()
            fault("sigstop", signal.SIGSTOP)
        return expect_error(fastcoll.all_reduce, x, timeout=1.0)

    if SCENARIO.startswith("mismatch-"):
        what = SCENARIO.split("-", 1)[1]
        if not victim:
            return expect_error(fastcoll.all_reduce, x)
        fault(what)
        if what == "kind":
            return expect_error(fastcoll.all_gather, x)
        if what == "shape":
            return expect_error(fastcoll.all_reduce, np.ones(SIZE + 1, np.float32))
        if what == "dtype":
            return expect_error(fastcoll.all_reduce, x.astype(np.int32))
        if what == "op":
            return expect_error(fastcoll.all_reduce, x, op="max")
        if what == "root":
            return expect_error(fastcoll.broadcast, x, root=(r + 1) % n)
        raise SystemExit(f"unknown mismatch {what}")

    if SCENARIO == "extra-then-barrier":
        # The victim calls all_reduce once more than the others; then everyone calls barrier().
        loop(3, x)
        if victim:
            fault("extra call")
            return expect_error(lambda: (fastcoll.all_reduce(x), fastcoll.barrier()))
        return expect_error(fastcoll.barrier)

    if SCENARIO == "extra-then-idle":
        # The others stay alive but call nothing: the victim times out; the others learn of it
        # from the victim's abort notice at their next call.
        loop(3, x)
        if victim:
            fault("extra call")
            return expect_error(fastcoll.all_reduce, x)
        time.sleep(TIMEOUT + 1.5)
        return expect_error(fastcoll.barrier)

    if SCENARIO == "extra-then-finalize":
        # The victim calls all_reduce once more; the others finalize cleanly and exit.
        loop(3, x)
        if victim:
            fault("extra call")
            return expect_error(fastcoll.all_reduce, x)
        fastcoll.finalize()
        say("OK 3")
        return 0

    if SCENARIO == "finalize":
        # The victim finalizes and stays alive; the others still work among themselves, then
        # need it.
        if victim:
            fault("finalize")
            fastcoll.finalize()
            say("FINALIZED")
            time.sleep(TIMEOUT + 2)
            say("OK 0")
            return 0
        others = [k for k in range(n) if k != VICTIM]
        if len(others) >= 2:
            i = others.index(r)
            right, left = others[(i + 1) % len(others)], others[(i - 1) % len(others)]
            if i % 2 == 0:
                fastcoll.send(x, right)
                got = fastcoll.recv(x.shape, np.float32, left)
            else:
                got = fastcoll.recv(x.shape, np.float32, left)
                fastcoll.send(x, right)
            assert np.array_equal(got, np.full(SIZE, left + 1, np.float32)), got[:4]
            say("P2P ok")
        time.sleep(0.3)
        return expect_error(fastcoll.all_reduce, x)

    if SCENARIO == "slow":
        # The victim is slow (60% of the timeout) but alive: not an error.
        for _ in range(2):
            if victim:
                time.sleep(0.6 * TIMEOUT)
            start = time.monotonic()
            assert np.array_equal(fastcoll.all_reduce(x), want)
            say("WAITED", f"{time.monotonic() - start:.4f}")
        fastcoll.barrier()
        fastcoll.finalize()
        say("OK 2")
        return 0

    if SCENARIO == "slow-call-timeout":
        # FASTCOLL_TIMEOUT is short; a per-call timeout longer than the delay is not an error.
        if victim:
            time.sleep(TIMEOUT + 1)
        start = time.monotonic()
        assert np.array_equal(fastcoll.all_reduce(x, timeout=TIMEOUT + 4), want)
        say("WAITED", f"{time.monotonic() - start:.4f}")
        fastcoll.barrier(timeout=TIMEOUT + 4)
        fastcoll.finalize()
        say("OK 1")
        return 0

    if SCENARIO == "late-call-timeout":
        # FASTCOLL_TIMEOUT is long; the victim is late by more than the per-call timeout.
        if victim:
            # The others sent their contributions before they gave up, so the late rank's first
            # call may still complete with the right result; it learns of their notice (a
            # CollectiveTimeoutError) no later than its next call.
            time.sleep(3.0)
            return expect_error(lambda: [fastcoll.all_reduce(x, timeout=1.0) for _ in range(2)])
        return expect_error(fastcoll.all_reduce, x, timeout=1.0)

    raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    sys.exit(main())
