"""fastcoll-launch over ssh, against a real OpenSSH server that this module starts itself.

The server listens on 127.0.0.1 at a random port with its own sshd_config, a throwaway host key
and a throwaway client key; the client side is an ssh_config passed with `--ssh "ssh -F FILE"`,
in which the aliases fc-a and fc-b lead to that server (so every "host" is this machine, reached
through ssh), fc-badkey offers a key the server does not accept, and fc-down points at a closed
port. Skipped, saying why, only where sshd is missing or cannot be started.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "progs"))
from launch_support import REPO, json_lines, launches, survivors, wait_for_lines  # noqa: E402,F401
from conftest import free_port  # noqa: E402
from netns import SSHD, sshd_config  # noqa: E402



class SshServer:
    """A running test sshd and the ssh client configuration that reaches it."""

    def __init__(self, root: Path, port: int, proc: subprocess.Popen) -> None:
        self.root = root
        self.port = port
        self.proc = proc
        self.ssh_config = root / "ssh_config"

    @property
    def ssh_option(self) -> list[str]:
        return ["--ssh", f"ssh -F {self.ssh_config}"]

    def hostfile(self, entries: list[dict], name: str = "hosts.json") -> str:
        path = self.root / name
        path.write_text(json.dumps(entries))
        return str(path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, timeout=30)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stop_sshd(proc: subprocess.Popen) -> None:
    # sshd puts each connection in a session of its own: kill the whole tree, not a group.
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Iterator[SshServer]:
    """Start sshd on 127.0.0.1 (a random port >= 2222); skip with the reason where it cannot."""
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (apt-get install -y openssh-server)")
    root = tmp_path_factory.mktemp("sshd")
    root.chmod(0o700)
    for key in ("host_key", "client_key", "stranger_key"):
        _keygen(root / key)
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege separation directory
    user = getpass.getuser()
    proc = None
    errors = []
    for _ in range(3):
        port = free_port()
        (root / "sshd_config").write_text(sshd_config(root, "127.0.0.1", port, "sshd.pid"))
        log = open(root / "sshd.log", "wb")
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 10
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                up = True
                break
            except OSError:
                time.sleep(0.05)
        if up:
            break
        if proc.poll() is None:
            _stop_sshd(proc)
        errors.append((root / "sshd.log").read_text(errors="replace").strip())
        proc = None
    if proc is None:
        pytest.skip(f"cannot start sshd on 127.0.0.1: {errors[-1] if errors else 'unknown'}")
    common = f"""  User {user}
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  IdentitiesOnly yes
  LogLevel ERROR
"""
    (root / "ssh_config").write_text(f"""
Host fc-a fc-b
  HostName 127.0.0.1
  Port {port}
  IdentityFile {root}/client_key
{common}
Host fc-badkey
  HostName 127.0.0.1
  Port {port}
  IdentityFile {root}/stranger_key
{common}
Host fc-down
  HostName 127.0.0.1
  Port {_closed_port()}
  IdentityFile {root}/client_key
{common}
""")
    server = SshServer(root, port, proc)
    try:
        probe = subprocess.run(
            ["ssh", "-F", str(server.ssh_config), "-o", "BatchMode=yes", "fc-a", "true"],
            capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        if probe.returncode != 0:
            pytest.skip("sshd started but refuses the test's key login: "
                        + probe.stderr.decode(errors="replace").strip()
                        + " / " + (root / "sshd.log").read_text(errors="replace").strip())
        yield server
    finally:
        _stop_sshd(proc)


def _agents_left(server: SshServer) -> list:
    """This module's remote helpers still running: ssh clients that use its ssh_config, and
    processes of a session of its sshd, orphaned or not (another suite on this machine, such as
    the multi-host bed, may run helpers of its own)."""
    return [p for p in survivors("fastcoll-agent", wait=2.0)
            if "fctest-" not in p[1] and (str(server.ssh_config) in p[1] or _ssh_port(p[0]) == server.port)]


def _ssh_port(pid: int) -> int | None:
    """The server port of the ssh session process `pid` runs in (its SSH_CONNECTION), if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return int(env[b"SSH_CONNECTION"].split()[3])
    except (OSError, KeyError, ValueError, IndexError):
        return None


def test_remote_ranks_env_output_and_no_token_on_command_lines(sshd, launches):
    hosts = sshd.hostfile([
        {"ssh": "localhost", "ips": ["127.0.0.1"]},  # rank 0 runs here, without ssh
        {"ssh": "fc-a", "ips": ["127.0.0.1"]},
        {"ssh": "fc-b", "ips": ["127.0.0.1"]},
    ])
    args = ["--lr", "3e-4", "-n", "2", "a b"]
    code, out, err, _ = launches.run(
        [*sshd.ssh_option, "--hostfile", hosts, "--env", "EXTRA=over ssh",
         *launches.rank_args("env", *args)], timeout=60)
    assert code == 0, err.decode()
    ranks = json_lines(out)
    assert sorted(ranks) == [0, 1, 2]
    assert len({r["FASTCOLL_TOKEN"] for r in ranks.values()}) == 1
    assert len({r["FASTCOLL_COORDINATOR"] for r in ranks.values()}) == 1
    for rank, info in ranks.items():
        assert info["FASTCOLL_RANK"] == str(rank) and info["FASTCOLL_WORLD_SIZE"] == "3"
        assert info["FASTCOLL_LOCAL_RANK"] == "0"  # three differently named hosts
        assert info["FASTCOLL_INTERFACE"] == "127.0.0.1"
        assert info["argv"] == args and info["extra"] == "over ssh"
        assert info["cwd"] == str(REPO) and info["executable"] == sys.executable

    code, out, err, _ = launches.run(
        [*sshd.ssh_option, "--hosts", "fc-a,fc-b", "--coordinator", "127.0.0.1",
         *launches.rank_args("tokencheck")], timeout=60)
    assert code == 0, err.decode()
    assert sorted(out.decode().splitlines()) == [
        "[0] token-on-command-line: False", "[1] token-on-command-line: False"], out.decode()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="--bind-to cores needs Linux and at least two CPUs this process may use")
def test_bind_to_cores_on_a_remote_host(sshd, launches):
    # two ranks on one remote host: its agent splits that host's cores between them
    code, out, err, _ = launches.run(
        [*sshd.ssh_option, "--hosts", "fc-a:2", "--coordinator", "127.0.0.1", "--bind-to", "cores",
         *launches.rank_args("env")], timeout=60)
    assert code == 0, err.decode()
    ranks = json_lines(out)
    a, b = (set(ranks[r]["cpus"]) for r in (0, 1))
    assert a and b and not a & b, (a, b)
    assert all(ranks[r]["thread_cpus"] == ranks[r]["cpus"] for r in (0, 1))


def test_remote_failure_stops_every_rank(sshd, launches):
    hosts = sshd.hostfile([{"ssh": "fc-a", "ips": ["127.0.0.1"]},
                           {"ssh": "fc-b", "ips": ["127.0.0.1"]},
                           {"ssh": "localhost", "ips": ["127.0.0.1"]}])
    code, out, err, took = launches.run(
        [*sshd.ssh_option, "--hostfile", hosts, *launches.rank_args("exit-if", "1", "3")],
        timeout=60)
    assert code == 3, err.decode()
    assert took < 10
    assert b"rank 1 (host fc-b) exited with code 3" in err, err.decode()
    assert survivors(launches.marker) == []
    assert _agents_left(sshd) == []


def test_a_remote_ranks_trace_path_is_checked_on_its_host(sshd, launches, tmp_path):
    """The launcher checks FASTCOLL_TRACE's directory for its own ranks only; a remote rank's
    agent checks it on that host before starting the rank, in one line, and the job stops."""
    trace = f"{tmp_path}/none/t.json"
    code, out, err, took = launches.run(
        [*sshd.ssh_option, "--hosts", "fc-a,fc-b", "--coordinator", "127.0.0.1",
         "--env", f"FASTCOLL_TRACE={trace}", *launches.rank_args("env")], timeout=60)
    assert code == 2 and out == b"", err.decode()
    said = (f"fastcoll-launch: on {socket.gethostname()}: FASTCOLL_TRACE must be path.json in an existing "
            f"directory this rank may write to; the directory {tmp_path}/none does not exist "
            f"(FASTCOLL_TRACE={trace!r})")
    assert said.encode() in err, err.decode()
    assert survivors(launches.marker) == []
    assert _agents_left(sshd) == []


def test_sigint_stops_remote_ranks(sshd, launches):
    proc = launches.start([*sshd.ssh_option, "--hosts", "fc-a,fc-b", "--coordinator",
                           "127.0.0.1", *launches.rank_args("sleep")])
    wait_for_lines(proc, b"ready", 2, timeout=30)
    running = _agents_left(sshd)  # the check below must see what it checks for
    assert sum("ssh -F" in cmd for _, cmd in running) == 2 and len(running) == 4, running
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert survivors(launches.marker) == []
    assert _agents_left(sshd) == []


@pytest.mark.parametrize("host, words", [
    ("fc-badkey", b"host fc-badkey refused the ssh key"),
    ("fc-down", b"host fc-down refused the ssh connection: no ssh server listens there. Start it "
                b"(macOS: System Settings > General > Sharing > Remote Login; Linux: the sshd service)"),
])
def test_ssh_failure_names_the_host(sshd, launches, host, words):
    code, out, err, took = launches.run(
        [*sshd.ssh_option, "--hosts", f"fc-a,{host}", "--coordinator", "127.0.0.1",
         *launches.rank_args("sleep")], timeout=60)
    assert code == 255, err.decode()
    assert words in err, err.decode()
    assert took < 15
    assert survivors(launches.marker) == []


def test_check_passes_and_fails_with_a_table(sshd, launches):
    good = sshd.hostfile([{"ssh": "fc-a", "ips": ["127.0.0.1"]},
                          {"ssh": "fc-b", "ips": ["127.0.0.1"]}], "good.json")
    code, out, err, _ = launches.run([*sshd.ssh_option, "--check", "--hostfile", good],
                                     timeout=60)
    text = out.decode()
    assert code == 0, text + err.decode()
    assert re.search(r"^fc-a\s+ok\s+\d+\.\d+\.\d+\s+\S+.*\bok$", text, re.M), text
    assert "fc-b -> fc-a 127.0.0.1:" in text and "all hosts ok" in text

    bad = sshd.hostfile([{"ssh": "fc-a", "ips": ["127.0.0.1"]}, {"ssh": "fc-down"},
                         {"ssh": "fc-b", "ips": ["10.255.255.1"]}], "bad.json")
    code, out, err, _ = launches.run([*sshd.ssh_option, "--check", "--hostfile", bad],
                                     timeout=60)
    text = out.decode()
    assert code == 1, text + err.decode()
    assert re.search(r"^fc-down\s+FAIL.*refused the ssh connection: no ssh server listens there", text,
                     re.M), text
    assert re.search(r"^fc-b\s+ok.*FAIL: listed address 10.255.255.1 is not this host's", text,
                     re.M), text
    assert "some hosts FAILED" in text
    assert _agents_left(sshd) == []


def test_remote_ranks_stop_when_the_launcher_is_killed(sshd, launches):
    # SIGKILL cannot be forwarded; ssh's input ends instead, and the remote helper stops its rank.
    proc = launches.start([*sshd.ssh_option, "--hosts", "fc-a,fc-b", "--coordinator",
                           "127.0.0.1", "--grace", "1", *launches.rank_args("sleep")])
    wait_for_lines(proc, b"ready", 2, timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher's group: itself only
    proc.wait(timeout=10)
    assert survivors(launches.marker, wait=5.0) == []
    assert _agents_left(sshd) == []


def test_max_restarts_over_ssh(sshd, launches):
    """The ssh path: rank 1 (on fc-b) fails on the first attempt; every rank is started again
    over ssh with a fresh token and FASTCOLL_RESTART_COUNT=1, and the job succeeds."""
    code, out, err, _ = launches.run(
        [*sshd.ssh_option, "--hosts", "fc-a,fc-b", "--coordinator", "127.0.0.1",
         "--max-restarts", "1", *launches.rank_args("fail-first", "1", "3")], timeout=90)
    assert code == 0, err.decode()
    assert b"rank 1 (host fc-b) exited with code 3" in err, err.decode()
    runs: dict[str, list[dict]] = {}
    for line in out.decode().splitlines():
        m = re.fullmatch(r"\[(\d)\] (\{.*\})", line)
        if m:
            info = json.loads(m.group(2))
            runs.setdefault(info["FASTCOLL_RESTART_COUNT"], []).append(info)
    assert sorted(runs) == ["0", "1"], out.decode()
    assert sorted(r["FASTCOLL_RANK"] for r in runs["1"]) == ["0", "1"]
    assert runs["0"][0]["FASTCOLL_TOKEN"] != runs["1"][0]["FASTCOLL_TOKEN"]
    assert survivors(launches.marker) == []
    assert _agents_left(sshd) == []


@pytest.mark.parametrize("said, advice", [
    ("ssh: connect to host 127.0.0.1 port 22: Connection refused",
     "host mac2 refused the ssh connection: no ssh server listens there. Start it (macOS: System Settings > "
     "General > Sharing > Remote Login; Linux: the sshd service), or, if it listens on another port, name the "
     "port in ~/.ssh/config (Host mac2 / Port N) or with --ssh 'ssh -p N' "
     "[ssh: ssh: connect to host 127.0.0.1 port 22: Connection refused]"),
    ("ssh: connect to host 10.0.0.9 port 22: Connection timed out",
     "host mac2 is unreachable over ssh: check its name or address and the network between here and there, "
     "then that `ssh mac2 true` works [ssh: ssh: connect to host 10.0.0.9 port 22: Connection timed out]"),
    ("kex_exchange_identification: Connection closed by remote host",
     "host mac2 closed the ssh connection before the login finished: check that `ssh mac2 true` works (a "
     "firewall, or sshd's MaxStartups, can drop connections) "
     "[ssh: kex_exchange_identification: Connection closed by remote host]"),
])
def test_an_ssh_failure_comes_with_advice(said, advice):
    """No sshd needed: the sentence for what ssh said when it could not reach a host."""
    from fastcoll.launch.remote import explain_ssh_failure

    assert explain_ssh_failure("mac2", 255, [said.encode() + b"\r\n"], "python3") == advice


def test_the_ssh_config_advice_for_user_at_host_is_valid_ssh_config(tmp_path):
    """For `root@localhost` the advice names the lines `Host localhost` and `User root` (a Host
    line takes a name, not user@host), and `ssh -G` reads those lines as meaning that host."""
    from fastcoll.launch.remote import explain_ssh_failure

    said = b"ssh: connect to host 127.0.0.1 port 22: Connection refused\r\n"
    why = explain_ssh_failure("root@localhost", 255, [said], "python3")
    assert "(Host localhost / User root / Port N)" in why and "Host root@" not in why, why
    ssh = shutil.which("ssh")
    if ssh is None:
        pytest.skip("no ssh client here to read the lines back")
    lines = why.split("~/.ssh/config (", 1)[1].split(")", 1)[0].replace("Port N", "Port 2222").split(" / ")
    (tmp_path / "config").write_text("".join(line + "\n" for line in lines))
    r = subprocess.run([ssh, "-G", "-F", str(tmp_path / "config"), "localhost"], capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    seen = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert (seen["user"], seen["port"]) == ("root", "2222"), r.stdout
