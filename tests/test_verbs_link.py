"""The native engine's verbs (RDMA) link, over the test fabric (tests/fabric/: a verbs provider
over shared memory with an unreliable connection's behaviour). Real rank processes
(tests/progs/verbs_worker.py) each make a native engine whose link to every peer is a verbs link
beside a loopback TCP connection the test made: every collective exact; a lost frame, a doubled
frame and a killed peer each a clear error naming the peer within the timeout; a missing library
or device, a stranger's setup message and a silent peer each one line; nothing left registered."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

import pytest

from conftest import PROGS, ROOT, Job, Result, assert_ok, fabric_build, jobless_env
from engines import native_missing

WORKER = os.path.join(PROGS, "verbs_worker.py")


build = fabric_build()


def why_not() -> str | None:
    """Why the verbs link cannot be tested here (no compiler, no <infiniband/verbs.h>, no native
    engine), or None."""
    cc = build.compiler()
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}) to build the test fabric"
    if not build.have_verbs_h(cc, build.env_flags("CFLAGS")):
        return build.NO_VERBS
    missing = native_missing()
    return f"no native engine: {missing}" if missing else None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


@pytest.fixture(scope="module")
def fabric() -> str:
    """The fabric library's path (built in tests/fabric/build unless up to date)."""
    return build.build()


@pytest.fixture
def fabdir():
    """A directory of the fabric's own for one test (its queue pairs' files), on /dev/shm where
    there is one."""
    d = tempfile.mkdtemp(prefix="fcfab-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a loopback TCP connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def start(size: int, case: str, env: dict, per_rank_env=None) -> Job:
    """`size` workers, a TCP connection between every two, each end passed to its rank."""
    pairs = {(a, b): tcp_pair() for a in range(size) for b in range(a + 1, size)}
    procs = []
    try:
        for r in range(size):
            mine = {b if a == r else a: ends[0 if a == r else 1].fileno() for (a, b), ends in pairs.items()
                    if r in (a, b)}
            e = dict(env, **(per_rank_env(r) if per_rank_env else {}))
            procs.append(subprocess.Popen([sys.executable, WORKER, str(r), str(size), case, json.dumps(mine)],
                                          pass_fds=list(mine.values()), env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
    except BaseException:
        Job(procs).kill()
        raise
    finally:
        for ends in pairs.values():
            for s in ends:
                s.close()
    return Job(procs)


def run(size: int, case: str, fabric: str, fabdir: str, timeout: float = 120, per_rank_env=None,
        **extra: str) -> list[Result]:
    env = jobless_env()
    env.update({"FASTCOLL_VERBS_LIB": fabric, "FCFAB_DIR": fabdir, **extra})
    job = start(size, case, env, per_rank_env)
    try:
        return job.wait(timeout)
    finally:
        job.kill()


def error_line(r: Result) -> str:
    lines = [x for x in r.out.splitlines() if x.startswith("ERROR ")]
    assert r.code == 0 and lines, f"rank {r.rank} exit {r.code}:\n{r.out}\n{r.err[-3000:]}"
    return lines[-1]


def waited(r: Result) -> float:
    return float([x for x in r.out.splitlines() if x.startswith("AFTER ")][-1].split()[1])


CSRC = os.path.join(ROOT, "fastcoll", "engine", "csrc")
LINK_SOURCES = ["links/fc_link.c", "links/verbs/fc_link_verbs.c", "links/verbs/fc_verbs_lib.c",
                "links/verbs/fc_verbs_qp.c", "links/verbs/fc_verbs_setup.c", "links/verbs/fc_verbs_credit.c"]


@pytest.fixture(scope="module")
def stream_program(tmp_path_factory) -> str:
    """tests/progs/verbs_stream.c built with the link's own sources (no engine, no Python)."""
    exe = str(tmp_path_factory.mktemp("verbs") / "verbs_stream")
    argv = [build.compiler(), "-std=c11", "-D_DEFAULT_SOURCE", "-DFC_HAVE_VERBS", "-O1", "-g", "-Wall", "-Wextra",
            "-Werror", "-I", CSRC, "-o", exe, os.path.join(PROGS, "verbs_stream.c"),
            *[os.path.join(CSRC, f) for f in LINK_SOURCES], "-ldl", "-pthread"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return exe


def test_credits_a_reader_owes_reach_a_writer_while_the_reader_makes_no_call(fabric, fabdir, stream_program):
    """Two processes stream 3 MiB each way over one verbs link, each filling the other's slots
    before reading; one then takes the other's bytes and makes no call on its link while the
    other sends the rest: its credits must have gone back as it took the bytes (over the socket,
    its last credit spent), as a TCP receive window reopens without the reader (progs/verbs_stream.c)."""
    report = os.path.join(fabdir, "report")
    env = dict(os.environ, FCFAB_DIR=fabdir, FCFAB_REPORT=report)
    p = subprocess.run([stream_program, fabric], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    said = dict(line.split(": ", 1) for line in p.stdout.splitlines())
    assert said["side 0"].startswith("ok, ") and said["side 1"].startswith("ok, "), p.stdout
    assert int(said["side 1"].split()[1]) >= 1, p.stdout  # (the credits that could not go as messages)
    assert leaks(report) == [], "registrations left open"


def test_the_build_has_the_verbs_link():
    from fastcoll.engine import _native

    assert "verbs" in _native.link_kinds()


def test_link_info_says_what_carries_a_link():
    import threading

    from fastcoll.engine import _native

    e = _native.Engine(0, 2, 1, 0, 0, threading.main_thread().ident, 0)
    a, b = socket.socketpair()
    try:
        e.links.add(1, 0, a.fileno())
        a.detach()
        assert e.links.info(1, 0) == ("tcp", "")  # (a verbs link's detail: test_every_collective_is_exact)
        with pytest.raises(ValueError, match="no link to rank 0 on channel 0"):
            e.links.info(0, 0)
        with pytest.raises(ValueError, match="no link to rank 1 on channel 1"):
            e.links.info(1, 1)
    finally:
        e.close(0.0, 0.0)
        b.close()
    with pytest.raises(RuntimeError, match="closed"):
        e.links.info(1, 0)


def leaks(report: str) -> list[str]:
    """The fabric's exit reports that show an object still open."""
    lines = [open(p).read().strip() for p in glob.glob(report + ".*")]
    assert lines, "no fabric report was written"
    return [x for x in lines if x.split()[1:] != ["ctx", "0", "pd", "0", "mr", "0", "cq", "0", "qp", "0"]]


@pytest.mark.parametrize("size,reliable", [(2, "0"), (3, "0"), (2, "1")], ids=["2-uc", "3-uc", "2-rc"])
def test_every_collective_is_exact(fabric, fabdir, size, reliable):
    report = os.path.join(fabdir, "report")
    results = run(size, "collectives", fabric, fabdir, FCFAB_REPORT=report, VERBS_RELIABLE=reliable)
    assert_ok(results)
    kind = "RC" if reliable == "1" else "UC"
    for r in results:
        assert f"rank {r.rank}: " in r.out and "checks passed" in r.out, r.out
        links = json.loads(r.out.split("LINKS ", 1)[1].splitlines()[0])
        assert links == [["verbs", f"fcfab{r.rank}, {kind}, MTU 1024"]] * (size - 1), links
        # A bell that wakes a peer asleep in poll() must not wait behind the last one's
        # acknowledgement (Nagle's rule): a missing TCP_NODELAY cost a nap (1 ms) a sleeping wait.
        assert json.loads(r.out.split("NODELAY ", 1)[1].splitlines()[0]) == [1] * (size - 1), r.out
    assert leaks(report) == [], "registrations left open"


@pytest.mark.parametrize("fault,said", [
    ("drop:40", "a frame was lost on the RDMA link (unreliable connection): frame "),
    ("dup:40", "a frame came twice on the RDMA link (unreliable connection): frame "),
])
def test_a_lost_or_doubled_frame_is_an_error_naming_the_peer(fabric, fabdir, fault, said):
    results = run(2, "fault", fabric, fabdir, VERBS_TIMEOUT="20",
                  per_rank_env=lambda r: {"FCFAB_FAULT": fault} if r == 1 else {})
    zero, one = error_line(results[0]), error_line(results[1])
    assert zero.startswith("ERROR PeerLostError connection to rank 1 failed: ") and said in zero, zero
    assert "rank 0" in one, one
    assert waited(results[0]) < 10 and waited(results[1]) < 10, (results[0].out, results[1].out)


def test_a_killed_peer_is_an_error_naming_it(fabric, fabdir):
    results = run(2, "kill", fabric, fabdir, VERBS_TIMEOUT="20")
    assert results[1].code == -9, results[1].err[-2000:]
    zero = error_line(results[0])
    assert zero.startswith("ERROR PeerLostError rank 1 closed its connection (it exited or was killed)"), zero
    assert waited(results[0]) < 10, results[0].out  # (the socket's end, not the 20 s timeout)


def test_a_missing_library_is_one_line(fabric, fabdir):
    results = run(2, "open", fabric, fabdir, FASTCOLL_VERBS_LIB="/nonexistent/libibverbs-missing.so.1")
    for r in results:
        line = error_line(r)
        assert line.startswith(f"ERROR RuntimeError the verbs link to rank {1 - r.rank} could not open: could not "
                               "load the verbs library /nonexistent/libibverbs-missing.so.1 ("), line
        assert "\n" not in line and "Traceback" not in r.out


def test_a_missing_device_is_one_line_naming_those_there_are(fabric, fabdir):
    results = run(2, "open", fabric, fabdir, VERBS_DEVICE="mlx5_9")
    for r in results:
        assert error_line(r) == (f"ERROR RuntimeError the verbs link to rank {1 - r.rank} could not open: no RDMA "
                                 f"device 'mlx5_9' (the verbs library {fabric} has fcfab0, fcfab1, fcfab2, fcfab3)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the platform's library is libibverbs.so.1 on Linux")
def test_without_a_library_named_the_platforms_is_loaded(fabric, fabdir):
    """FASTCOLL_VERBS_LIB unset: rdma-core's libibverbs.so.1, whatever this machine has of it (no
    library, no device: one line either way)."""
    env = {k: v for k, v in jobless_env().items() if k != "FASTCOLL_VERBS_LIB"}
    env.update(FCFAB_DIR=fabdir, VERBS_DEVICE="fastcoll-no-such-device")
    job = start(2, "open", env)
    try:
        results = job.wait(60)
    finally:
        job.kill()
    for r in results:
        line = error_line(r)
        assert line.startswith(f"ERROR RuntimeError the verbs link to rank {1 - r.rank} could not open: "), line
        assert any(said in line for said in (
            "could not load the verbs library libibverbs.so.1 (", "the verbs library libibverbs.so.1 lists no RDMA "
            "device (", "no RDMA device 'fastcoll-no-such-device' (the verbs library libibverbs.so.1 has ")), line


def test_both_sides_must_ask_for_the_same_queue_pairs(fabric, fabdir):
    results = run(2, "open", fabric, fabdir, per_rank_env=lambda r: {"VERBS_RELIABLE": "1" if r == 0 else "0"})
    assert "the peer's RDMA setup was refused: it asked for unreliable-connected queue pairs, this side for " \
           "reliable-connected ones" in error_line(results[0])
    assert "it asked for reliable-connected queue pairs, this side for unreliable-connected ones" in \
           error_line(results[1])


def setup_message(**change) -> bytes:
    """A setup message as fc_verbs_setup.c packs it, with fields changed."""
    f = dict(magic=b"FCVS", version=1, zero=0, reliable=0, pad=0, qpn=0x1234, psn=7, lid=0, mtu=3, has_gid=1,
             gid=b"\0" * 10 + b"\xff\xff\x0a\x00\x00\x01", slots=32, slot_bytes=65536, rest=b"\0" * 20)
    f.update(change)
    return struct.pack("<4sBBBBIIHBB16sII20s", f["magic"], f["version"], f["zero"], f["reliable"], f["pad"],
                       f["qpn"], f["psn"], f["lid"], f["mtu"], f["has_gid"], f["gid"], f["slots"],
                       f["slot_bytes"], f["rest"])


STRANGERS = {
    "a TCP link's bytes": (b"\x10\x00\x00\x00" + b"\x95" * 60, "its answer is not an RDMA setup message"),
    "another version": (setup_message(version=2), "it speaks another version of the RDMA setup"),
    "a queue pair out of range": (setup_message(qpn=1 << 24), "its queue pair number or packet sequence number"),
    "no queue pair": (setup_message(qpn=0), "its queue pair number or packet sequence number"),
    "too many slots": (setup_message(slots=1 << 20), "its receive slots are out of bounds"),
    "tiny slots": (setup_message(slot_bytes=16), "its receive slots are out of bounds"),
    "a bad MTU": (setup_message(mtu=9), "its MTU or address is out of range"),
    "unknown fields": (setup_message(rest=b"\1" + b"\0" * 19), "its setup message has fields this version"),
}


@pytest.mark.parametrize("case", list(STRANGERS))
def test_a_setup_message_out_of_bounds_is_refused(fabric, fabdir, case):
    """The test plays rank 1 on rank 0's socket and answers with a bad message."""
    sent, said = STRANGERS[case]
    mine, theirs = tcp_pair()
    env = dict(jobless_env(), FASTCOLL_VERBS_LIB=fabric, FCFAB_DIR=fabdir)
    p = subprocess.Popen([sys.executable, WORKER, "0", "2", "open", json.dumps({1: mine.fileno()})],
                         pass_fds=[mine.fileno()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    mine.close()
    job = Job([p])
    try:
        with theirs:
            theirs.sendall(sent)
            [r] = job.wait(60)
    finally:
        job.kill()
    line = error_line(r)
    assert line.startswith("ERROR RuntimeError the verbs link to rank 1 could not open: the peer's RDMA setup was "
                           "refused: ") and said in line, line


def test_a_silent_peer_ends_the_setup_at_its_timeout(fabric, fabdir):
    mine, theirs = tcp_pair()
    env = dict(jobless_env(), FASTCOLL_VERBS_LIB=fabric, FCFAB_DIR=fabdir, VERBS_SETUP_TIMEOUT="0.5")
    p = subprocess.Popen([sys.executable, WORKER, "0", "2", "open", json.dumps({1: mine.fileno()})],
                         pass_fds=[mine.fileno()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    mine.close()
    job = Job([p])
    try:
        with theirs:
            [r] = job.wait(60)
    finally:
        job.kill()
    assert error_line(r) == "ERROR RuntimeError the verbs link to rank 1 could not open: the peer sent no RDMA " \
                            "setup within 0.5 s (does it open an RDMA link too?)"
