"""The bed of tests/netbed.py and what bench/hostbed.py reads of it: the core plan, the ssh
command line its `ssh` understands, the link settings (netbed.parse_link) and the summary (test_netbed_built.py
builds one); hostbed's gate part on a built bed (root; slow)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import netbed  # noqa: E402
from bench import decode_bench, hostbed, multihost  # noqa: E402


def test_sixteen_cpus_give_each_host_cores_of_its_own():
    for hosts, per in ((2, 4), (4, 3)):
        cores, launchers, relay = netbed.plan_cores(hosts, 16)
        flat = [c for host in cores for c in host]
        assert [len(c) for c in cores] == [per] * hosts
        assert len(set(flat)) == len(flat), "two hosts share a core"
        assert relay == 15 and relay not in flat and relay not in launchers
        assert launchers and not set(launchers) & set(flat)


def test_a_small_machine_pins_nothing():
    cores, launchers, relay = netbed.plan_cores(4, 2)
    assert relay is None and cores == [[0, 1]] * 4 and launchers == [0, 1]


@pytest.mark.parametrize("argv, want", [
    (["-T", "-o", "BatchMode=yes", "host2", "exec", "python3", "-c", "x"], ("host2", "exec python3 -c x", False)),
    (["-tt", "-o", "LogLevel=QUIET", "host1", "cd /tmp; env A=1 python3 w.py"], ("host1", "cd /tmp; env A=1 python3 w.py", False)),
    (["-x", "host3", "/m/bin/hydra_pmi_proxy", "--control-port", "10.201.0.254:5"],
     ("host3", "/m/bin/hydra_pmi_proxy --control-port 10.201.0.254:5", False)),
    (["-F", "cfg", "-p22", "-G", "host4"], ("host4", "", True)),
])
def test_the_beds_ssh_reads_the_command_lines_of_the_three_launchers(argv, want):
    """fastcoll-launch (-T -o ...), mlx.launch (-tt -o ...), MPICH's hydra (-x): the host is the
    first word that is no option or option value; the rest is the remote command."""
    assert netbed.parse_ssh(argv) == want


def test_ssh_without_a_host_is_refused():
    with pytest.raises(ValueError, match="HOST"):
        netbed.parse_ssh(["-o", "BatchMode=yes"])


@pytest.mark.parametrize("text, want", [
    ("unshaped", (None, None)), ("1gbit+50us", (50.0, 10**9)), ("0+200us", (200.0, 0)),
    ("100mbit", (0.0, 10**8)), ("2.5gbit+10us", (10.0, 2_500_000_000)),
])
def test_link_settings(text, want):
    assert netbed.parse_link(text) == want


@pytest.mark.parametrize("text", ["1gb+50us", "1gbit+50ms", "fast"])
def test_a_link_setting_it_cannot_read_is_refused(text):
    with pytest.raises(ValueError, match="link"):
        netbed.parse_link(text)


def test_the_summary_compares_each_peer_with_fastcoll():
    def point(system, size, t, op="all_reduce", **extra):
        return {"system": system, "op": op, "size": size, "status": "ok", "median_s": t,
                "busbw_GBps": size / t / 1e9, **extra}
    runs = [{"hosts": 2, "link": "unshaped", "doc": {"points": [
        point("fastcoll-tcp", 4, 20e-6), point("mpi", 4, 30e-6),
        {"system": "mlx-ring", "op": "all_reduce", "size": 4, "status": "error"}]}}]
    text = hostbed.summary(runs, ["fastcoll-tcp", "mlx-ring", "mpi"])
    row = text.splitlines()[2]
    assert "| 2 | unshaped | all_reduce | 4 | 20.0 us" in row and "failed" in row and "1.50x" in row


def test_the_summary_keeps_each_op_apart_and_marks_an_emulated_one():
    """Several ops in one job: a row per op and size, each op's own times, never another op's; a
    peer's emulated op (MLX's broadcast is an all_sum) is marked."""
    def point(system, op, t, **extra):
        return {"system": system, "op": op, "size": 4096, "status": "ok", "median_s": t, "busbw_GBps": 1.0, **extra}
    runs = [{"hosts": 4, "link": "1gbit+200us", "doc": {"points": [
        point("fastcoll-tcp", "all_reduce", 10e-6), point("mlx-ring", "all_reduce", 40e-6),
        point("fastcoll-tcp", "broadcast", 20e-6), point("mlx-ring", "broadcast", 30e-6, emulated="all_sum")]}}]
    rows = hostbed.summary(runs, ["fastcoll-tcp", "mlx-ring"]).splitlines()[2:]
    assert [r.split(" | ")[2] for r in rows] == ["all_reduce", "broadcast"]
    assert "4.00x" in rows[0] and "10.0 us" in rows[0] and "*" not in rows[0]
    assert "1.50x" in rows[1] and "30.0 us (1.000)*" in rows[1]


def test_hostbed_refuses_a_link_or_system_before_building_a_bed(tmp_path, capsys):
    """A link it cannot read, or a variant the bed cannot start, ends the command line's parse
    (exit 2, the problem named) before any bed is built: no root needed to see it."""
    for args, said in ((["--links", "unshaped,1gb+50us"], "rate must end in gbit"),
                       (["--systems", "fastcoll-tcp/a2"], "localhost's variants")):
        with pytest.raises(SystemExit) as e:
            hostbed.main(["--out", str(tmp_path / "out"), *args])
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class _FakeBed:
    """What multihost.Hosts reads of a bed, without building one."""

    ssh_command = "/bed/bin/ssh"

    def __init__(self, root):
        self.root = root

    def host(self, i):
        return netbed.Host(i, f"host{i}", f"ns{i}", f"10.201.0.{i}", (f"10.202.0.{i}",))

    def hostfile(self, hosts, fmt):
        return str(self.root / "hostfile")


def test_every_job_on_the_bed_starts_through_one_launcher_line(tmp_path):
    """The collectives' and decode's jobs share Hosts' launcher lines: fastcoll-launch over the bed's
    ssh with the ranks' PYTHONPATH (and decode's one thread a rank), mlx.launch on the job's ports."""
    hosts = multihost.Hosts(_FakeBed(tmp_path), 2)
    fast = hosts.command("fastcoll-tcp/py", ["--sizes", "4"], 30)
    assert fast[fast.index("--ssh") + 1] == "/bed/bin/ssh" and f"--env=PYTHONPATH={hosts.pythonpath}" in fast
    assert "--env=FASTCOLL_NATIVE=0" in fast and fast[-2:] == ["--sizes", "4"]
    with pytest.raises(ValueError, match="localhost's variants"):
        hosts.command("fastcoll-tcp/a2", [], 30)
    graph = hosts.decode_command("fastcoll-graph/yield_reads=0", ["--mode", "tp"], 60)
    assert "--env=OMP_NUM_THREADS=1" in graph and "--env=FASTCOLL_MLX_GRAPH=1" in graph
    assert "--env=FASTCOLL_TUNING=yield_reads=0" in graph and graph[graph.index("--timeout") + 1] == "60"
    assert "--env=FASTCOLL_MLX_GRAPH=0" in hosts.decode_command("fastcoll", ["--mode", "tp"], 60)  # eager, by name
    ring = hosts.decode_command("ring-mlx.launch", ["--mode", "tp"], 60)
    assert ring[ring.index("--starting-port") + 1] == str(hosts.port) and "--env=OPENBLAS_NUM_THREADS=1" in ring
    assert ring[-3:] == [str(decode_bench.WORKER), "--mode", "tp"]
    a = argparse.Namespace(decode_shapes=["small", "large"], decode_modes=["tp", "pp"])
    assert hostbed.decode_combos(a) == [("small", "tp"), ("large", "tp"), ("small", "pp")]


SHM, TCP = "tcp, shared memory on 1 of 1 connections; native engine", "tcp; native engine"


@pytest.mark.parametrize("row, want", [
    ({"hosts": 2, "part": "chain", "ranks": [{"transport": SHM}] * 2}, "shared memory between hosts"),
    ({"hosts": 1, "part": "chain", "ranks": [{"transport": SHM}] * 2}, None),
    ({"hosts": 2, "part": "chain", "ranks": [{"transport": TCP, "exact": {"wrong": 1, "error": None}}] * 2}, "wrong gates"),
    ({"hosts": 2, "part": "decode", "transport": TCP, "ms_per_token": 1.0, "tokens": [1, 3]},
     "tokens other than one process's"),
    ({"hosts": 2, "part": "decode", "transport": TCP, "ms_per_token": 1.0, "tokens": [1, 2]}, None),
    ({"hosts": 2, "part": "chain", "ranks": [], "error": "timed out"}, "failed: timed out"),
    ({"hosts": 2, "part": "chain", "ranks": [{"transport": TCP}]}, "failed: no result"),
    ({"hosts": 1, "part": "chain", "ranks": [{"error": "no result"}]}, "failed: no result"),
    ({"hosts": 2, "part": "decode", "error": "exit 1"}, "failed: exit 1"),
])
def test_the_gate_part_fails_a_row_over_shared_memory_a_wrong_gate_or_other_tokens(row, want):
    assert hostbed._problem(row, [1, 2]) == want


def test_the_gate_part_runs_across_two_hosts_exactly_and_over_tcp(tmp_path):
    """hostbed's gate part at tiny sizes on a built bed (the gate off without a GPU: the host path):
    each chain's gates exact on both ranks, decode's tokens one process's, and between the hosts TCP,
    never shared memory; beside the same scripts on one host, which do share memory."""
    if os.geteuid() != 0:
        pytest.skip("the bed needs root (network namespaces)")
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        pytest.skip("pyroute2 is not importable: the bed cannot be built (tests/netbed.py)")
    tiny = ["--hosts", "", "--gate-hosts", "2", "--gate-links", "unshaped", "--gate-shape", "tiny",
            "--gate-exact", "64", "--decode-tokens", "4", "--decode-repeat", "1"]
    done = subprocess.run([sys.executable, hostbed.__file__, "--out", str(tmp_path), *tiny], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["gate"]
    assert [(r["hosts"], r["part"], r["run"]) for r in rows if r["hosts"] == 2] == [
        (2, "chain", "host"), (2, "chain", "gatehost"), (2, "decode", "gate_host_mode")]
    single = next(r["tokens"] for r in rows if r["run"] == "single")
    for r in rows:
        assert r["problem"] is None, r
        said = [d["transport"] for d in r.get("ranks", [])] + ([r["transport"]] if r.get("transport") else [])
        assert r["run"] == "single" or said and all(t.startswith("tcp") for t in said)
        assert r["hosts"] == 1 or not any("shared memory" in t for t in said)
        assert all(d["exact"] == {"gates": 64, "wrong": 0, "error": None} for d in r.get("ranks", []) if "exact" in d)
        assert r["part"] == "chain" or r["tokens"] == single
    assert all(len(r["ranks"]) == 2 and "exact" in r["ranks"][0] for r in rows if r["hosts"] == 2 and r["part"] == "chain")
    assert any("shared memory" in d["transport"] for r in rows if r["hosts"] == 1 for d in r.get("ranks", []))
