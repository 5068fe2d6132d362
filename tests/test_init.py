"""init(): the environment contract, other launchers' variables, start order, bad setups."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import PROGS, ROOT, free_port, rank_env
from fastcoll.config import Config, first_slurm_node, parse_address

WORKER = os.path.join(PROGS, "launcher_env_worker.py")


def test_world_of_one_when_nothing_is_set():
    c = Config.from_env({})
    assert (c.rank, c.world_size, c.coordinator, c.launcher) == (0, 1, None, "none")


@pytest.mark.parametrize(
    "env, rank, size, launcher",
    [
        ({"MLX_RANK": "1", "MLX_WORLD_SIZE": "3", "FASTCOLL_COORDINATOR": "mac1:5000"}, 1, 3, "mlx.launch"),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 2, 4, "Open MPI"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, 0, 2, "MPICH/PMI"),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODELIST": "node[07-09],x"}, 3, 4, "Slurm"),
    ],
)
def test_other_launchers_ranks(env, rank, size, launcher):
    c = Config.from_env(env)
    assert (c.rank, c.world_size, c.launcher) == (rank, size, launcher)
    assert c.coordinator is not None


def test_coordinator_derivation():
    assert Config.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "gpu[03-05]"}).coordinator == ("gpu03", 29517)
    c = Config.from_env({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"})
    assert c.coordinator == ("10.0.0.5", 1234)
    assert Config.from_env({"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "2", "FASTCOLL_COORDINATOR": "[::1]:99"}).coordinator == ("::1", 99)
    assert first_slurm_node("a1,b2") == "a1"


def test_mlx_launch_hostfile_gives_size_and_first_host(tmp_path):
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps([["192.168.1.2:5000"], ["192.168.1.3:5000"]]))
    c = Config.from_env({"MLX_RANK": "1", "MLX_HOSTFILE": str(ring)})
    assert (c.rank, c.world_size, c.coordinator[0]) == (1, 2, "192.168.1.2")
    conf = tmp_path / "hosts.json"
    conf.write_text(json.dumps([{"ssh": "mac1", "ips": ["10.0.1.1"]}, {"ssh": "mac2", "ips": []}, {"ssh": "mac3"}]))
    c = Config.from_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(conf)})
    assert (c.world_size, c.coordinator[0]) == (3, "10.0.1.1")


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"FASTCOLL_RANK": "2", "FASTCOLL_WORLD_SIZE": "2"}, "not below"),
        ({"FASTCOLL_RANK": "0"}, "set together"),
        ({"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "2"}, "FASTCOLL_COORDINATOR"),
        ({"FASTCOLL_TRANSPORT": "udp"}, "FASTCOLL_TRANSPORT"),
        ({"FASTCOLL_TIMEOUT": "soon"}, "FASTCOLL_TIMEOUT"),
        ({"FASTCOLL_FAST_SYNC": "maybe"}, "FASTCOLL_FAST_SYNC"),
        ({"FASTCOLL_MLX_GRAPH": "2"}, r"FASTCOLL_MLX_GRAPH must be 0 or 1 \(or on/off, true/false, yes/no\), not '2'"),
        ({"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "2", "FASTCOLL_COORDINATOR": "nohostport"}, "host:port"),
        ({"FASTCOLL_CONNECTIONS": "0"}, "FASTCOLL_CONNECTIONS"),
    ],
)
def test_bad_environment_names_the_variable(env, needle):
    with pytest.raises(ValueError, match=needle):
        Config.from_env(env)


@pytest.mark.parametrize("value, graph, given", [(None, True, False), ("", True, False), (" ", True, False),
                                                ("0", False, True), ("1", True, True), ("yes", True, True),
                                                ("off", False, True)])
def test_graph_mode_is_the_default_and_a_given_setting_is_known_as_given(value, graph, given):
    """FASTCOLL_MLX_GRAPH unset or empty: config.DEFAULT_MLX_GRAPH (graph mode), not given (where
    graph mode cannot run it falls back quietly); any of the flags' words: that, given."""
    from fastcoll.config import DEFAULT_MLX_GRAPH

    c = Config.from_env({} if value is None else {"FASTCOLL_MLX_GRAPH": value})
    assert DEFAULT_MLX_GRAPH is True and (c.mlx_graph, c.mlx_graph_set) == (graph, given)


# The names that are no setting on purpose: the refusal's tests and examples use them (and only
# those; test_every_name_the_package_reads_is_a_setting_and_the_readme_says_what_it_is).
MISSPELT = {"FASTCOLL_TIMOUT", "FASTCOLL_TRANSPOT", "FASTCOLL_MLXGRAPH", "FASTCOLL_NATVE", "FASTCOLL_QWERTY"}


@pytest.mark.parametrize("name, near", [("FASTCOLL_TIMOUT", "FASTCOLL_TIMEOUT"), ("FASTCOLL_TRANSPOT", "FASTCOLL_TRANSPORT"),
                                        ("FASTCOLL_MLXGRAPH", "FASTCOLL_MLX_GRAPH"), ("FASTCOLL_NATVE", "FASTCOLL_NATIVE"),
                                        ("FASTCOLL_QWERTY", None)])
def test_an_unknown_setting_is_refused_naming_the_nearest(name, near):
    """FASTCOLL_TIMOUT=5 ran with the default 60 s: a FASTCOLL_* name that is no setting is
    refused at init(), with the nearest setting named where one is near."""
    with pytest.raises(ValueError) as e:
        Config.from_env({name: "5"})
    hint = f"did you mean {near}?" if near else "the README's environment table lists them"
    assert str(e.value) == f"{name} is not a fastcoll setting: {hint}"


def test_the_test_suites_own_names_and_other_prefixes_pass():
    c = Config.from_env({"FASTCOLL_TEST_SOAK_OPS": "5", "FASTCOLLX": "1", "MY_FASTCOLL_TIMOUT": "1"})
    assert c.timeout == 60.0


def _names(paths: list[str], pattern: str = r"\bFASTCOLL_[A-Z0-9_]*[A-Z0-9]\b") -> dict[str, str]:
    """Every FASTCOLL_* name in the files under `paths` (relative to the repository): name -> a file."""
    found: dict[str, str] = {}
    for top in paths:
        full = os.path.join(ROOT, top)
        files = [full] if os.path.isfile(full) else [os.path.join(d, f) for d, _, fs in os.walk(full) for f in fs]
        for path in files:
            if path.endswith((".py", ".c", ".h", ".md", ".toml")) or os.path.basename(os.path.dirname(path)) == ".ci":
                with open(path, errors="replace") as f:
                    text = f.read()
                if path == os.path.join(ROOT, "fastcoll", "config.py"):  # the table itself reads nothing
                    text = re.sub(r"\nSETTINGS = \{.*?\n\}\n", "\n", text, flags=re.S)
                for name in re.findall(pattern, text):
                    found.setdefault(name, os.path.relpath(path, ROOT))
    return found


def test_every_name_the_package_reads_is_a_setting_and_the_readme_says_what_it_is():
    """The rule: the names fastcoll's code reads or sets are its settings (config.SETTINGS), and
    the README's environment table or docs/ say each; any other FASTCOLL_* name a test sets is
    under FASTCOLL_TEST_, so that init() never refuses the test suite's own."""
    from fastcoll.config import SETTINGS, TEST_PREFIX

    read = _names(["fastcoll", "setup.py"])
    assert set(read) - set(SETTINGS) == set(), {n: read[n] for n in set(read) - set(SETTINGS)}
    docs = " ".join(open(os.path.join(ROOT, p)).read() for p in ["README.md", *[os.path.join("docs", f) for f in
                    os.listdir(os.path.join(ROOT, "docs"))]])
    undocumented = [n for n in read if f"`{n}`" not in docs and f"{n}=" not in docs]
    assert undocumented == [], undocumented
    used = _names(["tests", "bench", "examples", ".ci", "launch", "docs", "README.md"])
    strays = {n: f for n, f in used.items() if n not in {*SETTINGS, *MISSPELT} and not n.startswith(TEST_PREFIX)}
    assert strays == {}, strays


def test_parse_address_bounds_the_port():
    with pytest.raises(ValueError, match="outside"):
        parse_address("h:70000", "X")


def test_config_accepts_exactly_the_registered_transports():
    """Config reads the names from fastcoll.wire (the job imports no transport); the registry
    refuses to load where the two lists differ."""
    from fastcoll import transport, wire

    assert tuple(transport.TRANSPORTS) == wire.TRANSPORTS
    for name in wire.TRANSPORTS:
        assert Config(transport=name).transport == name
    with pytest.raises(ValueError, match="FASTCOLL_TRANSPORT must be one of 'tcp', 'zmq', 'rdma', not 'udp'"):
        Config(transport="udp")
    code = "import importlib, fastcoll.transport as t; t.wire.TRANSPORTS = ('tcp', 'zmq'); importlib.reload(t)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "fastcoll.wire.TRANSPORTS names ('tcp', 'zmq')" in r.stderr, r.stderr


def _start(rank: int, size: int, port: int, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKER], env=rank_env(rank, size, port, **extra), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def _finish(procs: list[subprocess.Popen], timeout: float = 60) -> list[tuple[int, str, str]]:
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_ranks_start_in_any_order_seconds_apart():
    port = free_port()
    procs = [_start(2, 3, port)]
    time.sleep(1.5)
    procs.append(_start(1, 3, port))
    time.sleep(1.5)
    procs.append(_start(0, 3, port))
    for code, out, err in _finish(procs):
        assert code == 0, err
        assert "ok" in out


def test_wrong_token_is_refused_and_named():
    port = free_port()
    procs = [_start(0, 2, port, timeout="3"), _start(1, 2, port, token="not-the-token", timeout="3")]
    (c0, _, e0), (c1, _, e1) = _finish(procs)
    assert c0 != 0 and c1 != 0
    assert "AuthenticationError" in e1 and "token" in e1
    assert "AuthenticationError" in e0  # the coordinator logs the refusal and times out


def test_world_sizes_that_disagree_are_a_mismatch():
    port = free_port()
    procs = [_start(0, 2, port, timeout="10"), _start(1, 3, port, timeout="10")]
    results = _finish(procs)
    assert all(code != 0 for code, _, _ in results)
    assert "MismatchError" in results[0][2] and "world sizes disagree" in results[0][2]


def test_under_mpiexec():
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec on this machine (pip install mpich provides one)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOLL_")}
    env.update(PYTHONPATH=ROOT, FASTCOLL_PORT=str(free_port()))
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "rank 0 of 2 via MPICH/PMI: ok" in r.stdout and "rank 1 of 2 via MPICH/PMI: ok" in r.stdout


def test_under_mlx_launch():
    launcher = shutil.which("mlx.launch") or os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if not os.path.exists(launcher):
        pytest.skip("mlx.launch is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOLL_")}
    env.update(PYTHONPATH=ROOT, FASTCOLL_PORT=str(free_port()))
    r = subprocess.run(
        [launcher, "-n", "2", "--backend", "ring", "-p", str(free_port()), "--python", sys.executable, WORKER],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert "rank 0 of 2 via mlx.launch: ok" in r.stdout and "rank 1 of 2 via mlx.launch: ok" in r.stdout, r.stdout + r.stderr
