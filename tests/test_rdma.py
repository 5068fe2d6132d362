"""FASTCOLL_TRANSPORT=rdma: its settings, the ranks' agreement, MLX hostfiles' `rdma` lists, and
whole jobs over verbs links on the test fabric (tests/fabric/: a verbs provider over shared
memory, FASTCOLL_VERBS_LIB), started as users start them.

Over the fabric, at 2, 3 and 4 ranks: every collective and dtype, bit for bit the TCP transport's
results; a lost frame, a duplicated frame and a killed peer, each a FastcollError on every rank
within the timeout, naming the peer; a soak (10,000 collectives in the slow run) exact, with flat
resident size and no verbs resources left open at exit (the fabric's FCFAB_REPORT); an MLX
hostfile with `rdma` entries under fastcoll-launch (examples/allreduce.py, `python -m
fastcoll.mlx_compat`) and `--check`; a missing library or device, one line at init() and at
--check. The fabric's tests skip, saying why, only where it cannot be built (no compiler, no
<infiniband/verbs.h>).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import sys

import pytest

from conftest import PROGS, ROOT, assert_ok, fabric_library, fabric_missing, jobless_env, run_session
from fastcoll.engine import verbs_problem
from fastcoll.config import Config
from fastcoll.errors import FastcollError, MismatchError
from fastcoll.launch.check import rdma_pairs
from fastcoll.launch.hostfile import parse_hostfile_text
from fastcoll.launch.job import plan_job
from fastcoll.transport import rdma

TIMEOUT = 5.0  # FASTCOLL_TIMEOUT of the fault jobs


def env(**kv: str) -> dict:
    return {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "3", "FASTCOLL_COORDINATOR": "127.0.0.1:1",
            "FASTCOLL_TRANSPORT": "rdma", **kv}


# --- settings -----------------------------------------------------------------------------------


def test_rdma_settings_are_read():
    c = Config.from_env(env(FASTCOLL_VERBS_LIB="/opt/lib/libfab.so", FASTCOLL_RDMA_RELIABLE="1",
                            FASTCOLL_RDMA_DEVICES='[null, "rdma_en3", ["rdma_en4", "rdma_en5"]]'))
    assert (c.transport, c.verbs_lib, c.rdma_reliable) == ("rdma", "/opt/lib/libfab.so", True)
    assert c.rdma_devices == (None, ("rdma_en3",), ("rdma_en4", "rdma_en5"))
    c = Config.from_env(env())
    assert (c.verbs_lib, c.rdma_devices, c.rdma_reliable) == (None, None, False)  # every peer, first device, UC


@pytest.mark.parametrize("value, words", [
    ("rdma_en3", "must be a JSON list such as"),
    ('[null, "rdma_en3"]', "one entry per rank (3)"),
    ('["rdma_en2", "rdma_en3", null]', "entry 0 is this rank itself and must be null"),
    ('[null, "rdma en3", null]', "entry 1 must be null, a device name or a list"),
    ('[null, 3, null]', "entry 1 must be null, a device name or a list"),
    ('[null, [], null]', "entry 1 must be null, a device name or a list"),
    ('{"1": "rdma_en3"}', "one entry per rank"),
])
def test_bad_rdma_devices_name_the_variable(value, words):
    with pytest.raises(ValueError) as e:
        Config.from_env(env(FASTCOLL_RDMA_DEVICES=value))
    assert str(e.value).startswith("FASTCOLL_RDMA_DEVICES") and words in str(e.value), e.value


@pytest.mark.parametrize("name, value", [("FASTCOLL_RDMA_RELIABLE", "maybe"), ("FASTCOLL_VERBS_LIB", " lib.so")])
def test_bad_rdma_settings_name_the_variable(name, value):
    with pytest.raises(ValueError, match=f"^{name}"):
        Config.from_env(env(**{name: value}))


def test_rdma_settings_mean_nothing_under_another_transport():
    c = Config.from_env(env(FASTCOLL_TRANSPORT="tcp", FASTCOLL_RDMA_DEVICES="not json"))
    assert c.rdma_devices is None


def test_a_missing_library_is_one_line_naming_it():
    with pytest.raises(OSError) as e:
        rdma.list_devices("/nonexistent/libverbs-of-nobody.so")
    text = str(e.value)
    assert "\n" not in text and text.startswith("cannot load the verbs library /nonexistent/libverbs-of-nobody.so")
    assert "FASTCOLL_VERBS_LIB" in text


# --- the ranks' agreement at the rendezvous -------------------------------------------------------


def offer(peers: list[bool], reliable: bool = False, problem: str | None = None) -> dict:
    return {"rdma": {"peers": peers, "reliable": reliable, "problem": problem}}


def setup(rank: int, devices: str, connections: int = 1) -> rdma.Setup:
    return rdma.Setup(Config.from_env(env(FASTCOLL_RANK=str(rank), FASTCOLL_RDMA_DEVICES=devices,
                                          FASTCOLL_CONNECTIONS=str(connections))), verbs_problem())


HOSTS = ["mac1", "mac2", "mac3"]


def test_the_plan_gives_each_connection_its_device():
    s = setup(0, '[null, "rdma_en3", ["rdma_en4", "rdma_en5"]]', connections=3)
    caps = [offer([False, True, True]), offer([True, False, False]), offer([True, False, False])]
    assert s.plan(caps, HOSTS) == {1: ["rdma_en3"] * 3, 2: ["rdma_en4", "rdma_en5", "rdma_en4"]}


def test_a_rank_that_cannot_run_rdma_stops_every_rank_naming_it():
    s = setup(0, '[null, "rdma_en3", "rdma_en4"]')
    caps = [offer([False, True, True]), offer([True, False, True], problem="no RDMA device rdma_en9 here"),
            offer([True, True, False], problem="no RDMA device rdma_en9 here")]
    with pytest.raises(FastcollError) as e:
        s.plan(caps, HOSTS)
    assert str(e.value) == "RDMA cannot run on ranks 1 (mac2), 2 (mac3): no RDMA device rdma_en9 here"


def test_a_pair_that_disagrees_is_a_mismatch_naming_both():
    s = setup(0, '[null, "rdma_en3", null]')
    caps = [offer([False, True, False]), offer([True, False, True]), offer([False, False, False])]
    with pytest.raises(MismatchError, match="rank 1 names an RDMA device toward rank 2, and rank 2 none toward rank 1"):
        s.plan(caps, HOSTS)


def test_reliability_must_be_agreed():
    s = setup(0, '[null, "rdma_en3", "rdma_en4"]')
    caps = [offer([False, True, True]), offer([True, False, True], reliable=True), offer([True, True, False])]
    with pytest.raises(MismatchError, match="FASTCOLL_RDMA_RELIABLE"):
        s.plan(caps, HOSTS)


def test_a_malformed_capability_is_refused():
    s = setup(0, '[null, "rdma_en3", "rdma_en4"]')
    caps = [offer([False, True, True]), {"rdma": {"peers": "all"}}, offer([True, True, False])]
    with pytest.raises(FastcollError, match="rank 1's rendezvous entry has no valid `rdma`"):
        s.plan(caps, HOSTS)


# --- MLX hostfiles ----------------------------------------------------------------------------------

JACCL = {"backend": "jaccl", "envs": [], "hosts": [
    {"ssh": "mac1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3", ["rdma_en4", "rdma_en5"]]},
    {"ssh": "mac2", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", None, "rdma_en5"]},
    {"ssh": "mac3", "ips": ["10.0.0.3"], "slots": 2, "rdma": ["rdma_en4", "rdma_en5", None]},
]}


def planned(hostfile: dict, environ: dict | None = None) -> list[dict]:
    plan = plan_job(parse_hostfile_text(json.dumps(hostfile)), ["python", "x.py"], environ=environ or {},
                    remote_port=lambda host: 4242)
    return [dict(r.env) for r in plan.ranks]


def test_an_mlx_hostfile_gives_each_rank_its_devices():
    ranks = planned(JACCL)
    assert [r["FASTCOLL_TRANSPORT"] for r in ranks] == ["rdma"] * 4
    devices = [json.loads(r["FASTCOLL_RDMA_DEVICES"]) for r in ranks]
    # rank 3 shares mac3 with rank 2: null toward it (shared memory), mac3's list toward the others
    assert devices == [[None, "rdma_en3", ["rdma_en4", "rdma_en5"], ["rdma_en4", "rdma_en5"]],
                       ["rdma_en3", None, "rdma_en5", "rdma_en5"],
                       ["rdma_en4", "rdma_en5", None, None],
                       ["rdma_en4", "rdma_en5", None, None]]
    for r in ranks:  # what init() reads of them is valid
        Config.from_env({**r, "FASTCOLL_COORDINATOR": "127.0.0.1:1"})


def test_the_users_own_settings_win_over_the_hostfile():
    ranks = planned(JACCL, {"FASTCOLL_TRANSPORT": "tcp"})
    assert {r["FASTCOLL_TRANSPORT"] for r in ranks} == {"tcp"}
    no_devices = {**JACCL, "hosts": [{**h, "rdma": None} for h in JACCL["hosts"]]}
    assert all("FASTCOLL_RDMA_DEVICES" not in r and "FASTCOLL_TRANSPORT" not in r for r in planned(no_devices))


def test_the_launcher_refuses_bad_rdma_devices_in_one_line(tmp_path):
    # As every bad FASTCOLL_* value: init()'s own words, before any rank starts (exit code 2).
    code, out, err = run_session([sys.executable, "-m", "fastcoll.launch", "-n", "2", "--env", "FASTCOLL_TRANSPORT=rdma",
                                  "--env", 'FASTCOLL_RDMA_DEVICES=[null, "rdma en3"]', sys.executable, "-c", "pass"],
                                 jobless_env(), 60, cwd=str(tmp_path))
    assert code == 2 and out == "", out + err
    assert err == ('fastcoll-launch: FASTCOLL_RDMA_DEVICES: entry 1 must be null, a device name or a list of device '
                   'names (letters, digits, _ . : -), not "rdma en3"\n'), err


def test_the_check_pairs_every_cable_of_the_lists():
    hosts = parse_hostfile_text(json.dumps(JACCL)).hosts
    pairs = [(p.a.name, p.b.name, p.device_a, p.device_b) for p in rdma_pairs(hosts)]
    assert pairs == [("mac1", "mac2", "rdma_en3", "rdma_en3"), ("mac1", "mac3", "rdma_en4", "rdma_en4"),
                     ("mac1", "mac3", "rdma_en5", "rdma_en4"), ("mac2", "mac3", "rdma_en5", "rdma_en5")]


# --- the pure-Python engine --------------------------------------------------------------------------


def rank_lines(results) -> list[dict]:
    out = []
    for r in results:
        said = {}
        for line in r.out.splitlines():
            key, _, rest = line.partition(" ")
            said[key] = rest
        out.append(said)
    return out


@pytest.mark.parametrize("python_ranks", [[0, 1], [1]])
def test_the_python_engine_refuses_rdma_on_every_rank(launch, request, python_ranks):
    # Every rank on the Python engine needs no verbs library (the refusal comes before any is
    # looked for); rank 0 on the native engine uses the fabric's.
    lib = {"FASTCOLL_VERBS_LIB": request.getfixturevalue("fabric")} if len(python_ranks) < 2 else {}
    job = launch(2, "rdma_worker.py", "info", transport="tcp", FASTCOLL_TRANSPORT="rdma", timeout="20", **lib,
                 per_rank_env=lambda r: {"FASTCOLL_NATIVE": "0" if r in python_ranks else "1"})
    results = job.wait(timeout=60)
    for r, said in zip(results, rank_lines(results)):
        assert r.code == 3 and said.get("ERROR", "").startswith("FastcollError"), r.out + r.err
        assert said["MESSAGE"].startswith(f"RDMA cannot run on rank{'s' if len(python_ranks) > 1 else ''} "
                                          f"{python_ranks[0]} ("), said
        assert "needs the native engine, and FASTCOLL_NATIVE=0 asks for the pure-Python one" in said["MESSAGE"]
        assert float(said["ERROR"].split()[1]) < 15, said  # at once, not a timeout


# --- over the fabric -----------------------------------------------------------------------------------


def digests(results) -> list[str]:
    out = []
    for r in results:
        m = re.search(r"checks passed; results sha256 ([0-9a-f]{64})", r.out)
        assert m, r.out + r.err[-3000:]
        out.append(m.group(1))
    return out


@pytest.fixture(scope="session")
def fabric(fabric_jobs: str) -> str:
    return fabric_jobs


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_and_dtype_exact_against_tcp(launch, fabric, world):
    over_tcp = launch(world, "collectives_worker.py", transport="tcp").wait(timeout=300)
    assert_ok(over_tcp)
    over_rdma = launch(world, "collectives_worker.py", transport="rdma").wait(timeout=300)
    assert_ok(over_rdma)
    assert digests(over_rdma) == digests(over_tcp)


@pytest.mark.parametrize("reliable", ["0", "1"])
def test_transport_info_names_the_rdma_links(launch, fabric, reliable):
    results = launch(3, "rdma_worker.py", "info", transport="rdma", FASTCOLL_RDMA_RELIABLE=reliable,
                     per_rank_env=lambda r: {"FASTCOLL_RDMA_DEVICES": json.dumps(
                         [None if p == r else f"fcfab{r}" for p in range(3)])}).wait(timeout=60)
    assert_ok(results)
    mode = "RC" if reliable == "1" else "UC"
    for r, said in zip(results, rank_lines(results)):
        assert said["INFO"] == f"rdma (verbs: fcfab{r.rank}, {mode}, MTU 1024) on 2 of 2 connections; native engine", said


def test_rdma_beside_shared_memory(launch, fabric):
    # Ranks 0 and 1 over a verbs link; rank 2 reaches both over shared memory (null entries).
    lists = {0: [None, "fcfab0", None], 1: ["fcfab1", None, None], 2: [None, None, None]}
    results = launch(3, "rdma_worker.py", "stream", "20", "70000", transport="rdma", FASTCOLL_SHM="1",
                     per_rank_env=lambda r: {"FASTCOLL_RDMA_DEVICES": json.dumps(lists[r])}).wait(timeout=60)
    assert_ok(results)
    said = rank_lines(results)
    assert said[0]["INFO"] == ("tcp, shared memory on 1 of 2 connections, rdma (verbs: fcfab0, UC, MTU 1024) on 1 of 2 "
                               "connections; native engine")
    assert said[2]["INFO"] == "tcp, shared memory on 2 of 2 connections; native engine"


def fault_job(launch, world: int, victim: int, fault: str, calls: int = 400, size: int = 1024):
    job = launch(world, "rdma_worker.py", "stream", str(calls), str(size), transport="rdma", timeout=str(TIMEOUT),
                 per_rank_env=lambda r: {"FCFAB_FAULT": fault} if r == victim else {})
    return job.wait(timeout=TIMEOUT + 60)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("fault", ["drop:100", "dup:100"])
def test_a_lost_or_duplicated_frame_fails_every_rank_naming_the_peer(launch, fabric, world, fault):
    victim = world - 1
    results = fault_job(launch, world, victim, fault)
    detail = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.out}\n{r.err[-2000:]}" for r in results)
    for r, said in zip(results, rank_lines(results)):
        assert r.code == 3 and "ERROR" in said, f"rank {r.rank}\n{detail}"
        assert float(said["ERROR"].split()[1]) < TIMEOUT + 15, detail  # start-up, then at most the timeout
        if r.rank != victim:
            assert f"rank {victim}" in said["MESSAGE"], f"rank {r.rank} does not name rank {victim}\n{detail}"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_killed_peer_fails_every_rank_naming_it(launch, fabric, world):
    job = launch(world, "fault_worker.py", "kill-during", "0", str(1 << 20), transport="rdma", timeout=str(TIMEOUT))
    results = job.wait(timeout=TIMEOUT + 60)
    detail = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.out}\n{r.err[-2000:]}" for r in results)
    assert results[0].code == -signal.SIGKILL, detail
    for r in results[1:]:
        err = next((line.split() for line in r.out.splitlines() if line.startswith("ERROR")), None)
        assert r.code == 3 and err and err[1] == "PeerLostError", f"rank {r.rank}\n{detail}"
        assert float(err[2]) < TIMEOUT, detail
        assert "rank 0" in r.out, detail


@pytest.mark.parametrize("scenario", ["setup-die", "setup-sleep"])
def test_a_verbs_set_up_cut_short_is_the_peers_error_or_a_timeout(launch, fabric, scenario):
    # setup-die: rank 1 of 3 dies where the verbs links' set-up begins, so ranks 0 and 2 wait in
    # it for rank 1; setup-sleep: rank 0 gets there only once its init() deadline has passed.
    # Neither is a fault of this rank's library or device: the others raise the error the TCP
    # transport raises there (the peer lost, or a timeout), within the timeout.
    timeout = 1.0
    job = launch(3, "hardening_worker.py", scenario, "setup-done", transport="rdma", timeout=str(timeout))
    results = job.wait(timeout + 30)
    detail = "\n".join(f"--- rank {r.rank} exit {r.code}\n{r.out}\n{r.err[-2000:]}" for r in results)
    for r, said in zip(results, rank_lines(results)):
        if scenario == "setup-die" and r.rank == 1:
            assert r.code == -signal.SIGKILL, detail
            continue
        cls, elapsed = said.get("ERROR", "? 0").split()[:2]
        assert r.code == 3 and cls in ("PeerLostError", "CollectiveTimeoutError"), f"rank {r.rank}\n{detail}"
        assert float(elapsed) < timeout + 2.0, f"rank {r.rank}\n{detail}"


def test_the_harness_runs_the_suites_default_jobs_over_rdma(fabric):
    # FASTCOLL_TEST_TRANSPORT=rdma (CI's "over the RDMA test fabric" step): the default ("shm")
    # jobs of the native engine run over the fabric; the pure-Python engine's stay on shm.
    code = ("import conftest; e = conftest.rank_env(0, 2, 1); p = conftest.rank_env(0, 2, 1, FASTCOLL_NATIVE='0');"
            " print(e['FASTCOLL_TRANSPORT'], e['FASTCOLL_VERBS_LIB'], p['FASTCOLL_TRANSPORT'], p['FASTCOLL_SHM'])")
    status, out, err = run_session([sys.executable, "-c", code], {**jobless_env(), "FASTCOLL_TEST_TRANSPORT": "rdma"},
                                   60, cwd=os.path.join(ROOT, "tests"))
    assert status == 0 and out.split() == ["rdma", fabric, "tcp", "1"], out + err


def leaked(report: str) -> list[str]:
    """The fabric's reports (FCFAB_REPORT.<pid>) whose counts of resources left open are not all 0."""
    bad = []
    for path in glob.glob(report + ".*"):
        with open(path) as f:
            line = f.read().strip()
        counts = [int(v) for v in line.split()[2::2]]
        if any(counts):
            bad.append(line)
    return bad


@pytest.mark.parametrize("ops", [300, 10_000])
def test_soak_exact_flat_memory_and_nothing_left_registered(launch, fabric, tmp_path, ops):
    report = str(tmp_path / "fcfab")
    job = launch(3, "soak_worker.py", str(ops), "20240611", transport="rdma", timeout="30", FCFAB_REPORT=report)
    results = job.wait(timeout=120 + ops * 0.1)
    assert_ok(results)
    for r in results:
        line = next(x for x in r.out.splitlines() if x.startswith("SOAK"))
        rss = [int(v) for v in line.split()[4].split(",")]
        print(f"\nrdma rank {r.rank}: {ops} ops; RSS KiB {rss}")
        if os.environ.get("FASTCOLL_TEST_SANITIZED") != "1" and ops >= 3000:  # a short run has no steady state
            assert max(rss[1:]) - rss[1] < 16 * 1024, f"rank {r.rank}: RSS grew: {rss}"
    assert len(glob.glob(report + ".*")) == 3, os.listdir(tmp_path)
    assert leaked(report) == []


# --- as users start jobs: fastcoll-launch with an MLX hostfile --------------------------------------


def jaccl_hostfile(tmp_path, devices: list[list[str | None]], names: list[str] | None = None) -> str:
    names = names or ["localhost"] * len(devices)
    hosts = [{"ssh": n, "ips": ["127.0.0.1"], "rdma": d} for n, d in zip(names, devices)]
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"backend": "jaccl", "envs": [], "hosts": hosts}, indent=2))
    return str(path)


def launcher(args: list[str], fabric: str, timeout: float = 150, **extra: str) -> tuple[int, str, str]:
    env = {**jobless_env(), "FASTCOLL_VERBS_LIB": fabric, **extra}
    return run_session([sys.executable, "-m", "fastcoll.launch", *args], env, timeout, cwd=ROOT)


MESH3 = [[None, "fcfab0", "fcfab1"], ["fcfab0", None, "fcfab1"], ["fcfab0", "fcfab1", None]]


def test_an_mlx_hostfile_runs_the_quick_start_example_over_rdma(fabric, tmp_path):
    hostfile = jaccl_hostfile(tmp_path, MESH3)
    code, out, err = launcher(["--hostfile", hostfile, "--timeout", "140", sys.executable,
                               os.path.join(ROOT, "examples", "allreduce.py")], fabric)
    assert code == 0, out + err[-3000:]
    for r in range(3):
        assert f"rank {r}/3: all_reduce(sum) of 4 KiB float32 gave 6 everywhere" in out, out
        assert (f"rank {r}/3: transport rdma (verbs: fcfab0, UC, MTU 1024; fcfab1, UC, MTU 1024) on 2 of 2 "
                "connections; native engine: 4 KiB all_reduce median") in out, out


def test_an_mlx_hostfile_runs_an_mx_distributed_program_unchanged(fabric, tmp_path):
    hostfile = jaccl_hostfile(tmp_path, [[None, "fcfab2"], ["fcfab3", None]])
    code, out, err = launcher(["--hostfile", hostfile, "--timeout", "80", sys.executable, "-m", "fastcoll.mlx_compat",
                               os.path.join(PROGS, "compat_plain.py")], fabric, FASTCOLL_LOG="info")
    assert code == 0, out + err[-3000:]
    from fastcoll.mlx_compat import graph

    # Graph mode, the default, where its library was built (rdma runs the native engine): MLX's own group.
    via = "mlx.core.distributed" if graph.library() is not None else "fastcoll.mlx_compat"
    for r in range(2):
        assert f"plain rank {r} of 2: sum 3 via {via}" in out, out
        assert re.search(rf"rank {r} of 2 joined: rdma \(verbs: fcfab[23], UC, MTU 1024\) on 1 of 1 connections", err), err


def one_line_errors(out: str) -> set[str]:
    return {line.split("] ", 1)[-1] for line in out.splitlines() if "RDMA cannot run" in line}


@pytest.mark.parametrize("what", ["library", "device"])
def test_a_missing_library_or_device_is_one_line_at_init(fabric, tmp_path, what):
    devices = [[None, "fcfab1"], ["fcfab9" if what == "device" else "fcfab0", None]]
    extra = {"FASTCOLL_VERBS_LIB": "/nonexistent/libibverbs.so.1"} if what == "library" else {}
    hostfile = jaccl_hostfile(tmp_path, devices)
    code, out, err = launcher(["--hostfile", hostfile, "--timeout", "60", sys.executable,
                               os.path.join(PROGS, "rdma_worker.py"), "info"], fabric, timeout=90, **extra)
    assert code == 3, out + err
    lines = one_line_errors(out)
    assert len(lines) == 1, out  # the same line on both ranks
    line = lines.pop()
    if what == "library":
        assert "RDMA cannot run on ranks 0 (" in line and "cannot load the verbs library /nonexistent/libibverbs.so.1" in line
    else:
        assert re.search(r"RDMA cannot run on rank 1 \(\S+\): no RDMA device fcfab9 here \(the verbs library \S+ "
                         r"lists fcfab0, fcfab1, fcfab2, fcfab3\)", line), line


def test_check_opens_every_rdma_link(fabric, tmp_path):
    # Two "hosts", both this machine by other names: each one's agent serves its end of the link.
    hostfile = jaccl_hostfile(tmp_path, [[None, "fcfab0"], ["fcfab1", None]], names=["localhost", "127.0.0.1"])
    code, out, err = launcher(["--check", "--hostfile", hostfile], fabric, timeout=120)
    assert code == 0, out + err[-3000:]
    assert re.search(r"^127\.0\.0\.1 -> localhost\s+fcfab1 -> fcfab0\s+ok\s+[\d.]+ us\s+[\d.]+ GB/s$", out, re.M), out
    assert "all hosts ok" in out


def test_check_reports_a_missing_device_in_one_line(fabric, tmp_path):
    hostfile = jaccl_hostfile(tmp_path, [[None, "fcfab0"], ["fcfab7", None]], names=["localhost", "127.0.0.1"])
    code, out, err = launcher(["--check", "--hostfile", hostfile], fabric, timeout=120)
    assert code == 1, out + err[-3000:]
    assert re.search(r"^127\.0\.0\.1 .*FAIL: RDMA: no RDMA device fcfab7 here \(the verbs library \S+ lists "
                     r"fcfab0, fcfab1, fcfab2, fcfab3\)$", out, re.M), out
    assert re.search(r"^127\.0\.0\.1 -> localhost\s+fcfab7 -> fcfab0\s+FAIL: not tried: see the hosts' table", out, re.M), out
    assert "some hosts FAILED the check" in out
