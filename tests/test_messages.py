"""What an error tells a user about the other ranks and their hosts, in the launcher's words:
a rank that is alive but has not made the call, the host as the launcher names it, a lost rank
named once however many ranks passed the news on, a mismatched recv named recv, a timeout that
is no number, and a hostfile address that --check and a launch judge alike."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys

import numpy as np
import pytest

from conftest import PROGS
from engines import engines

sys.path.insert(0, PROGS)
from launch_support import launches  # noqa: E402,F401

WORKER = os.path.join(PROGS, "naming_worker.py")
LINUX_PROC = os.path.exists("/proc/self/stat")


def errors(text: str) -> dict[int, str]:
    """Each rank's `ERROR ...` line in the launcher's tagged output, by rank."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\[(\d+)\] ERROR (.*)$", text, re.M)}


def _launch(launches, n: int, *args: str, native: str = "1") -> tuple[int, str, str]:
    env_args = ["--env", f"FASTCOLL_NATIVE={native}"]
    code, out, err, _ = launches.run(["-n", str(n), *env_args, "python", WORKER, *args], timeout=90)
    return code, out.decode(), err.decode()


@pytest.mark.skipif(not LINUX_PROC, reason="a peer's process is told only where /proc shows it (Linux)")
@pytest.mark.parametrize("native", engines())
def test_a_rank_alive_but_not_calling_is_named_so_with_the_launchers_host_name(launches, native):
    """Two ranks under fastcoll-launch, rank 1 alive but not calling: rank 0's timeout says so,
    with rank 1's process, not that it stopped or the network failed; and the host is named as
    the launcher names it (localhost), not by the machine's own name."""
    code, out, err = _launch(launches, 2, "idle", "1", native=native)
    assert code == 3, out + err
    said = errors(out)[0]
    assert said.startswith("CollectiveTimeoutError: rank 0 timed out waiting for rank 1"), said
    assert re.search(r"rank 1 \(host localhost\) stopped answering: it is alive \(process \d+ on this host\) "
                     r"but has not made this call", said), said
    assert "the network" not in said and "it stopped" not in said, said
    if socket.gethostname() != "localhost":
        assert f"host {socket.gethostname()}" not in said, said
    assert "rank 1 (host localhost) exited" not in err  # rank 1 was alive: the launcher stopped it


@pytest.mark.skipif(not LINUX_PROC, reason="a peer's process is told only where /proc shows it (Linux)")
def test_a_stopped_rank_is_named_stopped(launch):
    """Rank 1 stopped by SIGSTOP after init(): rank 0 says it is stopped, naming its process."""
    job = launch(2, WORKER, "stop", "1", transport="tcp")
    p0, p1 = job.procs
    try:
        p0.wait(timeout=60)
    finally:
        os.kill(p1.pid, signal.SIGCONT)
    results = job.wait(timeout=60)
    said = errors("\n".join(f"[0] {line}" for line in results[0].out.splitlines()))[0]
    assert f"rank 1 (host {socket.gethostname()}) stopped answering: it is stopped (process {p1.pid} on this host, " \
           "stopped by a signal or held by a debugger) and has not made this call" in said, said


def test_a_lost_rank_is_named_once_however_the_news_travelled(launches):
    """Four ranks on the ring, rank 1 exits: a rank that heard of it only from a neighbour that
    heard it from another said 'rank 3: PeerLostError: rank 2: PeerLostError: rank 1 ...'; every
    rank now names the first cause once, with the launcher's name for its host."""
    code, out, err = _launch(launches, 4, "die")
    assert code == 3, out + err
    said = errors(out)
    assert sorted(said) == [0, 2, 3], out
    for rank, line in said.items():
        assert line.startswith("PeerLostError: "), line
        assert line.count("PeerLostError") <= 2 and line.count("rank 1 closed its connection") == 1, line
        assert not re.search(r"rank \d: PeerLostError: rank \d: PeerLostError", line), line
        assert line.endswith("rank 1 closed its connection (it exited or was killed); rank 1 ran on host localhost"), line


@pytest.mark.parametrize("native", engines())
def test_a_mismatched_recv_is_named_recv(launch, native):
    """Rank 1 receives 8 float32 where rank 0 sent 4: rank 1's error names its own call recv,
    and rank 0's send."""
    results = launch(2, WORKER, "recv", transport="tcp", FASTCOLL_NATIVE=native).wait(timeout=60)
    line = next(x for x in results[1].out.splitlines() if x.startswith("ERROR"))
    assert line == ("ERROR MismatchError: rank 1 called recv(0,1,float32,(8,)) as collective #0 but rank 0 "
                    "called send(0,1,float32,(4,)) as collective #0"), line


@pytest.mark.parametrize("value", ["5", "abc", True, b"5"])
def test_a_timeout_that_is_no_number_is_a_type_error_naming_it(value):
    """`timeout="5"` was taken as 5 s: a value that is no number is a TypeError naming the
    argument and the value, for the collectives and the objects alike."""
    from fastcoll.config import Config
    from fastcoll.group import Group

    g = Group(Config())
    x = np.ones(4, np.float32)
    for call in (lambda: fastcoll_call("all_reduce", x, g, value), lambda: fastcoll_call("barrier", None, g, value),
                 lambda: fastcoll_call("broadcast_object", 1, g, value)):
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == f"timeout must be a number of seconds (an int or a float), not {type(value).__name__} {value!r}"
    assert np.array_equal(fastcoll_call("all_reduce", x, g, 5), x)  # numbers still are


def fastcoll_call(name: str, x, group, timeout):
    import fastcoll

    if x is None:
        return getattr(fastcoll, name)(group=group, timeout=timeout)
    return getattr(fastcoll, name)(x, group=group, timeout=timeout)


@pytest.mark.parametrize("address, ok", [("192.0.2.1", False), ("127.0.0.1", True)])
def test_check_and_a_launch_judge_a_listed_address_alike(launches, tmp_path, address, ok):
    """A hostfile that lists for this machine an address it does not have (192.0.2.1, kept for
    documentation; only bound, never sent to): --check failed it while a launch ran without a
    word. Both refuse it now, naming it; an address of its own passes both."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"localhost slots=2 ips={address}\n")
    code, out, err, _ = launches.run(["--check", "--hostfile", str(hostfile)], timeout=60)
    assert (code == 0) is ok, out.decode() + err.decode()
    code2, out2, err2, _ = launches.run(["--hostfile", str(hostfile), "python", "-c",
                                         "import fastcoll; print('size', fastcoll.init().size())"], timeout=60)
    assert (code2 == 0) is ok, out2.decode() + err2.decode()
    if ok:
        assert sorted(out2.decode().splitlines()) == ["[0] size 2", "[1] size 2"]
    else:
        listed = f"listed address {address} is not this host's"
        assert listed in out.decode(), out.decode()
        assert code2 == 2 and out2 == b"" and f"fastcoll-launch: host localhost: {listed}" in err2.decode(), err2.decode()

