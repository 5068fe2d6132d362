"""fastcoll-launch and fastcoll across real (namespaced) hosts: tests/netns.py builds 4 hosts,
each a network namespace with its own hostname and sshd, two data links and a management link
into a switch namespace; the launcher runs in a namespace of its own and reaches the hosts over
ssh, as it would reach Macs. Skipped, saying why, where namespaces cannot be made (not root, no
iproute2, no sshd).

The failure tests assert that every rank ends with CollectiveTimeoutError or PeerLostError, or
is stopped by the launcher, within a bound; that every timeout names the rank and host that
stopped answering (not the rank's own neighbour); that the launcher exits non-zero within a
bound; that nothing of the job is left running; and that a host the launcher lost contact with
is named with its ranks within a few seconds, and no other fault is taken for a lost host. They
print what each rank and the launcher said (`-s` shows it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join("tests", "progs", "multihost_worker.py")
TIMEOUT = 3  # FASTCOLL_TIMEOUT of the failure tests, seconds
TRANSPORTS = {
    "tcp": {"FASTCOLL_TRANSPORT": "tcp", "FASTCOLL_SHM": "0"},
    "shm": {"FASTCOLL_TRANSPORT": "tcp", "FASTCOLL_SHM": "1"},
    "zmq": {"FASTCOLL_TRANSPORT": "zmq"},
}
_count = itertools.count()


@pytest.fixture(scope="module")
def bed():
    """Four hosts with two data links each, for the whole module; gone afterwards, whatever
    happened (the bed also tears itself down at interpreter exit, and the next run removes a
    killed run's leftovers)."""
    try:
        b = netns.TestBed(hosts=4, data_links=2).build()
    except netns.Unavailable as e:
        pytest.skip(f"multi-host test bed unavailable: {e}")
    try:
        yield b
    finally:
        b.teardown()


@pytest.fixture
def net(bed):
    """The bed, healed and emptied of the test's processes after each test."""
    try:
        yield bed
    finally:
        bed.heal()
        bed.kill_strays()


class Job:
    """One launcher run of the worker; `reports()` reads what each rank wrote."""

    def __init__(self, bed: netns.TestBed, hosts, mode: str, *args: str, slots: int = 1,
                 links: int = 1, env: dict | None = None, fmt: str = "mpirun",
                 launcher_args: tuple = (), rdma: str | None = None) -> None:
        self.bed = bed
        self.size = len(hosts) * slots
        self.outdir = str(bed.root / f"job{next(_count)}")
        os.mkdir(self.outdir)
        self.hostfile = bed.hostfile(hosts, slots=slots, links=links, fmt=fmt, rdma=rdma)
        # Under the sanitizers, the ranks get ASan's runtime as the launcher has it (sshd does not).
        sanitized = [a for k in netns.SANITIZER_VARIABLES if k in os.environ for a in ("--env", f"{k}={os.environ[k]}")]
        self.run = bed.start_launcher(
            ["-v", "--hostfile", self.hostfile, "--env", f"PYTHONPATH={REPO}", *sanitized, *launcher_args,
             "python", WORKER, self.outdir, mode, *args],
            env=bed.launcher_env(**(env or {})), cwd=REPO)

    def wait(self, timeout: float = 60.0) -> int | None:
        return self.run.wait(timeout)

    def reports(self, wait: float = 0.0) -> dict[int, dict]:
        """rank -> its report; waits up to `wait` s for every rank's final one."""
        deadline = time.monotonic() + wait
        while True:
            found = {}
            for p in Path(self.outdir).glob("rank*.json"):
                try:
                    r = json.loads(p.read_text())
                except (OSError, ValueError):
                    continue
                found[r["rank"]] = r
            done = len(found) == self.size and all("outcome" in r for r in found.values())
            if done or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def describe(self) -> str:
        ranks = "\n".join(f"rank {k}: {json.dumps(v)[:1500]}"
                          for k, v in sorted(self.reports().items()))
        return (f"launcher stdout:\n{self.run.out[-3000:]}\n"
                f"launcher stderr:\n{self.run.err[-3000:]}\nrank reports:\n{ranks}")

    def leftovers(self, wait: float) -> list:
        """Ranks of this job (their argv names its folder) and launcher agents still alive."""
        deadline = time.monotonic() + wait
        while True:
            left = [(p, c) for p, c in ((p, netns.cmdline(p)) for p in netns.all_pids())
                    if self.outdir in c]
            left += [(p, c) for procs in self.bed.processes().values() for p, c in procs
                     if "fastcoll-agent" in c]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)


def assert_all_ok(job: Job, code, hosts, slots: int = 1) -> dict[int, dict]:
    assert code == 0, job.describe()
    reports = job.reports(wait=2)
    assert sorted(reports) == list(range(job.size)), job.describe()
    for rank, r in reports.items():
        host = hosts[rank // slots]
        assert r["outcome"] == "ok", f"rank {rank}: {r.get('error')}: {r.get('message')}\n" \
            f"{r.get('traceback', '')}\n{job.describe()}"
        assert r["hostname"] == f"host{host}", r
        assert r["local_rank"] == str(rank % slots), r
        assert r["checks"] > 0, r
    assert job.leftovers(wait=5) == []
    assert "warning:" not in job.run.err, job.run.err  # data on the data links, as listed
    return reports


# ----------------------------------------------------------------------------- collectives


@pytest.mark.parametrize("transport", ["tcp", "shm", "zmq"])
@pytest.mark.parametrize("hosts", [(1, 2), (1, 2, 3, 4)], ids=["2hosts", "4hosts"])
def test_every_collective_across_hosts(net, hosts, transport):
    job = Job(net, hosts, "collectives", env={**TRANSPORTS[transport], "FASTCOLL_TIMEOUT": "20"},
              fmt="json" if len(hosts) == 4 else "mpirun")
    reports = assert_all_ok(job, job.wait(90), hosts)
    for rank, r in reports.items():
        # One rank per host: nothing is shared memory, even with FASTCOLL_SHM=1.
        assert r["transport"].split("; ")[0] == ("zmq" if transport == "zmq" else "tcp"), r
        assert r["interface"] == net.host(hosts[rank]).data[0], r
    # Two ranks always go direct; at four hosts, where doubling would cross the network twice,
    # init() timed both on these links (tests/test_doubling_probe.py decides it on purpose): every
    # rank runs the one it agreed on.
    small = {r["small"] for r in reports.values()}
    assert len(small) == 1 and small <= ({"direct"} if len(hosts) == 2 else {"direct", "doubling"}), reports


# ----------------------------------------------------------------------------- RDMA (the test fabric)


@pytest.fixture
def fabric_env(fabric_jobs):
    """What the launcher needs to run an MLX hostfile's `rdma` lists on the test fabric (a verbs
    provider over this machine's shared memory, which every namespaced host sees): the library.
    The hostfile's lists make each rank's FASTCOLL_TRANSPORT=rdma and FASTCOLL_RDMA_DEVICES."""
    return {"FASTCOLL_VERBS_LIB": fabric_jobs}


@pytest.mark.parametrize("hosts", [(1, 2), (1, 2, 3, 4)], ids=["2hosts", "4hosts"])
def test_every_collective_across_hosts_over_rdma(net, hosts, fabric_env):
    job = Job(net, hosts, "collectives", env={**fabric_env, "FASTCOLL_TIMEOUT": "20"}, fmt="json", rdma="fcfab0")
    reports = assert_all_ok(job, job.wait(120), hosts)
    for rank, r in reports.items():
        # Every peer on another host: every connection a verbs link, its socket on the data link.
        assert r["transport"].startswith("rdma (verbs: fcfab0, UC"), r
        assert f"on {len(hosts) - 1} of {len(hosts) - 1} connections" in r["transport"], r
        assert r["interface"] == net.host(hosts[rank]).data[0], r


def test_check_opens_every_rdma_link_across_hosts(net, fabric_env):
    hf = net.hostfile((1, 2, 3), fmt="json", rdma="fcfab0")
    code, run = net.launch(["--check", "--hostfile", hf, "--env", f"PYTHONPATH={REPO}"],
                           env=net.launcher_env(**fabric_env), cwd=REPO, timeout=90)
    print("\n" + run.out)
    assert code == 0, run.out + run.err
    # Every pair once (the RDMA links' table): opened across the hosts' namespaces, measured.
    for a, b in itertools.combinations(net.hosts[:3], 2):
        assert re.search(rf"^{b.name} -> {a.name}\s+fcfab0 -> fcfab0\s+ok\s+[\d.]+ us\s+[\d.]+ GB/s$",
                         run.out, re.M), run.out
    assert "all hosts ok" in run.out


def test_a_rank_killed_over_rdma_ends_the_job_naming_its_host(net, fabric_env):
    # Over verbs a dead peer gives UC no error: its socket's end, beside the queue pair, is how
    # the others learn it, on another host as on this one.
    hosts = (1, 2, 3)
    job = Job(net, hosts, "loop", "4096", env={**fabric_env, "FASTCOLL_TIMEOUT": str(TIMEOUT)}, fmt="json",
              rdma="fcfab0", launcher_args=("--grace", "1", "--timeout", "60"))
    assert job.run.wait_for("ready", len(hosts), timeout=60), job.describe()
    time.sleep(0.3)
    t_fault = time.time()
    os.kill(job.reports()[2]["pid"], signal.SIGKILL)  # the hosts' namespaces share our PIDs
    code = job.wait(60)
    reports = job.reports(wait=3 * TIMEOUT)
    print(f"\nrank 2 (host3) killed: launcher exit {code} after {job.run.ended - t_fault:.1f} s\n"
          + "\n".join(f"  rank {k}: {r.get('outcome')} {r.get('error')}: {r.get('message')}" for k, r in sorted(reports.items())))
    assert code is not None and code != 0, job.describe()
    assert job.run.ended - t_fault < TIMEOUT + 5, job.describe()
    errors = [r for k, r in reports.items() if k != 2 and r.get("outcome") == "error"]
    assert errors, job.describe()
    for r in errors:
        assert r["error"] in ERRORS and "host3" in r["message"], job.describe()
        assert r["t_end"] - t_fault < 4 * TIMEOUT, r
    assert job.leftovers(wait=3 * TIMEOUT) == []


@pytest.mark.parametrize("shm", ["1", "0"])
def test_two_ranks_per_host_share_memory_with_each_other_only(net, shm):
    hosts = (1, 2)
    job = Job(net, hosts, "collectives", slots=2,
              env={"FASTCOLL_SHM": shm, "FASTCOLL_TIMEOUT": "20"})
    reports = assert_all_ok(job, job.wait(90), hosts, slots=2)
    for rank, r in reports.items():
        # Three peers each: the one on the same host over shared memory, the two others on TCP.
        want = "tcp, shared memory on 1 of 3 connections" if shm == "1" else "tcp"
        assert r["transport"].split("; ")[0] == want, (rank, r)
        # Recursive doubling's first step stays on the host, its second crosses once: it stays.
        assert r["small"] == "doubling", (rank, r)


@pytest.mark.parametrize("hosts", [(1, 2), (1, 2, 3, 4)], ids=["2hosts", "4hosts"])
def test_two_data_links_carry_a_large_all_reduce(net, hosts):
    mb = 32
    before = {(h, k): net.link_bytes(h, k)[0] for h in hosts for k in range(2)}
    job = Job(net, hosts, "big", str(mb), links=2, env={"FASTCOLL_TIMEOUT": "30"})
    reports = assert_all_ok(job, job.wait(90), hosts)
    sent = {hk: net.link_bytes(*hk)[0] - b for hk, b in before.items()}
    n = len(hosts)
    # A ring all-reduce sends 2 (n-1)/n of the message from every rank; striped over two
    # connections (one per link), each link should carry about half of it.
    per_link = 2 * (n - 1) / n * mb * 2**20 / 2
    detail = {f"host{h} d{k}": f"{v / 2**20:.1f} MiB" for (h, k), v in sent.items()}
    print(f"\n{n} hosts, {mb} MB all_reduce over 2 links: sent per link {detail}; "
          f"all_reduce took {max(r['seconds'] for r in reports.values()):.3f} s")
    for hk, v in sent.items():
        assert v > 0.3 * per_link, (hk, detail)


# ----------------------------------------------------------------------------- --check


def test_check_across_four_hosts(net):
    hf = net.hostfile((1, 2, 3, 4), links=2)
    code, run = net.launch(["--check", "--hostfile", hf, "--env", f"PYTHONPATH={REPO}"],
                           cwd=REPO, timeout=60)
    text = run.out
    print("\n" + text)
    assert code == 0, text + run.err
    for h in net.hosts:
        assert re.search(rf"^{h.name}\s+ok\s+\d+\.\d+\.\d+\s+\S+.*\bok$", text, re.M), text
        for o in net.hosts:
            if o is not h:
                for k, addr in enumerate(o.data):
                    # Every pair and address: a measured round trip and throughput.
                    m = re.search(rf"^{h.name} -> {o.name} {re.escape(addr)}:\d+\s+data {k}\s+ok"
                                  rf"\s+([\d.]+) ms\s+([\d.]+) GB/s$", text, re.M)
                    assert m, text
                    rtt_ms, gbs = float(m.group(1)), float(m.group(2))
                    assert 0 < rtt_ms < 50 and 0.01 < gbs < 100, m.group(0)
    assert "all hosts ok" in text and "warning" not in text


def test_check_names_a_cut_data_link(net):
    hf = net.hostfile((1, 2, 3, 4))
    net.cut(3)
    t = time.monotonic()
    code, run = net.launch(["--check", "--hostfile", hf, "--env", f"PYTHONPATH={REPO}"],
                           cwd=REPO, timeout=60)
    took = time.monotonic() - t
    text = run.out
    print(f"\n--check with host3's data link cut: exit {code} after {took:.1f} s\n{text}")
    assert code == 1, text + run.err
    assert re.search(r"^host3\s+ok\s.*FAIL: cannot reach host1, host2, host4", text, re.M), text
    assert re.search(r"^host1 -> host3 10\.202\.0\.3:\d+\s+data 0\s+FAIL", text, re.M), text
    assert re.search(r"^host1 -> host2 10\.202\.0\.2:\d+\s+data 0\s+ok\s+[\d.]+ ms", text,
                     re.M), text
    assert "some hosts FAILED" in text
    assert took < 20


# ----------------------------------------------------------------------------- failures


def _victims(hosts):
    """The host the fault hits, and the host a one-way drop cuts it off from."""
    v = hosts[-1] if len(hosts) == 2 else hosts[2]
    return v, hosts[(hosts.index(v) + 1) % len(hosts)]


FAULTS = {
    "cut_data_link": lambda bed, v, to: bed.cut(v),
    "one_way_drop": lambda bed, v, to: bed.drop_one_way(v, to),
    "vanished_host": lambda bed, v, to: bed.vanish(v),
    "cut_second_link": lambda bed, v, to: bed.cut(v, link=1),
}
# What a rank may end with today: its own error, or the launcher's SIGTERM (it stops every
# rank as soon as the first one exits non-zero, and a rank still waiting for its timeout when
# that arrives never raises).
ERRORS = {"CollectiveTimeoutError", "PeerLostError"}


@pytest.mark.parametrize("fault", ["cut_data_link", "one_way_drop", "vanished_host"])
@pytest.mark.parametrize("hosts", [(1, 2), (1, 2, 3, 4)], ids=["2hosts", "4hosts"])
def test_network_failure_ends_the_job(net, hosts, fault):
    _failure(net, hosts, fault)


def test_one_of_two_data_links_cut_ends_a_striped_job(net):
    # Connection k of every pair runs over link k; a large all-reduce is striped over both,
    # so it waits on the dead one. (Small messages go over connection 0 alone: a job of small
    # collectives does not notice that link 1 is gone.)
    _failure(net, (1, 2), "cut_second_link", links=2, floats=2 << 20)


def _failure(net, hosts, fault, links: int = 1, floats: int = 4096) -> None:
    victim, other = _victims(hosts)
    job = Job(net, hosts, "loop", str(floats), links=links,
              env={"FASTCOLL_TIMEOUT": str(TIMEOUT)},
              launcher_args=("--grace", "1", "--timeout", "60"))
    assert job.run.wait_for("ready", len(hosts), timeout=30), job.describe()
    time.sleep(0.3)  # every rank well inside its loop
    t_fault = time.time()
    FAULTS[fault](net, victim, other)
    code = job.wait(60)
    launcher_took = job.run.ended - t_fault
    reports = job.reports(wait=3 * TIMEOUT)
    left = job.leftovers(wait=3 * TIMEOUT)
    what = {"cut_data_link": f"host{victim}'s data link cut",
            "one_way_drop": f"host{victim} -> host{other} packets dropped",
            "vanished_host": f"host{victim} vanished",
            "cut_second_link": f"host{victim}'s second of two data links cut"}[fault]
    lines = [f"\n=== {len(hosts)} hosts, {what}: launcher exit {code} after {launcher_took:.1f} s"]
    for rank in sorted(reports):
        r = reports[rank]
        at = r.get("t_end", float("nan")) - t_fault
        lines.append(f"  rank {rank} ({r['hostname']}): {r.get('outcome')} at +{at:.1f} s: "
                     f"{r.get('error', '')}: {r.get('message') or ''}")
    lines += [f"  launcher at +{at - t_fault:.1f} s: {t}" for at, s, t in job.run.lines
              if at > t_fault and (s == "err" or not t.startswith("["))]
    lines += [f"  still running in {name}: {c[:80]}" for name, procs in net.processes().items()
              for _, c in procs]
    dropped = net.dropped(victim) if fault == "one_way_drop" else None
    if dropped is not None:
        lines.append(f"  packets dropped host{victim} -> host{other}: {dropped}")
    print("\n".join(lines))

    assert code is not None and code != 0, job.describe()
    assert launcher_took < 20, "\n".join(lines)
    assert sorted(reports) == list(range(len(hosts))), "\n".join(lines)
    errors = 0
    for rank, r in reports.items():
        assert r.get("outcome") in ("error", "terminated"), (rank, r, "\n".join(lines))
        if r["outcome"] == "error":
            errors += 1
            assert r["error"] in ERRORS, (rank, r)
        assert r["t_end"] - t_fault < 4 * TIMEOUT, (rank, r)
    assert errors >= 1, "\n".join(lines)
    # Every rank's timeout names the host that failed, not its own neighbour: the ranks that
    # can still talk compared whom they wait for (fastcoll/diagnosis.py). With two hosts a rank
    # cannot tell its own link from its peer's, so it names the peer; a one-way drop leaves both
    # ends talking one way, and either may be named.
    named = {f"host host{victim}"} | ({f"host host{other}"} if fault == "one_way_drop" else set())
    for rank, r in reports.items():
        if r.get("error") != "CollectiveTimeoutError":
            continue
        assert "whom the ranks that can still talk wait for" in r["message"], (rank, r)
        if hosts[rank] != victim or len(hosts) > 2:
            assert any(n in r["message"] for n in named), (rank, named, "\n".join(lines))
        if hosts[rank] != victim and fault != "one_way_drop":
            assert f"rank {hosts.index(victim)} (host host{victim})" in r["message"], (rank, r)
    assert left == [], left
    assert dropped is None or dropped > 0, "the one-way drop dropped nothing"
    lost = [t for _, s, t in job.run.lines if s == "err" and "lost contact with host" in t]
    if fault == "vanished_host":
        # Named, with its rank, as soon as its ssh session has been silent for three beats (the
        # ranks' own timeout is 3 s too: whichever comes first stops the job), and nothing
        # waits on the dead session afterwards.
        rank = hosts.index(victim)
        want = (f"lost contact with host host{victim} (rank {rank}): its ssh session went "
                "silent")
        assert any(want in t for t in lost), "\n".join(lines)
        assert launcher_took < 6, "\n".join(lines)
    else:  # the host's ssh session is fine: no host is reported lost
        assert lost == [], "\n".join(lines)


@pytest.mark.parametrize("graph", ["0", "1"])
@pytest.mark.parametrize("fault", ["rank_killed", "data_link_cut"])
def test_decode_across_hosts_ends_naming_the_lost_host(net, fault, graph):
    # mlx-lm decoding a model split over two hosts (tensor parallel, through mlx_compat, eagerly
    # or in graph mode): host2's rank SIGKILLed, or host2's data link cut, mid-token. Rank 0 raises
    # an error that names host2 (in graph mode, if the loss comes inside MLX's graph, it writes
    # that error and exits 1), and the launcher exits non-zero within the timeout plus a few seconds.
    job = Job(net, (1, 2), "decode", env={"FASTCOLL_TIMEOUT": str(TIMEOUT), "FASTCOLL_MLX_GRAPH": graph},
              launcher_args=("--grace", "1", "--timeout", "120"))
    assert job.run.wait_for("ready", 2, timeout=90), job.describe()
    time.sleep(0.5)  # both well inside their decoding
    t_fault = time.time()
    if fault == "rank_killed":
        os.kill(job.reports()[1]["pid"], signal.SIGKILL)  # its namespaces share our PIDs
    else:
        net.cut(2)
    code = job.wait(60)
    took = job.run.ended - t_fault
    in_graph = [t for _, _, t in job.run.lines if "in MLX's graph" in t and t.startswith("[0]")]
    reports = job.reports(wait=0 if in_graph else 3 * TIMEOUT)
    print(f"\n{fault}: launcher exit {code} after {took:.1f} s; rank 0: {reports[0].get('error')}: "
          f"{reports[0].get('message')} {in_graph}; rank 1: {reports[1].get('outcome')} {reports[1].get('error')}")
    assert code is not None and code != 0, job.describe()
    assert took < TIMEOUT + 5, job.describe()
    if in_graph:  # the process ended there, after one line: its report stops before the error
        assert graph == "1" and any(e in in_graph[0] and "host2" in in_graph[0] for e in ERRORS), in_graph
    else:
        assert reports[0]["outcome"] == "error" and reports[0]["error"] in ERRORS, job.describe()
        assert "host2" in reports[0]["message"], job.describe()
        assert reports[0]["tokens"] > 1, job.describe()
    if fault == "data_link_cut":  # rank 1 ends too: its report says how, or (graph mode) its line
        ended = any("in MLX's graph" in t and t.startswith("[1]") for _, _, t in job.run.lines)
        assert ended or reports[1].get("outcome") in ("error", "terminated"), job.describe()
    assert job.leftovers(wait=3 * TIMEOUT) == []


def test_vanished_host_with_two_ranks_is_named_once_with_both(net):
    job = Job(net, (1, 2), "loop", slots=2, env={"FASTCOLL_TIMEOUT": "10"},
              launcher_args=("--grace", "1", "--timeout", "60", "--lost-after", "4"))
    assert job.run.wait_for("ready", 4, timeout=30), job.describe()
    time.sleep(0.3)
    t_fault = time.time()
    net.vanish(2)
    code = job.wait(30)
    took = job.run.ended - t_fault
    lost = [(at - t_fault, t) for at, s, t in job.run.lines if "lost contact" in t]
    print(f"\nhost2 (ranks 2, 3) vanished: exit {code} after {took:.1f} s; {lost}")
    # The host is lost before any rank's 10 s timeout: it is the job's failure (255, ssh's).
    assert code == 255, job.describe()
    assert len(lost) == 1 and "lost contact with host host2 (ranks 2, 3): its ssh session went " \
        "silent" in lost[0][1] and "stopping the other 2 rank(s)" in lost[0][1], job.describe()
    silent = float(re.search(r"nothing for (\d+\.\d) s", lost[0][1]).group(1))
    assert 4.0 <= silent < 4.5, lost  # --lost-after 4
    assert lost[0][0] < 5.5 and took < 6.5, lost
    assert job.leftovers(wait=3 * TIMEOUT) == []


def test_ssh_session_that_ends_names_the_host(net):
    job = Job(net, (1, 2), "loop", env={"FASTCOLL_TIMEOUT": "10"},
              launcher_args=("--grace", "1", "--timeout", "60"))
    assert job.run.wait_for("ready", 2, timeout=30), job.describe()
    sessions = [p for p, c in net.processes()["host2"] if c.startswith("sshd")]
    assert sessions, net.processes()
    t_fault = time.time()
    netns._kill(sessions)  # host2's sshd session of the job dies: ssh's connection closes
    code = job.wait(30)
    took = job.run.ended - t_fault
    lost = [t for _, s, t in job.run.lines if "lost contact" in t]
    print(f"\nhost2's ssh session killed: exit {code} after {took:.1f} s; {lost}")
    # The agent there stops its rank when its session dies, so rank 0 may see PeerLostError
    # (exit 3) before the launcher sees ssh end: either is the job's failure, and the host is
    # named either way.
    assert code in (3, 255), job.describe()
    assert any("lost contact with host host2 (rank 1): its ssh session ended (ssh exited with "
               "code 255)" in t for t in lost), job.describe()
    assert took < 3, job.describe()
    assert job.leftovers(wait=3 * TIMEOUT) == []


def test_a_launcher_stopped_for_a_while_loses_no_host(net):
    # SIGSTOP the launcher past --lost-after: the agents' beats wait in the pipes meanwhile, so
    # on SIGCONT no host is taken for lost, and the job ends well.
    job = Job(net, (1, 2), "loop", env={"FASTCOLL_TIMEOUT": "20"},
              launcher_args=("--env", "MULTIHOST_LOOP_SECONDS=7"))
    assert job.run.wait_for("ready", 2, timeout=30), job.describe()
    os.kill(job.run.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(4.5)
    finally:
        os.kill(job.run.proc.pid, signal.SIGCONT)
    code = job.wait(40)
    assert "lost contact" not in job.run.err, job.describe()
    assert code == 0, job.describe()


# ----------------------------------------------------------------------------- shared memory


@pytest.mark.parametrize("shm", ["1", "0"])
def test_hosts_of_one_hostname_share_memory_unless_shm_is_off(net, shm):
    # Two network namespaces that show one hostname, on one machine (one boot id, one /dev/shm):
    # fastcoll takes them for one host and moves their bytes through shared memory, as it
    # would for containers sharing a hostname and /dev/shm. FASTCOLL_SHM=0 keeps them on TCP.
    net.set_hostname(2, "host1")
    job = Job(net, (1, 2), "collectives",
              env={"FASTCOLL_SHM": shm, "FASTCOLL_TIMEOUT": "20", "FASTCOLL_LOG": "info"})
    code = job.wait(90)
    assert code == 0, job.describe()
    reports = job.reports(wait=2)
    want = "tcp, shared memory on 1 of 1 connections" if shm == "1" else "tcp"
    for rank, r in reports.items():
        assert r["outcome"] == "ok" and r["checks"] > 0, job.describe()
        assert r["hostname"] == "host1", r
        assert r["interface"] == net.host(rank + 1).data[0], r  # still two network namespaces
        assert r["transport"].split("; ")[0] == want, (rank, r)
    # The decision is logged at info on each rank (FASTCOLL_LOG=info shows it).
    logged = [t for _, _, t in job.run.lines if "connections through shared memory" in t]
    assert len(logged) == (2 if shm == "1" else 0), logged
    off = [t for _, _, t in job.run.lines if "shared memory is off" in t]
    assert len(off) == (0 if shm == "1" else 2), off
    if shm == "1":
        assert all("FASTCOLL_SHM=0 keeps them on TCP" in t for t in logged), logged


# ----------------------------------------------------------------------------- data routes


@pytest.mark.parametrize("case", ["ssh_address_listed", "hosts_option"])
def test_data_over_the_ssh_network_is_warned_about(net, case):
    outdir = str(net.root / f"job{next(_count)}")
    os.mkdir(outdir)
    if case == "ssh_address_listed":
        # host1 lists its management address (the one ssh logs in to) as its data address
        # while host2 lists a data address.
        hf = net.root / f"hf{next(_count)}"
        hf.write_text(f"host1 ips={net.host(1).mgmt}\nhost2 ips={net.host(2).data[0]}\n")
        where = ["--hostfile", str(hf)]
        want = (f"warning: host host1's data address {net.host(1).mgmt} is the address ssh "
                "uses, though the hostfile lists other addresses for host2")
    else:
        where = ["--hosts", f"{net.host(1).mgmt},{net.host(2).mgmt}"]
        want = ("warning: this --hosts job across hosts sends its data over the addresses ssh "
                f"uses ({net.host(1).mgmt}, {net.host(2).mgmt})")
    code, run = net.launch([*where, "--env", f"PYTHONPATH={REPO}", "python", WORKER, outdir,
                            "big", "1"], env=net.launcher_env(FASTCOLL_TIMEOUT="20"), cwd=REPO,
                           timeout=60)
    print("\n" + run.err)
    assert code == 0, run.out + run.err
    assert want in run.err, run.err
    assert run.err.count("warning:") == 1, run.err
