"""Fault injection: a rank dies, stops, calls the wrong thing, calls once too often, or leaves
early. Every surviving rank must raise the documented error (PeerLostError,
CollectiveTimeoutError, MismatchError: each a FastcollError) within FASTCOLL_TIMEOUT + 1 s, or at
once where a socket closes; the broken group re-raises it; finalize() returns promptly; and no
process is left behind. Real processes on localhost, both transports.

The rank program (progs/fault_worker.py) prints the class of the error and how long the call
took; where the victim dies, it prints the wall time just before, so detection latency is
measured from the fault itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from conftest import PROGS, ROOT

TIMEOUT = 3.0  # FASTCOLL_TIMEOUT of these jobs
AT_ONCE = 1.0  # "at once" (a socket closed, a notice arrived): far below TIMEOUT
TRANSPORTS = ["shm", "tcp", "zmq"]  # conftest.rank_env says what each means

# Measured detection times, printed at the end of the session (-s) for the report.
MEASURED: list[str] = []


@dataclass
class Rank:
    """What one rank of a fault job printed, and how it ended."""

    rank: int
    code: int | None
    out: str
    err: str
    error: str | None = None  # class of the fastcoll error it raised
    message: str = ""  # its message
    elapsed: float | None = None  # seconds from the failing call to the error
    wall: float | None = None  # time.time() when it raised
    again: str | None = None
    again_elapsed: float | None = None
    finalize: float | None = None
    fault_wall: float | None = None
    ok: bool = False
    lines: list[str] = field(default_factory=list)

    def show(self) -> str:
        return f"--- rank {self.rank} exit {self.code}\n{self.out}\n{self.err[-3000:]}"


def parse(rank: int, code: int | None, out: str, err: str) -> Rank:
    r = Rank(rank, code, out, err)
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        r.lines.append(line)
        if parts[0] == "ERROR":
            r.error, r.elapsed, r.wall = parts[1], float(parts[2]), float(parts[3])
        elif parts[0] == "MESSAGE":
            r.message = line.split(" ", 1)[1] if " " in line else ""
        elif parts[0] == "AGAIN" and len(parts) == 3:
            r.again, r.again_elapsed = parts[1], float(parts[2])
        elif parts[0] == "FINALIZE":
            r.finalize = float(parts[1])
        elif parts[0] == "FAULT":
            r.fault_wall = float(parts[-1])
        elif parts[0] == "OK":
            r.ok = True
    return r


def run_fault(launch, world, transport, scenario, victim, size=1024, within=None, timeout=TIMEOUT,
              wait_victim=False, per_rank_env=None):
    """Start the job; wait until every rank (but the victim, unless `wait_victim`) has exited on
    its own (at most `within` seconds), then end the victim. Returns {rank: Rank} and a printable
    detail; asserts that no process remains."""
    job = launch(
        world, "fault_worker.py", scenario, str(victim), str(size),
        transport=transport, timeout=str(timeout), per_rank_env=per_rank_env,
    )
    survivors = [p for r, p in enumerate(job.procs) if r != victim or wait_victim]
    limit = within if within is not None else timeout + 12  # process start-up included
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p in survivors):
        time.sleep(0.05)
    hung = [r for r, p in enumerate(job.procs) if (r != victim or wait_victim) and p.poll() is None]
    job.kill()  # the victim (stopped, or still sleeping) and anything hung
    ranks = {}
    for r, p in enumerate(job.procs):
        out, err = p.communicate()
        ranks[r] = parse(r, p.returncode, out, err)
    detail = "\n".join(x.show() for x in ranks.values())
    assert not hung, f"ranks {hung} did not exit within {limit}s of the start:\n{detail}"
    for p in job.procs:  # every rank ran in its own session: nothing of it may remain
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)
    return ranks, detail


def check_survivors(ranks, detail, victim, error, *, at_once_after_fault=False, max_elapsed=None,
                    min_elapsed=0.0, what=""):
    """Every rank but the victim raised `error` in time, re-raises it, and finalizes promptly."""
    for r, x in ranks.items():
        if r == victim:
            continue
        assert x.code == 3 and x.error == error, f"rank {r}: wanted {error}, exit 3\n{detail}"
        if max_elapsed is not None:
            assert min_elapsed <= x.elapsed <= max_elapsed, (
                f"rank {r} raised after {x.elapsed:.3f}s, outside [{min_elapsed}, {max_elapsed}]\n{detail}"
            )
        if at_once_after_fault:
            latency = x.wall - ranks[victim].fault_wall
            assert latency < AT_ONCE, f"rank {r} noticed the fault after {latency:.3f}s\n{detail}"
            MEASURED.append(f"{what} rank {r}: {error} {latency * 1000:.1f} ms after the fault")
        else:
            MEASURED.append(f"{what} rank {r}: {error} after {x.elapsed * 1000:.1f} ms in the call")
        assert x.again == error and x.again_elapsed < 0.1, f"rank {r}: the broken group re-raised {x.again}\n{detail}"
        assert x.finalize is not None and x.finalize < 2.0, f"rank {r}: finalize took {x.finalize}s\n{detail}"


# --- SIGKILL before, during and after a collective, at 2, 3 and 4 ranks ----------------------

# before: the others already wait in the collective when the victim dies without entering it;
# during: the victim dies in the middle of a stream of ring all-reduces (4 MiB each);
# after: the victim dies between collectives; the others call the next one 0.5 s later.
KILL_CASES = {
    "kill-before": (lambda world: world - 1, 1024),
    "kill-during": (lambda world: 0, 1 << 20),
    "kill-after": (lambda world: 1, 1024),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("scenario", list(KILL_CASES))
def test_sigkill(launch, transport, world, scenario):
    pick, size = KILL_CASES[scenario]
    victim = pick(world)
    ranks, detail = run_fault(launch, world, transport, scenario, victim, size)
    assert ranks[victim].code == -signal.SIGKILL, detail
    what = f"{transport} {scenario} n={world}"
    for r, x in ranks.items():  # across hosts the host is what a user goes to look at
        if r != victim and x.error == "PeerLostError" and f"rank {victim} closed" in x.message:
            assert f"rank {victim} ran on host " in x.message, f"rank {r}: {x.message}\n{detail}"
    if scenario == "kill-after":
        check_survivors(ranks, detail, victim, "PeerLostError", max_elapsed=AT_ONCE, what=what)
    else:
        check_survivors(ranks, detail, victim, "PeerLostError", at_once_after_fault=True, what=what)


def more_than_a_connection_holds() -> int:
    """Bytes past what a loopback TCP connection can take in unread: twice the largest send and
    receive buffers the kernel may grow to, and at least 16 MiB (a send that fits ends before its
    victim dies, and the window is missed)."""
    most = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            with open(f"/proc/sys/net/ipv4/{name}") as f:
                most += int(f.read().split()[2])
        except (OSError, ValueError, IndexError):
            most += 8 << 20
    return max(16 << 20, 2 * most)


@pytest.mark.parametrize("transport", ["shm", "tcp"])  # (ZeroMQ queues 16 MiB at once: no wait)
def test_sigkill_while_a_send_waits_for_room(launch, transport):
    # More than the connection holds to a rank that never receives it: the sender waits for room
    # when the victim dies.
    size = (16 << 20 if transport == "shm" else more_than_a_connection_holds()) // 4
    ranks, detail = run_fault(launch, 2, transport, "kill-while-sending", 0, size=size)
    check_survivors(ranks, detail, 0, "PeerLostError", at_once_after_fault=True, what=f"{transport} send")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_fails_async_handles(launch, transport):
    ranks, detail = run_fault(launch, 3, transport, "kill-async", 1)
    check_survivors(ranks, detail, 1, "PeerLostError", at_once_after_fault=True, what=f"{transport} async")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_before_init(launch, transport):
    # The victim never joins: the others' init() raises CollectiveTimeoutError, not a hang.
    ranks, detail = run_fault(launch, 3, transport, "kill-before-init", 2)
    for r in (0, 1):
        x = ranks[r]
        assert x.code == 3 and x.error == "CollectiveTimeoutError", f"rank {r}\n{detail}"
        assert x.elapsed <= TIMEOUT + 1.0, f"rank {r}: {x.elapsed}\n{detail}"
    MEASURED.append(f"{transport} kill-before-init: init raised after {ranks[0].elapsed:.2f}s")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_with_wrong_token(launch, transport):
    # A rank with another token is refused at the rendezvous: it raises AuthenticationError at
    # once (the coordinator could not prove the token to it); the others time out waiting for it.
    ranks, detail = run_fault(
        launch, 2, transport, "wrong-token", 1, wait_victim=True,
        per_rank_env=lambda r: {"FASTCOLL_TOKEN": "another-token"} if r == 1 else {},
    )
    assert ranks[1].code == 3 and ranks[1].error == "AuthenticationError", detail
    assert ranks[1].elapsed < TIMEOUT, detail
    assert ranks[0].code == 3 and ranks[0].error == "CollectiveTimeoutError", detail
    assert ranks[0].elapsed <= TIMEOUT + 1.0, detail


# --- SIGSTOP: a rank that stops answering without closing anything ---------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigstop_times_out(launch, transport):
    ranks, detail = run_fault(launch, 3, transport, "stop", 1)
    check_survivors(
        ranks, detail, 1, "CollectiveTimeoutError",
        min_elapsed=TIMEOUT - 0.05, max_elapsed=TIMEOUT + 1.0, what=f"{transport} sigstop",
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigstop_large_message_per_call_timeout(launch, transport):
    # 16 MiB ring all-reduce: the sends to the stopped rank fill its socket buffers, and the
    # per-call timeout (1 s) is shorter than FASTCOLL_TIMEOUT (3 s): it still bounds the call.
    ranks, detail = run_fault(launch, 3, transport, "stop-call-timeout", 1, size=4 << 20)
    check_survivors(
        ranks, detail, 1, "CollectiveTimeoutError",
        min_elapsed=0.95, max_elapsed=2.0, what=f"{transport} sigstop timeout=1",
    )


# --- a rank that calls something else -----------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "what,size",
    [("kind", 1024), ("shape", 1024), ("dtype", 1024), ("op", 1024), ("root", 1024), ("dtype", 200_000)],
)
def test_mismatch(launch, transport, what, size):
    ranks, detail = run_fault(launch, 3, transport, f"mismatch-{what}", 1, size=size, wait_victim=True)
    # The victim is as wrong as the others think it is: every rank raises MismatchError.
    for r, x in ranks.items():
        assert x.code == 3 and x.error == "MismatchError", f"rank {r}\n{detail}"
        assert x.elapsed < AT_ONCE, f"rank {r} took {x.elapsed}s\n{detail}"
        assert x.again == "MismatchError", detail
    assert "called" in detail and "rank 1" in detail  # the message names both sides
    MEASURED.append(
        f"{transport} mismatch-{what} size={size}: MismatchError within "
        f"{max(x.elapsed for x in ranks.values()) * 1000:.1f} ms"
    )


# --- a rank that calls one collective more than the others ------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_extra_call_then_barrier(launch, transport):
    # The others' next call (barrier) meets the victim's extra all_reduce: MismatchError everywhere.
    ranks, detail = run_fault(launch, 3, transport, "extra-then-barrier", 1, wait_victim=True)
    for r, x in ranks.items():
        assert x.code == 3 and x.error == "MismatchError" and x.elapsed < AT_ONCE, f"rank {r}\n{detail}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_extra_call_while_others_idle(launch, transport):
    # The others stay alive and call nothing: the victim times out; the others' next call
    # reads the victim's extra message first and raises MismatchError at once.
    ranks, detail = run_fault(launch, 3, transport, "extra-then-idle", 1, wait_victim=True)
    v = ranks[1]
    assert v.code == 3 and v.error == "CollectiveTimeoutError", detail
    assert TIMEOUT - 0.05 <= v.elapsed <= TIMEOUT + 1.0, detail
    for r in (0, 2):
        x = ranks[r]
        assert x.code == 3 and x.error == "MismatchError" and x.elapsed < AT_ONCE, f"rank {r}\n{detail}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_extra_call_while_others_finalize(launch, transport):
    ranks, detail = run_fault(launch, 3, transport, "extra-then-finalize", 1, wait_victim=True)
    for r in (0, 2):
        assert ranks[r].code == 0 and ranks[r].ok, f"rank {r} should end cleanly\n{detail}"
    v = ranks[1]
    # The victim hears the others' CLOSE: PeerLostError at once, not a timeout.
    assert v.code == 3 and v.error == "PeerLostError" and v.elapsed < AT_ONCE, detail
    assert "finalize" in detail


# --- finalize() on one rank while the others still work ---------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 3])
def test_finalize_while_others_work(launch, transport, world):
    ranks, detail = run_fault(launch, world, transport, "finalize", 1)
    if world == 3:
        assert all("P2P ok" in ranks[r].out for r in (0, 2)), detail  # the others still talk
    check_survivors(ranks, detail, 1, "PeerLostError", max_elapsed=AT_ONCE, what=f"{transport} finalize n={world}")
    assert "called finalize()" in detail


# --- timeouts: FASTCOLL_TIMEOUT and timeout= ----------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_slow_peer_within_timeout_is_not_an_error(launch, transport):
    ranks, detail = run_fault(launch, 3, transport, "slow", 1, wait_victim=True)
    for r, x in ranks.items():
        assert x.code == 0 and x.ok and x.error is None, f"rank {r}\n{detail}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_per_call_timeout_longer_than_env(launch, transport):
    # FASTCOLL_TIMEOUT=1, the victim is 2 s late, the call says timeout=5: no error.
    ranks, detail = run_fault(launch, 3, transport, "slow-call-timeout", 1, timeout=1.0, wait_victim=True)
    for r, x in ranks.items():
        assert x.code == 0 and x.ok and x.error is None, f"rank {r}\n{detail}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_per_call_timeout_shorter_than_env(launch, transport):
    # FASTCOLL_TIMEOUT=30, timeout=1 per call, the victim is 3 s late: the others raise
    # CollectiveTimeoutError after 1 s; the victim, when it arrives, raises it too (their notice).
    ranks, detail = run_fault(launch, 3, transport, "late-call-timeout", 1, timeout=30.0, wait_victim=True,
                              within=20)
    for r in (0, 2):
        x = ranks[r]
        assert x.code == 3 and x.error == "CollectiveTimeoutError", f"rank {r}\n{detail}"
        assert 0.95 <= x.elapsed <= 2.0, f"rank {r}: {x.elapsed}\n{detail}"
    v = ranks[1]
    assert v.code == 3 and v.error == "CollectiveTimeoutError" and v.elapsed < AT_ONCE, detail


# --- the launcher ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "scenario,victim", [("kill-during", 1), ("stop", 1)], ids=["sigkill", "sigstop"]
)
def test_launcher_exits_nonzero_and_leaves_nothing(scenario, victim):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               FASTCOLL_TIMEOUT=str(TIMEOUT), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "fastcoll.launch.cli", "-n", "3", "--grace", "1",
           sys.executable, os.path.join(PROGS, "fault_worker.py"), scenario, str(victim), "1024"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT + 20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the launcher did not end:\n{out}")
    took = time.monotonic() - start
    assert proc.returncode != 0, out
    pids = [int(line.split()[-1]) for line in out.splitlines() if "READY" in line]
    assert len(pids) == 3, out
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks left running after the launcher exited: {left}\n{out}"
    MEASURED.append(f"launcher {scenario}: exit {proc.returncode} after {took:.2f}s")


def test_zz_report_measurements():
    """Not a check: prints what the tests above measured (run with -s to see it)."""
    print("\nfault detection times:\n  " + "\n  ".join(MEASURED))
