"""One rank of a job for tests/test_hardening.py: the cases the fault tests did not reach.

    hardening_worker.py SCENARIO [ARG]

Lines the test reads (times in seconds):

    READY <rank> <pid>                      init() returned
    ERROR <class> <elapsed> <message>       a fastcoll error, seconds since the call began
    RESULT <values...>                      what a collective returned
    OK                                      the rank finished as the scenario expects

Timing windows are reached through fastcoll.testhooks (a delay or a death at a named point of
the set-up, a Ctrl-C inside a deallocator), never left to luck.
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
from fastcoll import testhooks

SCENARIO = sys.argv[1]
if not SCENARIO.startswith("fork-"):  # its watchdog thread is not in a forked child, whose exit then hangs
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows its stack (the tests allow far less)
# What Ctrl-C does is under test: a shell that starts the suite in the background leaves SIGINT
# ignored for its children, and Python then installs no handler of its own (every Ctrl-C test
# failed so). Install it whatever was inherited.
signal.signal(signal.SIGINT, signal.default_int_handler)

ARG = sys.argv[2] if len(sys.argv) > 2 else ""
RANK = int(os.environ.get("FASTCOLL_RANK", os.environ.get("SLURM_PROCID", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))))
TIMEOUT = float(os.environ.get("FASTCOLL_TIMEOUT", "60"))
VICTIM = int(os.environ.get("HARDENING_VICTIM", "1"))  # read by this program only


def say(*parts) -> None:
    print(*parts, flush=True)


def error(e: BaseException, start: float) -> None:
    say("ERROR", type(e).__name__, f"{time.monotonic() - start:.4f}", str(e).replace("\n", " ")[:600])


def init_expecting_error() -> int:
    """init(), then a barrier: one of them must raise (a set-up that fails late may still let
    this rank's init() return; its first call then finds the loss)."""
    start = time.monotonic()
    try:
        fastcoll.init()
        say("INIT", f"{time.monotonic() - start:.4f}")
        fastcoll.barrier()
    except fastcoll.FastcollError as e:
        error(e, start)
        fastcoll.finalize()
        return 3
    say("NOERROR")
    return 4


def fork_call() -> int:
    """fork-call: rank 0 forks a child after init() and two planned all_reduces; the child's
    all_reduce (the planned kind, then a broadcast) must raise FastcollError at once and touch no
    link, and its finalize() and exit (atexit) must leave the parent's job alone: the parent's
    next all_reduce is exact on every rank. Lines: CHILD-ERROR <class> <seconds> <message> (from
    the child), CHILD-EXIT <code>, RESULT <value>, OK."""
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    for _ in range(2):  # planned from the second call on (the native engine)
        fastcoll.all_reduce(np.full(4, r + 1.0, np.float32))
    fastcoll.barrier()
    if r == 0:
        pid = os.fork()
        if pid == 0:
            code = 0
            for call in (lambda: fastcoll.all_reduce(np.full(4, 100.0, np.float32)),
                         lambda: fastcoll.broadcast(np.full(4, 100.0, np.float32), root=0)):
                start = time.monotonic()
                try:
                    call()
                    code = 5
                except fastcoll.FastcollError as e:
                    say("CHILD-ERROR", type(e).__name__, f"{time.monotonic() - start:.4f}", str(e))
            fastcoll.finalize()
            return code  # sys.exit: the child's atexit hooks run
        _, status = os.waitpid(pid, 0)
        say("CHILD-EXIT", os.waitstatus_to_exitcode(status))
    else:
        time.sleep(0.5)  # the child's calls, had they gone out, would be what this rank reads next
    y = fastcoll.all_reduce(np.full(4, r + 1.0, np.float32))
    say("RESULT", float(y[0]))
    assert np.all(y == n * (n + 1) / 2), y
    fastcoll.barrier()
    fastcoll.finalize()
    say("OK")
    return 0


def short_limit() -> int:
    """short-limit: a 1 GiB all_reduce with timeout=0.05 on every rank, nobody stopped: each
    rank's error must say that the limit ran out while the data still moved. (256 MiB finished
    within 0.05 s over loopback TCP on a quiet machine: 1 GiB would need 20 GB/s.)"""
    g = fastcoll.init()
    x = np.ones((1 << 30) // 4, np.float32)
    fastcoll.barrier()
    start = time.monotonic()
    try:
        fastcoll.all_reduce(x, timeout=0.05)
    except fastcoll.FastcollError as e:
        error(e, start)
        fastcoll.finalize()  # its notice delivered (an exit without it may cut a message short)
        return 3
    say("NOERROR", g.rank())
    return 4


def main() -> int:
    if SCENARIO == "short-limit":
        return short_limit()
    if SCENARIO == "fork-call":
        return fork_call()
    if SCENARIO == "init":  # (tests/test_rendezvous.py plays another rank)
        return init_expecting_error()
    if SCENARIO == "setup-sleep":
        # Rank 0 stalls at a point of the set-up until its deadline has passed: the rank that
        # arrives just before rank 0's FASTCOLL_TIMEOUT runs out, as a deterministic case.
        if RANK == 0:
            testhooks.set_hook(lambda p: time.sleep(TIMEOUT + 0.3) if p == ARG else None)
        return init_expecting_error()

    if SCENARIO == "setup-die":
        # The victim dies at a point of the set-up: the others' init() must raise in time. With
        # "late", the others stay 0.5 s at that point, so that the victim is dead before they
        # go on.
        if RANK == VICTIM:
            testhooks.set_hook(lambda p: os.kill(os.getpid(), signal.SIGKILL) if p == ARG else None)
        elif sys.argv[3:] == ["late"]:
            testhooks.set_hook(lambda p: time.sleep(0.5) if p == ARG else None)
        return init_expecting_error()

    if SCENARIO == "job":
        # The ranks of one job: each adds its value (ARG + rank); nobody else may join, and a
        # rank of another job must fail in init(), naming both jobs.
        start = time.monotonic()
        try:
            g = fastcoll.init()
        except fastcoll.FastcollError as e:
            error(e, start)
            return 3
        say("READY", g.rank(), os.getpid())
        x = np.full(4, float(ARG) + g.rank(), np.float32)
        say("RESULT", *fastcoll.all_reduce(x).tolist())
        fastcoll.finalize()
        say("OK")
        return 0

    g = fastcoll.init()
    r, n = g.rank(), g.size()
    say("READY", r, os.getpid())

    if SCENARIO == "timeouts":
        # Bad per-call timeouts raise ValueError naming the value (TypeError for a value that is
        # no number), before anything is sent.
        x = np.ones(4, np.float32)
        for bad in (float("nan"), float("inf"), 0, -1, "abc", "5", 1e300, True):
            for name, call in (("all_reduce", lambda: fastcoll.all_reduce(x, timeout=bad)),
                               ("barrier", lambda: fastcoll.barrier(timeout=bad)),
                               ("broadcast", lambda: fastcoll.broadcast(x, timeout=bad))):
                try:
                    call()
                except (TypeError, ValueError) as e:
                    assert "timeout" in str(e) and repr(bad) in str(e), (name, bad, str(e))
                    assert isinstance(e, TypeError) == isinstance(bad, (str, bool)), (name, bad, e)
                else:
                    raise AssertionError(f"{name}(timeout={bad!r}) was accepted")
        # The group is untouched, and a huge valid timeout works.
        got = fastcoll.all_reduce(x, timeout=3e6)
        assert np.array_equal(got, np.full(4, n, np.float32)), got
        fastcoll.barrier(timeout=3e6)
        fastcoll.finalize()
        say("OK")
        return 0

    if SCENARIO == "huge-timeout":  # FASTCOLL_TIMEOUT=3e6 (above ZeroMQ's int32 heartbeat)
        x = np.full(1 << 18, r + 1, np.float32)
        got = fastcoll.all_reduce(x)
        assert np.array_equal(got, np.full(1 << 18, n * (n + 1) / 2, np.float32))
        fastcoll.barrier()
        fastcoll.finalize()
        say("OK")
        return 0

    if SCENARIO == "after-finalize":
        # After fastcoll.finalize(), every call raises at once, naming finalize(); nothing
        # starts a new rendezvous (which would wait out the timeout, or form a new job).
        sub = g.split(0)
        fastcoll.barrier()
        fastcoll.finalize()
        x = np.ones(4, np.float32)
        calls = {
            "default all_reduce": lambda: fastcoll.all_reduce(x),
            "default barrier": lambda: fastcoll.barrier(),
            "group all_reduce": lambda: fastcoll.all_reduce(x, group=g),
            "group broadcast": lambda: fastcoll.broadcast(x, group=g),
            "group barrier": lambda: fastcoll.barrier(group=g),
            "subgroup all_gather": lambda: fastcoll.all_gather(x, group=sub),
            "split": lambda: g.split(1),
            "average_gradients": lambda: fastcoll.average_gradients({"w": x}),
        }
        for name, call in calls.items():
            start = time.monotonic()
            try:
                call()
            except fastcoll.FastcollError as e:
                took = time.monotonic() - start
                assert "finalize()" in str(e), (name, str(e))
                assert took < 0.5, (name, took)
            else:
                raise AssertionError(f"{name} after finalize() did not raise")
        assert not fastcoll.is_initialized()
        say("OK")
        return 0

    if SCENARIO == "stall-broadcast":
        # The victim stops 30 ms into a 256 MiB broadcast; the call's timeout (0.5 s, or this
        # rank's HARDENING_CALL_TIMEOUT) must bound every other rank's call, the rest of a
        # payload included.
        x = np.full((256 << 20) // 4, 1.0 if r == 0 else 0.0, np.float32)
        fastcoll.barrier()
        if r == VICTIM:
            threading.Timer(0.03, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        start = time.monotonic()
        try:
            fastcoll.broadcast(x, root=0, timeout=float(os.environ.get("HARDENING_CALL_TIMEOUT", "0.5")))
        except fastcoll.FastcollError as e:
            error(e, start)
            return 3
        say("NOERROR")
        return 4

    if SCENARIO == "exit-mid-call":
        # Rank 0 queues a 64 MiB all_reduce that rank 1 never joins, then returns from main()
        # without wait() or finalize(); rank 1 waits for rank 0's process to end, then returns.
        fastcoll.barrier()
        if r == 0:
            fastcoll.all_reduce(np.ones(16 << 20, np.float32), async_op=True)
            say("QUEUED")
            return 0
        time.sleep(float(ARG or "3"))
        return 0

    if SCENARIO == "fork-exit":
        # A child forked after init() that exits the normal way (its atexit hooks run) must
        # leave the parent's job alone, and must itself end.
        fastcoll.barrier()
        if r == 0:
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
                time.sleep(0.01)
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                say("CHILD-HUNG")
        y = fastcoll.all_reduce(np.full(1 << 20, r + 1.0, np.float32))  # large: zero-copy on zmq
        assert float(y[0]) == n * (n + 1) / 2, y[:4]
        fastcoll.finalize()
        say("OK")
        return 0

    if SCENARIO == "late-large":
        # 16 MiB all-reduces: the others give up after timeout=1; the victim arrives 0.4 s
        # after that, while their finalize() still delivers the rest of their message and the
        # ABORT behind it. Every rank must raise CollectiveTimeoutError.
        x = np.ones(4 << 20, np.float32)
        fastcoll.barrier()
        start = time.monotonic()
        try:
            if r == VICTIM:
                time.sleep(1.4)
                start = time.monotonic()
                for _ in range(2):
                    fastcoll.all_reduce(x, timeout=1.0)
            else:
                fastcoll.all_reduce(x, timeout=1.0)
        except fastcoll.FastcollError as e:
            error(e, start)
            start = time.monotonic()
            fastcoll.finalize()
            say("FINALIZE", f"{time.monotonic() - start:.4f}")
            return 3
        say("NOERROR")
        return 4

    if SCENARIO in ("sigint", "sigint-queued", "swallowed-interrupt"):
        # Collectives in a loop until the victim is interrupted: the victim must stop with
        # KeyboardInterrupt, every other rank raise a FastcollError at once.
        x = np.full(int(ARG or 1024), 1.0, np.float32)
        if SCENARIO == "swallowed-interrupt" and r == VICTIM:
            # A Ctrl-C that arrives while a received frame is released: the KeyboardInterrupt
            # is raised inside a deallocator, where Python can only report it as unraisable,
            # as pyzmq's Frame.__dealloc__ does (its _check_rc handles signals).
            count = [0]

            class Frameish:
                def __del__(self):
                    signal.raise_signal(signal.SIGINT)
                    time.monotonic()  # the handler runs here, inside the deallocator

            def hook(point: str) -> None:
                if point == "zmq-frame":
                    count[0] += 1
                    if count[0] == 200:
                        say("INTERRUPT", f"{time.time():.6f}")
                        Frameish()

            testhooks.set_hook(hook)
        start = time.monotonic()
        calls = 0
        try:
            while time.monotonic() - start < 20:
                if SCENARIO == "sigint-queued":
                    # A synchronous call queued behind async work runs on the service thread
                    # while this one waits for it: the interrupt lands in that wait.
                    fastcoll.all_reduce(x, async_op=True)
                fastcoll.all_reduce(x)
                calls += 1
                if calls == 50:
                    say("LOOPING", f"{time.time():.6f}")
        except fastcoll.FastcollError as e:
            say("ERROR", type(e).__name__, f"{time.time():.6f}", str(e)[:300])
            fastcoll.finalize()
            return 3
        except KeyboardInterrupt:
            say("INTERRUPTED", calls, f"{time.time():.6f}")
            fastcoll.finalize()
            raise
        say("NOERROR", calls)
        return 4

    if SCENARIO == "threads":
        # Two threads, A and B, each with its own values, call all_reduce on the one default
        # group. Rank 0 lets A go first, the others B: the calls cross over between ranks.
        # Each result must be right, or the call must raise at once; never a mixed sum.
        k = 10
        values = {"A": 1.0, "B": 100.0}
        first = "A" if r == 0 else "B"
        turn = {"A": threading.Event(), "B": threading.Event()}
        turn[first].set()
        outcomes: dict[str, list] = {"A": [], "B": []}

        def work(name: str) -> None:
            turn[name].wait(10)
            x = np.full(4, values[name], np.float32)
            for i in range(k):
                try:
                    got = fastcoll.all_reduce(x, timeout=5)
                    outcomes[name].append(("ok", float(got[0])))
                except fastcoll.FastcollError as e:
                    outcomes[name].append(("error", type(e).__name__, str(e)))
                    break
                finally:
                    if i == 0:
                        turn["B" if name == "A" else "A"].set()

        threads = [threading.Thread(target=work, args=(name,), name=f"worker-{name}") for name in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for name, got in outcomes.items():
            for item in got:
                if item[0] == "ok":
                    say("RESULT", name, item[1])
                else:
                    say("ERROR", item[1], name, item[2][:400])
        say("OK")
        return 0

    if SCENARIO == "handoff":
        # The main thread calls, then hands the group to a worker thread (named alike on every
        # rank, and started after a different number of unnamed threads on each): correct.
        x = np.full(4, r + 1.0, np.float32)
        want = n * (n + 1) / 2
        assert fastcoll.all_reduce(x)[0] == want
        for _ in range(r):  # rank-dependent thread counts shift the default names
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()
        box = []

        def work() -> None:
            for _ in range(20):
                box.append(float(fastcoll.all_reduce(x)[0]))
            box.append(float(fastcoll.all_gather(x)[0]))

        t = threading.Thread(target=work, name="generate")
        t.start()
        t.join(30)
        assert box == [want] * 20 + [1.0], box
        assert fastcoll.all_reduce(x)[0] == want  # and back on the main thread
        fastcoll.finalize()
        say("OK")
        return 0

    raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    sys.exit(main())
