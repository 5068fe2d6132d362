"""Hostfiles (mpirun style and MLX JSON), --hosts, and the job plan: no processes started."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from fastcoll.launch.hostfile import (
    Host,
    HostfileError,
    HostList,
    is_local_host,
    parse_hostfile_text,
    parse_hosts_arg,
    read_hostfile,
)
from fastcoll.launch.job import PlanError, parse_env_items, plan_job, program_argv

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- mpirun style -------------------------------------------------------------------------

def test_mpirun_style_with_comments_slots_and_mpich_spelling(tmp_path):
    path = _write(tmp_path, "hosts", """
# a comment

mac1 slots=2          # Open MPI spelling
mac2:3
  mac3   slots=1 max_slots=4 ips=10.0.0.3,10.1.0.3
user@mac4
10.0.0.5 slots=2
""")
    hosts = read_hostfile(path)
    assert hosts.hosts == (
        Host("mac1", 2),
        Host("mac2", 3),
        Host("mac3", 1, ("10.0.0.3", "10.1.0.3")),
        Host("user@mac4", 1),
        Host("10.0.0.5", 2, ("10.0.0.5",)),
    )
    assert hosts.slots == 9
    assert hosts.hosts[3].address == "mac4"
    assert hosts.hosts[2].address == "10.0.0.3"


@pytest.mark.parametrize(
    "line, words",
    [
        ("mac1 slots=abc", "slots='abc' is not a positive integer"),
        ("mac1 slots=0", "not a positive integer"),
        ("mac1 slotz=2", "unknown option 'slotz'"),
        ("mac1 2", "expected key=value"),
        ("mac1 slots=2 slots=3", "slots is given twice"),
        ("mac1:x", "slot count 'x'"),
        ("bad!host", "is not a host name"),
    ],
)
def test_mpirun_style_bad_line_names_file_and_line(tmp_path, line, words):
    path = _write(tmp_path, "hosts", f"# header\nmac0 slots=1\n\n{line}\nmac9\n")
    with pytest.raises(HostfileError) as e:
        read_hostfile(path)
    msg = str(e.value)
    assert f"{path}, line 4" in msg and words in msg, msg


def test_empty_and_missing_hostfiles(tmp_path):
    with pytest.raises(HostfileError, match="lists no hosts"):
        read_hostfile(_write(tmp_path, "hosts", "# nothing\n\n"))
    with pytest.raises(HostfileError, match="cannot read hostfile"):
        read_hostfile(str(tmp_path / "absent"))


# --- MLX JSON -----------------------------------------------------------------------------

def test_mlx_json_list(tmp_path):
    data = [{"ssh": "mac1", "ips": ["10.0.0.1", "10.1.0.1"]}, {"ssh": "mac2", "ips": []},
            {"ssh": "mac2", "ips": ["10.0.0.2"], "rdma": [["rdma_en2", "rdma_en4"], "rdma_en3", None]}]
    hosts = read_hostfile(_write(tmp_path, "hosts.json", json.dumps(data, indent=2)))
    assert hosts.hosts == (
        Host("mac1", 1, ("10.0.0.1", "10.1.0.1")),
        Host("mac2", 1, ()),
        Host("mac2", 1, ("10.0.0.2",), (("rdma_en2", "rdma_en4"), ("rdma_en3",), None)),
    )
    assert hosts.envs == ()


def test_mlx_json_object_with_backend_and_envs(tmp_path):
    data = {"backend": "ring", "envs": ["A=1", "B=x=y"],
            "hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "slots": 2}]}
    hosts = read_hostfile(_write(tmp_path, "hosts.json", json.dumps(data)))
    assert hosts.envs == ("A=1", "B=x=y")
    assert hosts.slots == 3


@pytest.mark.parametrize(
    "text, line, words",
    [
        ('[\n  {"ssh": "mac1"},\n  {"ssh": "mac2",}\n]\n', 3, "not valid JSON"),
        ('[\n  {"ssh": "mac1"},\n\n  {"ips": ["10.0.0.2"]}\n]\n', 4, '"ssh"'),
        ('[\n  {"ssh": "mac1", "ips": "10.0.0.1"}\n]', 2, '"ips" must be a list'),
        ('[\n  {"ssh": "mac1"},\n  "mac2"\n]', 3, "each host must be an object"),
        ('{"hosts": [\n {"ssh": "a"},\n {"ssh": "b", "slots": 0}\n]}', 3, '"slots"'),
        ('{"envs": "A=1",\n "hosts": [{"ssh": "a"}]}', 1, '"envs" must be a list'),
        ('{"backend": "ring"}', 1, 'needs a "hosts" list'),
        ('[{"ssh": "a", "rdma": [null]},\n {"ssh": "b"}]', 1, '"rdma" must be a JSON list with one entry per host entry (2)'),
        ('[{"ssh": "a"},\n {"ssh": "b", "rdma": ["rdma_en3", "rdma_en2"]}]', 2, "entry 1 is this host entry itself"),
        ('[{"ssh": "a", "rdma": [null, "bad name"]},\n {"ssh": "b"}]', 1, "entry 1 must be null, a device name"),
        ('[{"ssh": "a", "rdma": [null, []]},\n {"ssh": "b"}]', 1, "entry 1 must be null, a device name"),
        ('[{"ssh": "a", "rdma": "rdma_en3"},\n {"ssh": "b"}]', 1, '"rdma" must be a JSON list'),
    ],
)
def test_mlx_json_bad_entry_names_file_and_line(tmp_path, text, line, words):
    path = _write(tmp_path, "hosts.json", text)
    with pytest.raises(HostfileError) as e:
        read_hostfile(path)
    msg = str(e.value)
    assert f"{path}, line {line}" in msg and words in msg, msg


def test_example_hostfiles_parse():
    for name, n in [("hostfile-2mac.txt", 2), ("hostfile-4mac.txt", 4),
                    ("hosts-2mac.json", 2), ("hosts-4mac.json", 4), ("hosts-2mac-rdma.json", 2)]:
        hosts = read_hostfile(str(REPO / "launch" / name))
        assert len(hosts.hosts) == n and all(h.ips for h in hosts.hosts), name


# --- --hosts ------------------------------------------------------------------------------

def test_hosts_argument():
    assert parse_hosts_arg("mac1,mac2:2").hosts == (Host("mac1", 1), Host("mac2", 2))
    assert parse_hosts_arg("[fe80::1]:2,::1").hosts == (
        Host("fe80::1", 2, ("fe80::1",)), Host("::1", 1, ("::1",)))
    for bad in ("mac1,,mac2", "mac1:0", "mac1:two", ""):
        with pytest.raises(HostfileError, match="--hosts"):
            parse_hosts_arg(bad)


def test_local_host_names():
    for name in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        assert is_local_host(name), name
    assert not is_local_host("me@localhost")  # naming a user asks for an ssh login
    assert not is_local_host("surely-not-this-machine.example")


# --- the plan -----------------------------------------------------------------------------

def test_plan_places_ranks_by_slot_and_counts_local_ranks():
    hosts = HostList((Host("a", 2, ("10.0.0.1",)), Host("b", 1), Host("a", 1, ("10.0.0.1",))))
    plan = plan_job(hosts, ["python", "t.py", "--lr", "3e-4"], remote_port=lambda h: 4242,
                    python="/opt/py", environ={})
    assert [(r.rank, r.host.name, r.local_rank) for r in plan.ranks] == [
        (0, "a", 0), (1, "a", 1), (2, "b", 0), (3, "a", 2)]
    assert plan.coordinator == "10.0.0.1:4242"
    assert [r.env["FASTCOLL_INTERFACE"] for r in plan.ranks] == [
        "10.0.0.1", "10.0.0.1", "b", "10.0.0.1"]
    assert all(r.argv == ("/opt/py", "t.py", "--lr", "3e-4") for r in plan.ranks)
    assert {r.env["FASTCOLL_TOKEN"] for r in plan.ranks} == {plan.token}
    assert all(r.env["FASTCOLL_WORLD_SIZE"] == "4" and not r.local for r in plan.ranks)


def test_plan_n_and_slots():
    hosts = parse_hosts_arg("a:2,b:2")
    plan = plan_job(hosts, ["prog"], nprocs=3, remote_port=lambda h: 1, environ={})
    assert [r.host.name for r in plan.ranks] == ["a", "a", "b"]
    with pytest.raises(PlanError, match="more ranks than the hosts have slots"):
        plan_job(hosts, ["prog"], nprocs=5, remote_port=lambda h: 1, environ={})


def test_plan_local_job_and_overrides():
    plan = plan_job(None, ["prog"], nprocs=2, env_items=["K=v"], interface="en5", environ={})
    host, port = plan.coordinator.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert all(r.local and r.env["FASTCOLL_INTERFACE"] == "en5" and r.env["K"] == "v"
               for r in plan.ranks)
    assert [r.env["FASTCOLL_LOCAL_RANK"] for r in plan.ranks] == ["0", "1"]
    fixed = plan_job(None, ["prog"], coordinator="127.0.0.1:5000", environ={})
    assert fixed.coordinator == "127.0.0.1:5000"


def test_plan_refuses_loopback_name_in_a_job_across_hosts():
    with pytest.raises(PlanError, match="loopback"):
        plan_job(parse_hosts_arg("localhost,mac2"), ["prog"], remote_port=lambda h: 1,
                 environ={})


def test_env_items_and_program_argv():
    assert parse_env_items(["A=1", "B", "C="], {"B": "from-launcher"}) == {
        "A": "1", "B": "from-launcher", "C": ""}
    with pytest.raises(PlanError, match="not set"):
        parse_env_items(["MISSING"], {})
    assert program_argv(["python3", "-m", "x"], "/py") == ("/py", "-m", "x")
    assert program_argv(["train.py", "--a"], "/py") == ("/py", "train.py", "--a")
    assert program_argv(["/usr/bin/python3", "t.py"], "/py") == ("/usr/bin/python3", "t.py")
    assert program_argv(["hostname"], "/py") == ("hostname",)
    with pytest.raises(PlanError):
        program_argv([], "/py")


def test_config_reads_what_the_launcher_sets():
    """fastcoll.init()'s reader accepts the launcher's variables (contract with config.py)."""
    from fastcoll.config import Config

    plan = plan_job(None, ["prog"], nprocs=2, environ={})
    for r in plan.ranks:
        cfg = Config.from_env(dict(r.env))
        assert (cfg.rank, cfg.world_size, cfg.launcher) == (r.rank, 2, "fastcoll")
        assert cfg.coordinator == ("127.0.0.1", int(plan.coordinator.rsplit(":", 1)[1]))
        assert cfg.token == plan.token.encode() and cfg.interface == "127.0.0.1"



def test_plan_several_ips_give_a_connection_per_ip():
    """MLX's hostfile lists one ip per Thunderbolt cable; each rank listens on all of its host's
    and every rank opens as many connections as the host with the most."""
    from fastcoll.config import Config

    text = json.dumps([
        {"ssh": "mac1", "ips": ["10.0.0.1", "10.0.1.1"]},
        {"ssh": "mac2", "ips": ["10.0.0.2", "10.0.1.2"]},
        {"ssh": "mac3", "ips": ["10.0.2.3"]},
    ])
    plan = plan_job(parse_hostfile_text(text), ["prog"], remote_port=lambda h: 7, environ={})
    assert [r.env["FASTCOLL_INTERFACE"] for r in plan.ranks] == ["10.0.0.1,10.0.1.1", "10.0.0.2,10.0.1.2", "10.0.2.3"]
    assert {r.env["FASTCOLL_CONNECTIONS"] for r in plan.ranks} == {"2"}
    assert Config.from_env(dict(plan.ranks[0].env)).interfaces == ("10.0.0.1", "10.0.1.1")
    # The user's own choice wins.
    mine = plan_job(parse_hostfile_text(text), ["prog"], env_items=["FASTCOLL_CONNECTIONS=4"],
                    remote_port=lambda h: 7, environ={})
    assert {r.env["FASTCOLL_CONNECTIONS"] for r in mine.ranks} == {"4"}
