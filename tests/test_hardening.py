"""Never a hang, never wrong data: the cases test_faults.py does not reach (issue 15).

Real rank processes on localhost (tests/progs/hardening_worker.py), on every transport it
applies to ("shm", "tcp", "zmq": conftest.rank_env). Timing windows of init() are reached
through fastcoll.testhooks (a delay or a death at a named point of the set-up), not by luck.

1. init() raises in time, never hangs: rank 0 late at its deadline, a peer that dies at any
   point of the set-up, FASTCOLL_TIMEOUT past ZeroMQ's int32 heartbeat.
2. Two jobs on one coordinator port never merge: a rank of another job is refused, by name.
3. A per-call timeout bounds a stall in the middle of a payload, and says which way it stalled;
   a program that then exits without finalize() (a send still in flight) exits cleanly.
4. Ctrl-C reaches the caller every time (a KeyboardInterrupt swallowed in a deallocator too),
   and the peers raise at once.
5. A call after finalize() raises at once, naming finalize(); nothing starts a rendezvous.
6. Timeouts are validated where they are given.
7. A late rank gets the same error class as the rank that gave up, after a large message too.
8. Calls of two threads on one group never pair up across ranks.
9. reduce_scatter allocates 1/n of its input, not a full-size scratch buffer.
10. A child forked after init() cannot use its parent's job: its calls raise at once, and its
    finalize() and exit leave the parent's links alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest

from conftest import PROGS, ROOT, Job, free_port
from engines import engines
from fastcoll import dtypes, wire
from fastcoll.algorithms import Call, blocks, reference
from fastcoll.config import MAX_TIMEOUT, Config
from fastcoll.transport.base import Transport

TRANSPORTS = ["shm", "tcp", "zmq"]
WORKER = "hardening_worker.py"


def outcome(job: Job, timeout: float) -> list:
    """Each rank's (exit code, {first word: rest of its last such line}, stdout, stderr)."""
    out = []
    for r in job.wait(timeout):
        lines = {}
        for line in r.out.splitlines():
            word, _, rest = line.partition(" ")
            lines[word] = rest
        out.append((r.code, lines, r.out, r.err))
    return out


def show(results) -> str:
    return "\n".join(f"--- rank {i} exit {c}\n{o}\n{e[-3000:]}" for i, (c, _, o, e) in enumerate(results))


def error_of(lines: dict) -> tuple[str, float, str]:
    cls, elapsed, message = (lines["ERROR"].split(" ", 2) + ["", ""])[:3]
    return cls, float(elapsed), message


# --- 1. init() never blocks past its deadline ---------------------------------------------------


@pytest.mark.parametrize("transport,world", [("shm", 2), ("tcp", 2), ("zmq", 2), ("zmq", 3)])
def test_init_raises_when_rank0_reaches_its_deadline_mid_setup(launch, transport, world):
    # Rank 0 finishes the rendezvous, then stalls until its deadline has passed (the rank that
    # arrives just before FASTCOLL_TIMEOUT runs out). ZeroMQ used to hang in its cleanup, every
    # rank with it; now every rank raises within the timeout.
    timeout = 0.8
    job = launch(world, WORKER, "setup-sleep", "rendezvous-done", transport=transport, timeout=str(timeout))
    results = outcome(job, timeout + 8)
    for r, (code, lines, _, _) in enumerate(results):
        assert code == 3, f"rank {r}\n{show(results)}"
        cls, elapsed, _ = error_of(lines)
        assert cls in ("CollectiveTimeoutError", "PeerLostError"), f"rank {r}\n{show(results)}"
        assert elapsed < timeout + 0.3 + 1.5, f"rank {r} took {elapsed}s\n{show(results)}"


SETUP_POINTS = {
    "shm": ["tcp-mesh-done"],  # its other points are TCP's code
    "tcp": ["rendezvous-done", "tcp-mesh-done", "setup-done"],
    "zmq": ["rendezvous-done", "zmq-handshake", "setup-done"],
}


@pytest.mark.parametrize("transport,point,late", [(t, p, False) for t, ps in SETUP_POINTS.items() for p in ps]
                         + [(t, p, True) for t in ("tcp", "zmq") for p in ("rendezvous-done", t + "-handshake")
                            if p in SETUP_POINTS[t]])
def test_init_raises_when_a_peer_dies_during_setup(launch, transport, point, late):
    # Rank 1 of 3 is killed at a point of its set-up: the others raise (from init(), or from
    # their first call where their own set-up was already done), within the timeout. Late: the
    # others go on from that point only once rank 1 is dead (a ZeroMQ DEALER whose connection
    # ended before the handshake blocked its first send for ever, and init() with it).
    timeout = 1.0
    job = launch(3, WORKER, "setup-die", point, *(["late"] if late else []), transport=transport, timeout=str(timeout))
    results = outcome(job, timeout + 8)
    assert results[1][0] == -signal.SIGKILL, show(results)
    for r in (0, 2):
        code, lines, _, _ = results[r]
        assert code == 3, f"rank {r}\n{show(results)}"
        cls, elapsed, _ = error_of(lines)
        assert cls in ("CollectiveTimeoutError", "PeerLostError"), f"rank {r}\n{show(results)}"
        assert elapsed < timeout + 1.0, f"rank {r} took {elapsed}s\n{show(results)}"


# --- 6 (and 1). Timeouts validated; huge ones work --------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "0", "-1", "abc", "1e300", "", " "])
def test_bad_fastcoll_timeout_is_a_value_error_naming_it(value):
    env = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "2", "FASTCOLL_COORDINATOR": "127.0.0.1:1",
           "FASTCOLL_TIMEOUT": value}
    if not value.strip():
        assert Config.from_env(env).timeout == 60.0  # unset means the default
        return
    with pytest.raises(ValueError, match="FASTCOLL_TIMEOUT") as e:
        Config.from_env(env)
    assert repr(value) in str(e.value)


def test_large_fastcoll_timeouts_are_accepted_up_to_the_bound():
    env = {"FASTCOLL_TIMEOUT": "3e6"}
    assert Config.from_env(env).timeout == 3e6
    assert Config.from_env({"FASTCOLL_TIMEOUT": str(MAX_TIMEOUT)}).timeout == MAX_TIMEOUT
    with pytest.raises(ValueError, match="at most"):
        Config.from_env({"FASTCOLL_TIMEOUT": str(MAX_TIMEOUT * 2)})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_huge_timeout_works_and_bad_per_call_timeouts_are_refused(launch, transport):
    # FASTCOLL_TIMEOUT=3e6 s is past ZeroMQ's heartbeat option (int32 milliseconds), which
    # used to fail inside init() and then hang in its cleanup. Per call: nan, inf, 0, -1 and 1e300
    # are ValueErrors naming the value, "abc", "5" and True TypeErrors, and leave the group working.
    job = launch(2, WORKER, "timeouts", transport=transport, timeout="3e6")
    results = outcome(job, 30)
    assert all(code == 0 and "OK" in lines for code, lines, _, _ in results), show(results)


def test_per_call_timeout_is_checked_in_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTCOLL_", "OMPI_", "PMI_", "SLURM_", "MLX_"))}
    # Every call that takes timeout= checks it, the exchange and object calls too.
    code = ("import math, numpy as np, fastcoll\n"
            "x = np.ones(2)\n"
            "calls = [lambda t: fastcoll.all_reduce(x, timeout=t), lambda t: fastcoll.all_gather(x, timeout=t),\n"
            "         lambda t: fastcoll.reduce_scatter(x, timeout=t), lambda t: fastcoll.broadcast(x, 0, timeout=t),\n"
            "         lambda t: fastcoll.barrier(timeout=t), lambda t: fastcoll.all_to_all(x, timeout=t),\n"
            "         lambda t: fastcoll.all_to_all_v(x, [2], timeout=t), lambda t: fastcoll.all_gather_v(x, timeout=t),\n"
            "         lambda t: fastcoll.gather(x, timeout=t), lambda t: fastcoll.scatter(x, timeout=t),\n"
            "         lambda t: fastcoll.reduce(x, timeout=t), lambda t: fastcoll.monitored_barrier(timeout=t),\n"
            "         lambda t: fastcoll.broadcast_object(1, timeout=t), lambda t: fastcoll.all_gather_object(1, timeout=t)]\n"
            "for i, call in enumerate(calls):\n"
            "    call(None)\n"
            "    for v in (math.nan, math.inf, 0, 'abc', '5', True):\n"
            "        try: call(v)\n"
            "        except (TypeError, ValueError) as e:\n"
            "            assert repr(v) in str(e) and 'timeout' in str(e), e\n"
            "            assert isinstance(e, TypeError) == isinstance(v, (str, bool)), (v, e)\n"
            "        else: raise SystemExit(f'call {i}: timeout={v!r} accepted')\n"
            "print('OK')\n")
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


# --- 2. Two jobs on one coordinator port never merge --------------------------------------------


def _start(procs: list, rank: int, size: int, port: int, transport: str, launcher_env: dict, args: list) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTCOLL_", "OMPI_", "PMI_", "SLURM_", "MLX_", "PMIX_"))}
    env.update(
        FASTCOLL_COORDINATOR=f"127.0.0.1:{port}",
        FASTCOLL_TRANSPORT="tcp" if transport == "shm" else transport,
        FASTCOLL_SHM="1" if transport == "shm" else "0",
        FASTCOLL_TIMEOUT="10",
        FASTCOLL_LOG="warning",
        PYTHONPATH=ROOT,
        PYTHONUNBUFFERED="1",
        **launcher_env,
    )
    procs.append(subprocess.Popen([sys.executable, os.path.join(PROGS, WORKER), *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True))


LAUNCHERS = {
    "slurm": lambda rank, size, job: {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size),
                                      "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0"},
    "openmpi": lambda rank, size, job: {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
                                        "PMIX_NAMESPACE": f"prterun-host-{job}@1"},
}


@pytest.mark.parametrize("transport,launcher", [("shm", "slurm"), ("tcp", "slurm"), ("zmq", "slurm"),
                                                ("tcp", "openmpi"), ("zmq", "openmpi")])
def test_two_jobs_on_one_port_never_merge(transport, launcher):
    # No FASTCOLL_TOKEN; job A's rank 0 and job B's rank 1 share the coordinator port (as jobs
    # started by srun or mpirun on one host share the default one). B's rank 1 used to join A
    # and both returned 1 + 101 with no error. Now it is refused, naming both jobs, and A forms
    # with its own rank 1.
    port = free_port()
    procs: list = []
    job = Job(procs)
    env = LAUNCHERS[launcher]
    try:
        _start(procs, 0, 2, port, transport, env(0, 2, 101), ["job", "1"])
        _start(procs, 1, 2, port, transport, env(1, 2, 202), ["job", "100"])
        stranger = procs[1]
        code = stranger.wait(15)
        s_out, s_err = stranger.communicate()
        assert code == 3 and "RESULT" not in s_out, f"B's rank 1 joined job A:\n{s_out}\n{s_err}"
        assert "MismatchError" in s_out and "101" in s_out and "202" in s_out, s_out
        _start(procs, 1, 2, port, transport, env(1, 2, 101), ["job", "1"])
        own = [procs[0], procs[2]]
        for p in own:
            out, err = p.communicate(timeout=20)
            assert p.returncode == 0, f"{out}\n{err}"
            assert "RESULT 3.0 3.0 3.0 3.0" in out, out  # 1 + 2: A's own ranks only
    finally:
        job.kill()


def test_job_identity_comes_from_the_launcher_that_numbered_the_ranks(tmp_path):
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3"}
    assert Config.from_env(slurm).job == "Slurm job 7 step 3"
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_ess_base_jobid": "123", "SLURM_JOB_ID": "9"}  # an allocation's id does not count
    assert Config.from_env(ompi).job == "Open MPI job 123"
    hydra = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}
    assert Config.from_env(hydra).job == ""  # MPICH's hydra names no job
    hosts = tmp_path / "hosts.json"
    hosts.write_text('[["10.0.0.1:5000"], ["10.0.0.2:5000"]]')
    a = Config.from_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(hosts)}).job
    hosts.write_text('[["10.0.0.1:5100"], ["10.0.0.2:5100"]]')
    b = Config.from_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(hosts)}).job
    assert a.startswith("mlx.launch job") and b.startswith("mlx.launch job") and a != b
    assert Config.from_env({"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "2",
                            "FASTCOLL_COORDINATOR": "h:1"}).job == ""  # fastcoll-launch: a token


def test_no_token_and_no_job_identity_warns():
    # MPICH's variables name no job: without a token the ranks say so, and recommend one.
    port = free_port()
    procs: list = []
    job = Job(procs)
    try:
        for r in range(2):
            _start(procs, r, 2, port, "tcp", {"PMI_RANK": str(r), "PMI_SIZE": "2"}, ["job", "1"])
        for p in procs:
            out, err = p.communicate(timeout=20)
            assert p.returncode == 0, err
            assert "no FASTCOLL_TOKEN" in err and "FASTCOLL_TOKEN" in err, err
    finally:
        job.kill()


# --- 3. A per-call timeout bounds a stall in the middle of a payload ---------------------------


def _read_until(proc: subprocess.Popen, marker: str, seconds: float = 20) -> str:
    """What `proc` printed up to and including the line with `marker` (or until it closed its
    output, or `seconds` passed), read while it runs."""
    deadline = time.monotonic() + seconds
    seen = ""
    while time.monotonic() < deadline and marker not in seen:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    return seen


def _stalled_broadcast(launch, world: int, transport: str, **kw) -> list:
    """The stall-broadcast scenario: every rank but the stopped one (rank 1) ends within 20 s,
    then rank 1 is killed; each rank's outcome."""
    job = launch(world, WORKER, "stall-broadcast", transport=transport, **kw)
    deadline = time.monotonic() + 20
    others = [p for r, p in enumerate(job.procs) if r != 1]
    while time.monotonic() < deadline and any(p.poll() is None for p in others):
        time.sleep(0.05)
    job.kill()  # the stopped rank
    return outcome(job, 10)


# Pieces of 64 KiB, which the Python engine writes on the caller's thread: what a full link
# leaves of one goes to the sender thread as a begun message, and the abort after the root's
# timeout must write no ABORT into its middle.
SMALL_PIECES_PY = {"FASTCOLL_NATIVE": "0", "FASTCOLL_TUNING": "piece_bytes=65536"}


@pytest.mark.parametrize("transport,world,env", [
    pytest.param(t, w, {}, id=f"{t}-{w}") for t, w in (("tcp", 2), ("zmq", 2), ("shm", 3), ("tcp", 3), ("zmq", 3))
] + [pytest.param(t, 3, SMALL_PIECES_PY, id=f"{t}-3-small-pieces-python") for t in ("shm", "tcp")])
def test_per_call_timeout_bounds_a_stall_mid_payload(launch, transport, world, env):
    # Rank 1 stops 30 ms into a 256 MiB broadcast (FASTCOLL_TIMEOUT=5, timeout=0.5): the
    # others' call used to last until the sockets' kernel timeout (FASTCOLL_TIMEOUT), and a
    # receiver was told "send timed out". Now it ends at 0.5 s and names the direction.
    results = _stalled_broadcast(launch, world, transport, timeout="5", **env)
    for r, (code, lines, _, _) in enumerate(results):
        if r == 1:
            continue
        assert code == 3, f"rank {r}\n{show(results)}"
        cls, elapsed, message = error_of(lines)
        assert cls == "CollectiveTimeoutError", f"rank {r}\n{show(results)}"
        assert 0.45 <= elapsed <= 1.0, f"rank {r} took {elapsed}s\n{show(results)}"
        if r == 0:  # the root only sends
            assert "sending to rank 1" in message, message
        elif message.startswith("rank 0: "):
            # rank 2 heard the root's timeout before its own ran out, and raised that
            # (docs/failures.md: a timeout's notice stops every waiting rank at once); the next
            # test opens that window on purpose
            assert "rank 0 timed out sending to rank 1" in message, message
        else:  # rank 2's own timeout: it only receives, from rank 1
            assert "timed out sending" not in message and "send timed out" not in message, message
            assert "rank 1" in message, message


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_limit_too_short_for_the_call_is_named_so_not_a_stopped_peer(launch, transport, engine):
    # A 1 GiB all_reduce with timeout=0.05, every rank running: each rank's error used to say
    # its peer "stopped sending in the middle of a message" (or "stopped taking data", "did not
    # answer"), and the comparison of waits then found a rank that was "gone" or a cycle.
    results = outcome(launch(2, WORKER, "short-limit", transport=transport, timeout="30",
                             FASTCOLL_NATIVE=engine), 60)
    assert all("ERROR" in lines for _, lines, _, _ in results), show(results)
    errors = [error_of(lines) for _, lines, _, _ in results]
    moving = ["the call's time limit ran out while" in message for _, _, message in errors]
    for r, (cls, _, message) in enumerate(errors):
        assert results[r][0] == 3 and cls == "CollectiveTimeoutError", f"rank {r}\n{show(results)}"
        for wrong in ("stopped taking data", "did not answer", "is gone", "in a cycle"):
            assert wrong not in message, message
        if moving[r]:
            assert "no rank stopped answering: data still moved" in message, message
        else:  # (a loaded host) its peer gave up first, its data still moving, and so stopped sending
            assert moving[1 - r] and "stopped sending in the middle of a message" in message, show(results)


@pytest.mark.parametrize("transport", ["tcp", "zmq", "shm"])
def test_a_receiver_told_of_the_roots_timeout_raises_it_at_once(launch, transport):
    # The window the test above can land in, held open: rank 2's own limit (5 s) is far behind
    # the root's (0.5 s), so the root's notice always reaches it first. Rank 2 must raise the
    # root's timeout then, naming who stopped, and not wait out its own limit.
    results = _stalled_broadcast(launch, 3, transport, timeout="10",
                                 per_rank_env=lambda r: {"HARDENING_CALL_TIMEOUT": "5" if r == 2 else "0.5"})
    code, lines, _, _ = results[2]
    assert code == 3, show(results)
    cls, elapsed, message = error_of(lines)
    assert cls == "CollectiveTimeoutError", show(results)
    assert elapsed <= 2.0, f"rank 2 took {elapsed}s: it waited for its own limit\n{show(results)}"
    assert message.startswith("rank 0: ") and "rank 0 timed out sending to rank 1" in message, message
    # and rank 2's notice reached the root in time for it to name the rank that stopped (before,
    # rank 2 heard nothing for 5 s, and the root blamed its own network)
    _, _, root = error_of(results[0][1])
    assert "rank 1 (host" in root and "stopped answering" in root and "no rank answered" not in root, root


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_root_stuck_sending_keeps_its_own_limit(launch, transport):
    # The other window of that test, held open: rank 2 (0.5 s) gives up long before the root
    # (2 s), whose broadcast is stuck sending to the stopped rank 1. A send's wait watches its
    # sends alone (as the Python engine's sender threads do): the root keeps its own limit and
    # names its own wait, whichever engine runs (a native flush that heard rank 2's notice
    # raised that instead, seen once in six runs of the test above).
    results = _stalled_broadcast(launch, 3, transport, timeout="10",
                                 per_rank_env=lambda r: {"HARDENING_CALL_TIMEOUT": "0.5" if r == 2 else "2"})
    code, lines, _, _ = results[0]
    assert code == 3, show(results)
    cls, elapsed, message = error_of(lines)
    assert cls == "CollectiveTimeoutError" and 1.9 <= elapsed <= 3.0, f"root: {elapsed}s\n{show(results)}"
    assert message.startswith("rank 0 timed out sending to rank 1"), message


def test_exiting_with_a_zero_copy_send_in_flight_does_not_crash(launch):
    # The window of a SIGSEGV seen once in the stalled broadcast over ZeroMQ, held open: the
    # root's send of its 256 MiB payload is cut off by its timeout, the root returns from main()
    # without finalize(), and the stopped rank resumes just then, so that libzmq's I/O thread
    # reads the payload while the interpreter exits. pyzmq's exit hook frees the buffers of
    # zero-copy sends whether or not libzmq still reads them; fastcoll must stop libzmq first.
    for attempt in range(3):
        job = launch(2, WORKER, "stall-broadcast", transport="zmq", timeout="5")
        root = job.procs[0]
        seen = _read_until(root, "ERROR")
        os.kill(job.procs[1].pid, signal.SIGCONT)
        try:
            code = root.wait(timeout=15)
        finally:
            job.kill()
        out, err = root.communicate()
        assert "ERROR CollectiveTimeoutError" in seen, f"attempt {attempt}: {seen}{out}\n{err[-3000:]}"
        assert code == 3, f"attempt {attempt}: the root exited {code}\n{seen}{out}\n{err[-3000:]}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exiting_with_a_collective_in_flight_ends_at_once(launch, transport):
    # An async_op nobody waited for, its peer absent, when the program returns: the exit stops
    # the call (its service thread first, then the transport), cleanly and within a second or so.
    job = launch(2, WORKER, "exit-mid-call", "6", transport=transport, timeout="30")
    start = time.monotonic()
    try:
        code = job.procs[0].wait(timeout=20)
    finally:
        took = time.monotonic() - start
        job.kill()
    out, err = job.procs[0].communicate()
    assert code == 0 and "QUEUED" in out, f"rank 0 exited {code}\n{out}\n{err[-3000:]}"
    assert took < 5.0, f"rank 0 took {took:.1f}s to exit\n{out}\n{err[-3000:]}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_forked_child_that_exits_leaves_the_job_alone(launch, transport):
    results = outcome(launch(2, WORKER, "fork-exit", transport=transport, timeout="30"), 60)
    for r, (code, lines, out, err) in enumerate(results):
        assert code == 0 and "OK" in lines and "CHILD-HUNG" not in lines, f"rank {r}\n{show(results)}"


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_forked_childs_collective_raises_and_leaves_the_job_alone(launch, transport, engine):
    # A child forked after init() whose all_reduce went out on its parent's links made rank 1's
    # next all_reduce return 102 (the child's 100 plus its own 2), with no error anywhere.
    results = outcome(launch(2, WORKER, "fork-call", transport=transport, timeout="30",
                             FASTCOLL_NATIVE=engine), 60)
    for r, (code, lines, out, err) in enumerate(results):
        assert code == 0 and "OK" in lines and lines["RESULT"] == "3.0", f"rank {r}\n{show(results)}"
    code, lines, out, err = results[0]
    assert lines["CHILD-EXIT"] == "0", show(results)
    errors = [line for line in out.splitlines() if line.startswith("CHILD-ERROR ")]
    assert len(errors) == 2, show(results)  # all_reduce (planned in the parent), then broadcast
    for line in errors:
        _, cls, took, message = line.split(" ", 3)
        assert cls == "FastcollError" and float(took) < 0.5, line
        assert "was forked from rank 0's process" in message, line


# --- 4. Ctrl-C reaches the caller, and the peers raise at once ---------------------------------


def _interrupt_outcome(job: Job, victim: int, send_sigint: bool) -> list:
    if send_sigint:
        p = job.procs[victim]
        seen = _read_until(p, "LOOPING")
        assert "LOOPING" in seen, seen
        os.kill(p.pid, signal.SIGINT)
        results = outcome(job, 15)
        code, lines, out, err = results[victim]
        results[victim] = (code, lines, seen + out, err)
        return results
    return outcome(job, 30)


@pytest.mark.parametrize("transport,world,how", [
    ("shm", 2, "sigint"), ("tcp", 2, "sigint"), ("zmq", 2, "sigint"), ("zmq", 3, "sigint"),
    ("tcp", 3, "sigint-queued"), ("zmq", 2, "sigint-queued"),
    ("zmq", 2, "swallowed-interrupt"), ("zmq", 3, "swallowed-interrupt"),
])
def test_ctrl_c_reaches_the_caller_and_every_peer_raises(launch, transport, world, how):
    # "swallowed-interrupt": the KeyboardInterrupt is raised inside a deallocator while a
    # received frame is released, as pyzmq's Frame.__dealloc__ does with a Ctrl-C that lands
    # there: Python can only report it ("Exception ignored in ..."), and the rank used to run
    # on for thousands of collectives. Now it stops at once, every time.
    job = launch(world, WORKER, how, "1024", transport=transport, timeout="10")
    results = _interrupt_outcome(job, 1, how.startswith("sigint"))
    code, lines, out, err = results[1]
    assert code != 0 and "KeyboardInterrupt" in err, show(results)
    assert "INTERRUPTED" in lines, show(results)
    stopped = float(lines["INTERRUPTED"].split()[1])
    if how == "swallowed-interrupt":
        assert stopped - float(lines["INTERRUPT"]) < 0.5, show(results)
    for r, (code, lines, _, _) in enumerate(results):
        if r == 1:
            continue
        assert code == 3 and "ERROR" in lines, f"rank {r}\n{show(results)}"
        cls, wall, message = lines["ERROR"].split(" ", 2)
        assert cls in ("FastcollError", "PeerLostError"), f"rank {r}\n{show(results)}"
        assert float(wall) - stopped < 1.0, f"rank {r} raised {float(wall) - stopped:.3f}s later\n{show(results)}"


# --- 5. After finalize() ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_calls_after_finalize_raise_at_once_naming_it(launch, transport):
    job = launch(2, WORKER, "after-finalize", transport=transport, timeout="10")
    results = outcome(job, 30)
    assert all(code == 0 and "OK" in lines for code, lines, _, _ in results), show(results)


# --- 7. One failure, one error class on every rank ---------------------------------------------


@pytest.mark.parametrize("transport,world", [("shm", 2), ("tcp", 2), ("zmq", 2), ("tcp", 3)])
def test_a_late_rank_gets_the_same_error_after_a_large_message(launch, transport, world):
    # The others time out (timeout=1) with 16 MiB ring messages to the victim still going out;
    # the victim arrives 0.4 s later. finalize() used to close the sockets before the ABORT
    # left (the victim then read "Connection reset by peer" or a cut message: PeerLostError).
    job = launch(world, WORKER, "late-large", transport=transport, timeout="30")
    results = outcome(job, 30)
    for r, (code, lines, _, _) in enumerate(results):
        assert code == 3, f"rank {r}\n{show(results)}"
        cls, _, _ = error_of(lines)
        assert cls == "CollectiveTimeoutError", f"rank {r}\n{show(results)}"
        assert float(lines["FINALIZE"]) < 2.0, f"rank {r}\n{show(results)}"


# --- 8. Two threads, one group ---------------------------------------------------------------------


@pytest.mark.parametrize("transport,world", [("shm", 2), ("tcp", 2), ("zmq", 2), ("tcp", 3)])
def test_calls_of_two_threads_never_mix(launch, transport, world):
    # Threads A (value 1) and B (value 100) call all_reduce on one group; rank 0 lets A go
    # first, the others B. A's call on rank 0 used to meet B's on rank 1 and both returned
    # 101: mixed data, no error. Now such a meeting is a MismatchError naming both threads.
    job = launch(world, WORKER, "threads", transport=transport, timeout="10")
    results = outcome(job, 40)
    errors = 0
    for r, (code, _, out, _) in enumerate(results):
        assert code == 0, f"rank {r}\n{show(results)}"
        for line in out.splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "RESULT":
                want = {"A": 1.0, "B": 100.0}[parts[1]] * world
                assert float(parts[2]) == want, f"rank {r}: mixed result {line}\n{show(results)}"
            elif parts[0] == "ERROR":
                errors += 1
                assert parts[1] in ("MismatchError", "FastcollError"), line
    assert errors, show(results)
    assert "thread 'worker-A'" in "".join(out for _, _, out, _ in results), show(results)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_group_handed_to_a_worker_thread_stays_correct(launch, transport):
    job = launch(2, WORKER, "handoff", transport=transport, timeout="10")
    results = outcome(job, 30)
    assert all(code == 0 and "OK" in lines for code, lines, _, _ in results), show(results)


# --- 9. reduce_scatter's memory ------------------------------------------------------------------


class _Silent(Transport):
    """Rank `rank` of `size` whose peers answer every receive with a matching header and zeros
    written in place (no NaN from uninitialised scratch): only the algorithm's own allocations
    are left to measure."""

    def send(self, peer, header, payload, deadline=None):
        pass

    def flush(self, deadline=None):
        pass

    def _next_header(self, peer, chunk, deadline, nbytes=0):
        return wire.Header(wire.DATA, 0, "test()", chunk, nbytes)

    def _read_payload(self, peer, chunk, out, deadline=None):
        np.asarray(out).view(np.uint8)[...] = 0

    def _send_abort(self, header):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_python_reduce_scatter_allocates_a_piece(world):
    """The Python engine's reduce_scatter reduces a piece at a time into its result: beside the
    1/n result the caller gives it, one piece of scratch, never src's size."""
    count = 4 << 20  # 16 MiB of float32
    src = np.ones(count, np.float32)
    piece = 256 * 1024
    call = Call(_Silent(0, world), 0, "test()", time.monotonic() + 30, 0, world, list(range(world)), piece)
    combine = dtypes.reducer("float32", "sum")
    a, b = blocks(count, world)[0]
    out = np.empty(b - a, np.float32)
    tracemalloc.start()
    try:
        reference.reduce_scatter(call, src, out, blocks(count, world), combine)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= piece + (1 << 16), f"peak {peak / 2**20:.1f} MiB for a {src.nbytes / 2**20:.0f} MiB input at {world} ranks"


def test_python_reduce_scatter_in_many_pieces_is_exact():
    """Many pieces a block, at several world sizes: every piece lands in its own place."""
    from test_algorithms import run_ranks

    for n in (3, 4, 5):
        count = n * 40
        xs = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(n)]
        want = np.sum(xs, axis=0)
        bounds = blocks(count, n)

        def body(call):
            a, b = bounds[call.rank]
            out = np.empty(b - a, np.float32)
            reference.reduce_scatter(call, xs[call.rank], out, bounds, dtypes.reducer("float32", "sum"))
            return out

        got = run_ranks(n, body, piece_bytes=8)
        for r, (a, b) in enumerate(bounds):
            assert np.array_equal(got[r], want[a:b]), (n, r)
