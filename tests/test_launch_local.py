"""fastcoll-launch with real local processes: environment, output, failure, signals, timeout."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "progs"))
from launch_support import (  # noqa: E402,F401
    json_lines,
    launches,
    processes_with,
    survivors,
    wait_for_lines,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_local_ranks_get_env_and_prefix(launches, n):
    prog_args = ["--lr", "3e-4", "-n", "7", "a b", "--env", "X=1", "--"]
    code, out, err, _ = launches.run(
        ["-n", str(n), "--env", "EXTRA=hello world", *launches.rank_args("env", *prog_args)]
    )
    assert code == 0, err.decode()
    ranks = json_lines(out)
    assert sorted(ranks) == list(range(n))
    coordinators = {r["FASTCOLL_COORDINATOR"] for r in ranks.values()}
    tokens = {r["FASTCOLL_TOKEN"] for r in ranks.values()}
    assert len(coordinators) == 1 and len(tokens) == 1
    host, port = coordinators.pop().rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    assert re.fullmatch(r"[0-9a-f]{64}", tokens.pop())
    for rank, info in ranks.items():
        assert info["FASTCOLL_RANK"] == str(rank)
        assert info["FASTCOLL_WORLD_SIZE"] == str(n)
        assert info["FASTCOLL_LOCAL_RANK"] == str(rank)
        assert info["FASTCOLL_INTERFACE"] == "127.0.0.1"
        assert info["argv"] == prog_args  # everything after the program, untouched
        assert info["extra"] == "hello world"
        assert info["executable"] == sys.executable  # `python` became the launcher's Python
        assert info["unbuffered"] == "1"


def test_each_job_gets_a_fresh_token(launches):
    tokens = set()
    for _ in range(2):
        code, out, err, _ = launches.run(launches.rank_args("env"))
        assert code == 0, err.decode()
        tokens.add(json_lines(out)[0]["FASTCOLL_TOKEN"])
    assert len(tokens) == 2


def test_env_without_value_passes_the_launchers_value(launches, monkeypatch):
    monkeypatch.setenv("PASSED", "from-launcher")
    code, out, err, _ = launches.run(["-n", "2", "-x", "PASSED", *launches.rank_args("env")])
    assert code == 0, err.decode()
    assert {r["passed"] for r in json_lines(out).values()} == {"from-launcher"}


def test_failing_rank_stops_job_with_its_code(launches):
    code, out, err, took = launches.run(["-n", "4", *launches.rank_args("exit-if", "2", "3")])
    assert code == 3, err.decode()
    assert took < 10
    assert re.search(rb"rank 2 \(host \S+\) exited with code 3", err), err.decode()
    assert survivors(launches.marker) == []


def test_the_first_rank_to_fail_is_reported_not_the_first_noticed(launches, tmp_path):
    """Rank 1 exits 3; rank 0, which the launcher looks at first, exits 1 a moment (20 ms)
    later because of it. Every time, the launcher must name rank 1 and exit 3 (before it was
    fixed it named rank 0 in about half of these runs)."""
    for run in range(20):
        code, out, err, _ = launches.run(
            ["-n", "2", *launches.rank_args("first-fails", "1", "3", "1", "0.02",
                                            str(tmp_path / f"lock{run}"))])
        assert (code, run) == (3, run), err.decode()
        assert b"rank 1 (host localhost) exited with code 3; stopping the other 1 rank(s)" in err, err.decode()
        assert b"rank 0 (host localhost) exited" not in err, err.decode()
    assert survivors(launches.marker) == []


def test_a_rank_ending_after_its_peer_failed_says_so_before_it_is_stopped(launches, tmp_path):
    """Rank 1 exits 3; rank 0 writes its own line 0.3 s later, as a rank that lost a peer writes
    its error. The launcher waits a second before it sends SIGTERM, so the line is written (before,
    the SIGTERM came within the launcher's 50 ms poll and rank 0 never wrote it)."""
    code, out, err, _ = launches.run(
        ["-n", "2", *launches.rank_args("first-fails", "1", "3", "1", "0.3", str(tmp_path / "lock"))])
    assert code == 3, err.decode()
    assert b"rank 0: ends with 1, 0.3 s after rank 1" in out, (out.decode(), err.decode())
    assert b"SIGTERM" not in err, err.decode()
    assert survivors(launches.marker) == []


def test_rank_killed_by_signal(launches):
    code, out, err, took = launches.run(
        ["-n", "3", *launches.rank_args("kill-if", "1", str(int(signal.SIGKILL)))]
    )
    assert code == 128 + signal.SIGKILL, err.decode()
    assert b"rank 1" in err and b"SIGKILL" in err, err.decode()
    assert took < 10
    assert survivors(launches.marker) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_leaves_no_survivors(launches, sig):
    proc = launches.start(["-n", "3", *launches.rank_args("sleep")])
    wait_for_lines(proc, b"ready", 3, timeout=20)
    # The launcher, 3 ranks and their 3 children (a child may still be in exec: give it time).
    deadline = time.monotonic() + 5
    while len(processes_with(launches.marker)) < 1 + 3 + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(launches.marker)) == 1 + 3 + 3
    began = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + sig, err.decode()
    assert time.monotonic() - began < 10
    assert f"received {signal.Signals(sig).name}".encode() in err
    assert survivors(launches.marker) == []


def test_rank_ignoring_sigterm_is_killed_after_grace(launches):
    # Rank 0 exits 5; the others ignore SIGTERM, so only the SIGKILL after --grace ends them.
    code, out, err, took = launches.run(
        ["-n", "3", "--grace", "1", *launches.rank_args("exit-or-ignore", "0", "5")]
    )
    assert code == 5, err.decode()
    assert 1.0 <= took < 10
    assert survivors(launches.marker) == []


def test_timeout_stops_the_job(launches):
    code, out, err, took = launches.run(
        ["-n", "2", "--timeout", "1.5", *launches.rank_args("sleep")]
    )
    assert code == 124, err.decode()
    assert b"--timeout" in err
    assert took < 10
    assert survivors(launches.marker) == []


def test_lines_are_whole_and_tagged(launches):
    lines = 200
    code, out, err, _ = launches.run(["-n", "4", *launches.rank_args("spam", str(lines))])
    assert code == 0, err.decode()
    for stream in (out, err):
        seen: dict[int, int] = {}
        for line in stream.decode().splitlines():
            m = re.fullmatch(r"\[(\d)\] (\d):x{3000}:(\d+)", line)
            assert m, f"torn or untagged line: {line[:80]!r}...{line[-40:]!r}"
            assert m.group(1) == m.group(2)
            rank, i = int(m.group(1)), int(m.group(3))
            assert i == seen.get(rank, 0)  # in order, none lost
            seen[rank] = i + 1
        assert seen == {r: lines for r in range(4)}


def test_binary_junk_and_last_line_without_newline(launches):
    code, out, err, _ = launches.run(["-n", "2", *launches.rank_args("junk")])
    assert code == 0, err.decode()
    got = out.split(b"\n")
    for r in range(2):
        assert b"[%d] junk:\xff\xfe\x00\x80 end" % r in got
        assert b"[%d] tail-without-newline-%d" % (r, r) in got
    assert out.endswith(b"\n")


def test_no_tag_output_and_log_dir(launches, tmp_path):
    logs = tmp_path / "logs"
    code, out, err, _ = launches.run(
        ["-n", "2", "--no-tag-output", "--log-dir", str(logs), *launches.rank_args("junk")]
    )
    assert code == 0, err.decode()
    assert not re.search(rb"^\[\d\] ", out, re.M)
    assert sorted(p.name for p in logs.iterdir()) == ["rank.0.log", "rank.1.log"]
    for r in range(2):
        text = (logs / f"rank.{r}.log").read_bytes()
        assert text == b"junk:\xff\xfe\x00\x80 end\ntail-without-newline-%d\n" % r


def test_missing_program_is_a_clear_error(launches):
    code, out, err, _ = launches.run(["-n", "2", "no-such-program-" + launches.marker])
    assert code == 127
    assert b"cannot run" in err and b"No such file" in err, err.decode()


@pytest.mark.parametrize(
    "args, message",
    [
        ([], b"no program to run"),
        (["--hosts", "localhost:2", "-n", "3", "true"], b"more ranks than the hosts have slots"),
        (["--env", "1BAD=x", "true"], b"not a variable name"),
        (["--bind-to", "sockets", "true"], b"invalid choice: 'sockets'"),
    ],
)
def test_usage_errors(launches, args, message):
    code, out, err, _ = launches.run(args)
    assert code == 2
    assert message in err, err.decode()


@pytest.mark.parametrize("name, value, says", [
    ("FASTCOLL_TRANSPORT", "tpc", "FASTCOLL_TRANSPORT must be one of 'tcp', 'zmq', 'rdma', not 'tpc'"),
    ("FASTCOLL_TIMEOUT", "abc", "FASTCOLL_TIMEOUT must be a number of seconds, not 'abc'"),
    ("FASTCOLL_SHM", "maybe", "FASTCOLL_SHM must be 0 or 1 (or on/off, true/false, yes/no), not 'maybe'"),
    ("FASTCOLL_CONNECTIONS", "0", "FASTCOLL_CONNECTIONS must be at least 1, not '0'"),
    ("FASTCOLL_LOG", "loud", "FASTCOLL_LOG must be one of warning, info, debug, not 'loud'"),
    ("FASTCOLL_TUNING", "spin=1", "FASTCOLL_TUNING: 'spin=1' is not name=value with a name among direct_max_bytes,"),
    ("FASTCOLL_TRACE", "/nonexistent/dir/t.json", "FASTCOLL_TRACE must be path.json in an existing directory "
     "this rank may write to; the directory /nonexistent/dir does not exist (FASTCOLL_TRACE='/nonexistent/dir/t.json')"),
])
@pytest.mark.parametrize("given", ["environment", "--env"])
def test_bad_settings_are_refused_in_one_line_before_any_rank_starts(launches, monkeypatch, name, value,
                                                                      says, given):
    """A FASTCOLL_* value that init() would refuse, in the launcher's environment or --env: one
    line, init()'s own words, exit code 2, and no rank started."""
    extra = ["--env", f"{name}={value}"] if given == "--env" else []
    if given == "environment":
        monkeypatch.setenv(name, value)
    code, out, err, took = launches.run(["-n", "2", *extra, *launches.rank_args("env")])
    assert code == 2 and out == b"", err.decode()
    assert err.decode().startswith(f"fastcoll-launch: {says}") and err.count(b"\n") == 1, err.decode()
    assert survivors(launches.marker, wait=0) == []


@pytest.mark.parametrize("given", ["environment", "--env", "hostfile", "--env KEY"])
def test_a_misspelled_setting_is_refused_before_any_rank_starts(launches, monkeypatch, tmp_path, given):
    """FASTCOLL_TIMOUT=5 (a misspelled FASTCOLL_TIMEOUT) ran with the default timeout: wherever it
    is given, one line names it, where it came from and the setting it is nearest, exit code 2,
    and no rank started."""
    args = ["-n", "2"]
    where = {"environment": "the launcher's environment", "--env": "--env", "--env KEY": "--env",
             "hostfile": "the hostfile's envs"}[given]
    if given in ("environment", "--env KEY"):
        monkeypatch.setenv("FASTCOLL_TIMOUT", "5")
    if given == "--env":
        args += ["--env", "FASTCOLL_TIMOUT=5"]
    if given == "--env KEY":
        args += ["--env", "FASTCOLL_TIMOUT"]
        where = "the launcher's environment"  # checked first: the value comes from there
    if given == "hostfile":
        hostfile = tmp_path / "hosts.json"
        hostfile.write_text(json.dumps({"envs": ["FASTCOLL_TIMOUT=5"], "hosts": [{"ssh": "localhost", "slots": 2}]}))
        args = ["--hostfile", str(hostfile)]
    monkeypatch.setenv("FASTCOLL_TEST_ANYTHING", "1")  # the test suite's own names pass
    code, out, err, _ = launches.run([*args, *launches.rank_args("env")])
    assert code == 2 and out == b"", err.decode()
    assert err.decode() == (f"fastcoll-launch: {where}: FASTCOLL_TIMOUT is not a fastcoll setting: "
                            "did you mean FASTCOLL_TIMEOUT?\n"), err.decode()
    assert survivors(launches.marker, wait=0) == []


def test_the_agent_checks_the_trace_path_before_it_starts_the_rank(tmp_path):
    """What a remote host's agent does with a bad FASTCOLL_TRACE (run here, without ssh): one
    line, exit status 2, and the rank never runs."""
    import socket
    import subprocess

    from fastcoll.launch.remote import agent_command, agent_payload

    request = {"mode": "run", "argv": [sys.executable, "-c", "print('the rank ran')"],
               "env": {"FASTCOLL_TRACE": "none/t.json", "FASTCOLL_RANK": "1"}, "cwd": str(tmp_path),
               "grace": 1.0, "marker": "<mark>", "heartbeat": 0}
    p = subprocess.run(agent_command(None, None, sys.executable, "test"), input=agent_payload(request),
                       capture_output=True, timeout=30)
    assert p.returncode == 2 and p.stdout == b"", p
    assert p.stderr.decode().splitlines() == [
        f"fastcoll-launch: on {socket.gethostname()}: FASTCOLL_TRACE must be path.json in an existing "
        f"directory this rank may write to; the directory {tmp_path}/none does not exist "
        "(FASTCOLL_TRACE='none/t.json')", "<mark>exit 2"]


def test_check_on_this_machine(launches):
    code, out, err, _ = launches.run(["--check", "--hosts", "localhost"])
    text = out.decode()
    assert code == 0, text + err.decode()
    assert re.search(r"^localhost\s+local\s+\d+\.\d+\.\d+\s+\S+\s+\S+\s+ok$", text, re.M), text
    assert "all hosts ok" in text



def _restart_runs(out: bytes) -> dict[str, list[dict]]:
    """The JSON lines of `fail-first` ranks, by FASTCOLL_RESTART_COUNT."""
    runs: dict[str, list[dict]] = {}
    for line in out.splitlines():
        if b"] {" in line:
            info = json.loads(line.split(b"] ", 1)[1])
            runs.setdefault(info["FASTCOLL_RESTART_COUNT"], []).append(info)
    return runs


def test_max_restarts_starts_every_rank_again(launches):
    """Rank 1 fails on the first attempt; the second, with a fresh token and coordinator port and
    FASTCOLL_RESTART_COUNT=1, succeeds, and so does the launcher."""
    code, out, err, took = launches.run(
        ["-n", "3", "--max-restarts", "2", *launches.rank_args("fail-first", "1", "3")])
    assert code == 0, err.decode()
    assert b"rank 1 (host localhost) exited with code 3" in err, err.decode()
    assert b"restarting every rank (restart 1 of 2, FASTCOLL_RESTART_COUNT=1)" in err, err.decode()
    runs = _restart_runs(out)
    assert sorted(runs) == ["0", "1"], runs
    for attempt in runs.values():
        assert sorted(int(r["FASTCOLL_RANK"]) for r in attempt) == [0, 1, 2]
        assert len({r["FASTCOLL_TOKEN"] for r in attempt}) == 1
    first, second = runs["0"][0], runs["1"][0]
    assert first["FASTCOLL_TOKEN"] != second["FASTCOLL_TOKEN"]
    assert first["FASTCOLL_COORDINATOR"] != second["FASTCOLL_COORDINATOR"]
    assert took < 15
    assert survivors(launches.marker) == []


def test_max_restarts_exhausted_gives_the_last_attempts_code(launches):
    code, out, err, _ = launches.run(
        ["-n", "2", "--max-restarts", "1", *launches.rank_args("exit-if", "0", "4")])
    assert code == 4, err.decode()
    assert err.count(b"rank 0 (host localhost) exited with code 4") == 2, err.decode()
    assert b"attempt 2 of 2 failed too (exit code 4); no restarts left" in err, err.decode()
    assert survivors(launches.marker) == []


def test_the_launch_api_restarts_as_the_command_does(launches):
    """fastcoll.launch.api.launch, called from Python: a plan it cannot make is a LaunchError
    with the command's exit code; a rank that fails on the first attempt is started again."""
    program = ["python", *launches.rank_args("fail-first", "1", "3")[1:]]
    code = (
        "import sys\n"
        "from fastcoll.launch.api import LaunchConfig, LaunchError, launch\n"
        "try:\n"
        "    launch(LaunchConfig(['python', 'x.py'], nprocs=0))\n"
        "except LaunchError as e:\n"
        "    print('REFUSED', e.code, e, file=sys.stderr, flush=True)\n"
        f"sys.exit(launch(LaunchConfig({program!r}, nprocs=2, max_restarts=1)))\n"
    )
    status, out, err, _ = launches.run([], argv=[sys.executable, "-c", code])
    assert status == 0, err.decode()
    assert b"REFUSED 2 -n must be at least 1, not 0" in err, err.decode()
    assert b"restarting every rank (restart 1 of 1, FASTCOLL_RESTART_COUNT=1)" in err, err.decode()
    assert sorted(_restart_runs(out)) == ["0", "1"]
    assert survivors(launches.marker) == []


def test_without_max_restarts_a_failure_is_final(launches):
    code, out, err, _ = launches.run(["-n", "2", *launches.rank_args("fail-first", "0", "5")])
    assert code == 5 and b"restarting" not in err, err.decode()
    assert sorted(_restart_runs(out)) == ["0"]  # FASTCOLL_RESTART_COUNT=0 even without restarts


needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="--bind-to cores needs Linux and at least two CPUs this process may use")


@needs_affinity
def test_bind_to_cores_gives_each_local_rank_cores_of_its_own(launches):
    from fastcoll.launch.agent import core_blocks

    mine = set(os.sched_getaffinity(0))
    n = min(len(core_blocks()), 4)
    code, out, err, _ = launches.run(["-n", str(n), "--bind-to", "cores", *launches.rank_args("env")])
    assert code == 0, err.decode()
    ranks = json_lines(out)
    cpus = [set(ranks[r]["cpus"]) for r in range(n)]
    for r in range(n):
        assert cpus[r] and cpus[r] <= mine, (r, cpus[r], mine)
        assert ranks[r]["thread_cpus"] == ranks[r]["cpus"]  # the rank's threads inherit the mask
        for q in range(r):
            assert not cpus[r] & cpus[q], (r, q, cpus)
    # unbound (the default): every rank where the launcher may run
    code, out, err, _ = launches.run(["-n", "2", *launches.rank_args("env")])
    assert code == 0, err.decode()
    assert all(set(info["cpus"]) == mine for info in json_lines(out).values())


@needs_affinity
def test_bind_to_cores_refuses_more_ranks_than_cores(launches):
    from fastcoll.launch.agent import core_blocks

    n = len(core_blocks()) + 1
    code, out, err, _ = launches.run(["-n", str(n), "--bind-to", "cores", *launches.rank_args("env")])
    assert code == 2, err.decode()
    assert f"core(s) this process may use for {n} rank(s)" in err.decode()
    assert b"--bind-to none" in err
    assert out == b""  # no rank ran


def test_cpu_share_splits_whole_cores_in_consecutive_blocks(monkeypatch):
    from fastcoll.launch import agent

    # five cores of two hyperthreads each, numbered as Linux does (siblings i and i + 8)
    monkeypatch.setattr(agent, "core_blocks", lambda: [[c, c + 8] for c in range(5)])
    shares = [agent.cpu_share(i, 2) for i in range(2)]
    assert shares == [[0, 1, 2, 8, 9, 10], [3, 4, 11, 12]]  # the first share gets the odd core
    assert [agent.cpu_share(i, 5) for i in range(5)] == [[c, c + 8] for c in range(5)]
    with pytest.raises(agent.BindError, match="5 core"):
        agent.cpu_share(0, 6)


_PORT_RACE = """
import socket, sys
from fastcoll.launch.job import plan_job
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("40000 40009")
port = int(plan_job(None, ["true"], nprocs=2).coordinator.rsplit(":", 1)[1])
taken = [socket.socket() for _ in range(10)]
for s in taken:  # every port the kernel hands out, as others' listeners and connections would
    s.bind(("127.0.0.1", 0))
rank0 = socket.socket()
rank0.bind(("127.0.0.1", port))
print("rank 0 bound", port)
"""


def test_the_coordinator_port_is_not_one_the_kernel_hands_out_meanwhile():
    # CI once saw rank 0 fail with 'Address already in use' on the launcher's port: the kernel
    # had given it to some other socket between the launcher's choice and rank 0's bind. Here,
    # in a network namespace of its own, every port of a narrowed ephemeral range is taken in
    # between; rank 0's bind must still succeed.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a network namespace of the test's own")
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", _PORT_RACE], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    port = int(done.stdout.split()[-1])
    assert port < 40000, done.stdout
