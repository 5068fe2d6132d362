"""A multi-host test bed on one Linux machine, made of network namespaces.

Layout (N = 2..4 hosts, K = 1 or 2 data links per host)::

    <prefix>-sw     the "switch": bridges swm (management), swd0 and swd1 (data links 0 and 1)
    <prefix>-hI     host I: m0 10.201.0.I (management, ssh), d0 10.202.0.I, d1 10.203.0.I;
                    its own sshd on 10.201.0.I:22, run in a UTS namespace whose hostname is
                    "hostI", so ranks of different hosts see different hostnames (and fastcoll
                    keeps them on the network), ranks of one host the same one (shared memory)
    <prefix>-ctl    where the launcher runs: m0 10.201.0.254 on the management bridge only

Each host link is a veth pair: `mK`/`dK` in the host, `hIm`/`hIdK` in the switch (a bridge
port). Every address lives inside these namespaces; nothing touches the machine's own
interfaces, routes or addresses. `ssh -F <root>/ssh_config hostI` reaches host I (as root, with
a throwaway key), from the ctl namespace.

Faults: `cut(host, link)` sets the host's switch port down (a pulled cable: packets vanish
without an error), `drop_one_way(src, dst)` drops the IP packets src sends to dst on every data
link (an htb qdisc on src's data device whose u32 filter sends them to a `pfifo limit 0`:
this kernel has no netem, no gact action and no iptables/nft tools, but htb, u32 and pfifo),
`vanish(host)` pulls every cable of the host (management too), `blackhole(host)` drops what
the switch forwards to it (links up: senders back off as over a failing switch), `shape(rate)`
rate-limits every data link (a tbf qdisc on each host's data devices), `set_hostname(host,
name)` renames a host (two hosts of one name look like one machine to fastcoll: they share
/dev/shm, the mount namespace being the machine's), `heal()` undoes all of it.

The prefix is `fcmh-<pid>-<start time>` of the process that builds the bed, so two runs never
share names and a later run can tell a crashed run's leftovers (its owner is dead) from a live
run's; `cleanup_leftovers()` kills what is still running in them and deletes them, and
`python tests/netns.py --cleanup` does the same by hand.

Standard library only.
"""

from __future__ import annotations

import atexit
import getpass
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

BASE = "fcmh"
MGMT_NET = "10.201.0."
DATA_NETS = ("10.202.0.", "10.203.0.")
CTL_ADDR = MGMT_NET + "254"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def sshd_config(root: Path, listen: str, port: int, pid_file: str, extra: str = "") -> str:
    """A test sshd's configuration: keys only (`root`/host_key, `root`/authorized_keys), no
    PAM, many sessions at once (a launcher opens one per host and rank); `extra`: more lines.
    Also used by tests/test_launch_ssh.py's loopback sshd."""
    return f"""
Port {port}
ListenAddress {listen}
HostKey {root}/host_key
PidFile {root}/{pid_file}
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
MaxStartups 100
MaxSessions 100
""" + extra
# Runs "$@" with hostname "$0" in a new UTS namespace (`unshare --uts` without --fork execs,
# so the pid stays the one Popen returned).
_WITH_HOSTNAME = 'hostname "$0" && exec "$@"'


class Unavailable(RuntimeError):
    """The test bed cannot be built here; the message says why (the tests skip with it)."""


# --------------------------------------------------------------------------- small helpers


# A sanitized run (.ci/sanitizers) preloads ASan's runtime into the test's processes; sshd is not
# the code under test, and its sessions pass the runtime on to the ranks only where asked (--env).
SANITIZER_VARIABLES = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")


def without_sanitizers(environ: dict) -> dict:
    return {k: v for k, v in environ.items() if k not in SANITIZER_VARIABLES}


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0,
         input: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(pid: int, start: str) -> bool:
    return _start_time(pid) == start


def netns_list() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`."""
    done = _run(["ip", "netns", "pids", ns], check=False)
    return [int(w) for w in done.stdout.split() if w.isdigit()]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _kill(pids: Iterable[int]) -> None:
    me = os.getpid()
    for pid in pids:
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _empty_namespaces(names: Sequence[str], keep: Iterable[int] = (), wait: float = 10.0) -> None:
    """SIGKILL every process in the namespaces `names` (but `keep`) until none is left."""
    keep = set(keep)
    deadline = time.monotonic() + wait
    while True:
        # A zombie has no cmdline and is already dead; only its parent can reap it.
        pids = [p for ns in names for p in netns_pids(ns) if p not in keep and cmdline(p)]
        if not pids or time.monotonic() > deadline:
            return
        _kill(pids)
        time.sleep(0.05)


_OWNED = re.compile(rf"^{BASE}-(\d+)-(\d+)(?:-|$)")


def cleanup_leftovers(base: str = BASE) -> list[str]:
    """Delete the namespaces and temp folders of beds whose owner process is gone (a crashed or
    killed run), first killing whatever still runs in them. Returns what it removed."""
    removed = []
    stale = []
    for ns in netns_list():
        m = _OWNED.match(ns)
        if ns.startswith(base + "-") and m and not _owner_alive(int(m.group(1)), m.group(2)):
            stale.append(ns)
    _empty_namespaces(stale)
    for ns in stale:
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(ns)
    for d in glob.glob(os.path.join(tempfile.gettempdir(), base + "-*")):
        m = _OWNED.match(os.path.basename(d))
        if m and not _owner_alive(int(m.group(1)), m.group(2)):
            # sshd listeners of a bed whose namespaces are gone already died with them; any
            # process still naming this folder (a stray sshd, a rank) belongs to that run.
            _kill(p for p in all_pids() if d in cmdline(p))
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


# --------------------------------------------------------------------------- the launcher run


class Run:
    """A process started in the ctl namespace (the launcher), its output collected by threads
    with arrival times, so a test can wait for lines while it runs."""

    def __init__(self, argv: Sequence[str], env: dict, cwd: str) -> None:
        self.argv = list(argv)
        self.started = time.time()
        self.lines: list[tuple[float, str, str]] = []  # (time.time(), "out"/"err", text)
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.ended: float | None = None
        self._threads = [threading.Thread(target=self._pump, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, name: str) -> None:
        for raw in stream:
            with self._cond:
                self.lines.append((time.time(), name, raw.decode(errors="replace").rstrip("\n")))
                self._cond.notify_all()
        stream.close()

    def wait_for(self, needle: str, count: int, timeout: float) -> bool:
        """True once `count` lines of stdout contain `needle`; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if sum(needle in t for _, s, t in self.lines if s == "out") >= count:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None
                                 and not any(t.is_alive() for t in self._threads)):
                    return False
                self._cond.wait(min(left, 0.1))

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it ran past `timeout` (then it is killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self.ended = time.time()
        for t in self._threads:
            t.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(timeout=10)

    def text(self, stream: str | None = None) -> str:
        with self._cond:
            return "\n".join(t for _, s, t in self.lines if stream in (None, s))

    @property
    def out(self) -> str:
        return self.text("out")

    @property
    def err(self) -> str:
        return self.text("err")


# --------------------------------------------------------------------------- the bed


@dataclass
class Host:
    index: int
    name: str  # its hostname, and its name in ssh_config and the hostfiles
    ns: str
    mgmt: str
    data: tuple[str, ...]
    sshd: subprocess.Popen | None = None


class TestBed:
    """`TestBed(hosts=4, data_links=2).build()`; `teardown()` removes everything (also at exit)."""

    __test__ = False  # not a pytest test class

    def __init__(self, hosts: int = 4, data_links: int = 2, base: str = BASE) -> None:
        if not 2 <= hosts <= 4 or data_links not in (1, 2):
            raise ValueError("2 to 4 hosts, 1 or 2 data links")
        self.n = hosts
        self.links = data_links
        self.prefix = f"{base}-{os.getpid()}-{_start_time(os.getpid())}"
        self.switch = f"{self.prefix}-sw"
        self.ctl = f"{self.prefix}-ctl"
        self.hosts = [
            Host(i, f"host{i}", f"{self.prefix}-h{i}", f"{MGMT_NET}{i}",
                 tuple(f"{DATA_NETS[k]}{i}" for k in range(data_links)))
            for i in range(1, hosts + 1)
        ]
        self.root: Path | None = None
        self.ssh_config: Path | None = None
        self._made: list[str] = []  # namespaces created, in order
        self._runs: list[Run] = []
        self._renamed: set[int] = set()
        self._holes: set[tuple[int, int]] = set()
        self._closed = False

    # ---- building

    def build(self) -> "TestBed":
        self._prerequisites()
        cleanup_leftovers()
        atexit.register(self.teardown)
        try:
            self.root = Path(tempfile.mkdtemp(prefix=self.prefix + "-"))
            self.root.chmod(0o700)
            self._netns(self.switch)
            try:
                _run(["ip", "netns", "exec", self.switch, "unshare", "--uts", "sh", "-c",
                      _WITH_HOSTNAME, "probe", "true"])
            except RuntimeError as e:
                raise Unavailable(f"cannot make a UTS namespace inside a network namespace: {e}")
            for br in ("swm", *(f"swd{k}" for k in range(self.links))):
                self._ip(self.switch, "link", "add", "name", br, "type", "bridge")
                self._ip(self.switch, "link", "set", "dev", br, "up")
            for h in self.hosts:
                self._netns(h.ns)
                self._wire(h.ns, f"h{h.index}m", "m0", "swm", h.mgmt)
                for k, addr in enumerate(h.data):
                    self._wire(h.ns, f"h{h.index}d{k}", f"d{k}", f"swd{k}", addr)
            self._netns(self.ctl)
            self._wire(self.ctl, "ctlm", "m0", "swm", CTL_ADDR)
            self._ssh_setup()
            for h in self.hosts:
                self._start_sshd(h)
            self._wait_for_ssh()
        except Unavailable:
            self.teardown()
            raise
        except Exception as e:
            self.teardown()
            raise Unavailable(f"cannot build the network-namespace test bed: {e}") from e
        return self

    def _prerequisites(self) -> None:
        if not sys.platform.startswith("linux"):
            raise Unavailable("network namespaces need Linux")
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (run the tests as root)")
        for tool in ("ip", "tc", "unshare", "nsenter", "hostname", SSHD, "ssh", "ssh-keygen"):
            if not shutil.which(tool):
                raise Unavailable(f"{tool} is not installed (iproute2, util-linux, openssh-server)")

    def _netns(self, ns: str) -> None:
        done = _run(["ip", "netns", "add", ns], check=False)
        if done.returncode != 0:
            raise Unavailable(f"ip netns add {ns} failed: {done.stderr.strip()}")
        self._made.append(ns)
        # No IPv6: no router solicitations or DAD in the byte counters, nothing but IPv4 here.
        _run(["ip", "netns", "exec", ns, "sh", "-c",
              "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;"
              "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"], check=False)
        self._ip(ns, "link", "set", "dev", "lo", "up")

    def _wire(self, ns: str, port: str, dev: str, bridge: str, addr: str) -> None:
        """A veth pair: `port` in the switch (a port of `bridge`), `dev` in `ns` with `addr`."""
        self._ip(self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", dev,
                 "netns", ns)
        self._ip(self.switch, "link", "set", "dev", port, "master", bridge, "up")
        self._ip(ns, "addr", "add", f"{addr}/24", "dev", dev)
        self._ip(ns, "link", "set", "dev", dev, "up")

    def _ip(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run(["ip", "-n", ns, *args], check=check)

    @property
    def ssh_command(self) -> str:
        """The ssh command line that reaches the hosts (`fastcoll-launch --ssh`'s value)."""
        return f"{shutil.which('ssh') or 'ssh'} -F {self.ssh_config}"

    def _ssh_setup(self) -> None:
        assert self.root is not None
        for key in ("host_key", "client_key"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / key)])
        (self.root / "authorized_keys").write_text((self.root / "client_key.pub").read_text())
        if not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755)  # sshd's privilege separation directory
        user = getpass.getuser()
        blocks = [f"Host {h.name}\n  HostName {h.mgmt}\n" for h in self.hosts]
        self.ssh_config = self.root / "ssh_config"
        self.ssh_config.write_text("".join(blocks) + f"""
Host *
  User {user}
  Port 22
  IdentityFile {self.root}/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
""")

    def _start_sshd(self, h: Host) -> None:
        assert self.root is not None
        cfg = self.root / f"sshd_config.{h.name}"
        # ClientAliveInterval: a session whose client vanished ends within ~6 s, which ends the
        # launcher's agent there (its input closes) and so its rank, as launch/README.md says.
        cfg.write_text(sshd_config(self.root, h.mgmt, 22, f"sshd.{h.name}.pid",
                                   "UseDNS no\nClientAliveInterval 2\nClientAliveCountMax 3\n"))
        log = open(self.root / f"sshd.{h.name}.log", "wb")
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c", _WITH_HOSTNAME,
             h.name, SSHD, "-D", "-e", "-f", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=without_sanitizers(os.environ))
        log.close()

    def _wait_for_ssh(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        todo = list(self.hosts)
        last = ""
        while todo:
            for h in list(todo):
                if h.sshd is not None and h.sshd.poll() is not None:
                    raise Unavailable(f"sshd on {h.name} exited: {self.sshd_log(h)}")
                done = _run(self.in_ctl(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes",
                                         "-o", "ConnectTimeout=2", h.name, "hostname"]),
                            check=False)
                if done.returncode == 0 and done.stdout.strip() == h.name:
                    todo.remove(h)
                else:
                    last = f"{h.name}: {done.stdout.strip()} {done.stderr.strip()}"
            if todo and time.monotonic() > deadline:
                raise Unavailable(f"sshd in the namespaces does not answer: {last}; "
                                  f"{self.sshd_log(todo[0])}")
            if todo:
                time.sleep(0.1)

    def sshd_log(self, h: Host) -> str:
        assert self.root is not None
        try:
            return (self.root / f"sshd.{h.name}.log").read_text(errors="replace").strip()[-2000:]
        except OSError:
            return ""

    # ---- using it

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    def in_ctl(self, argv: Sequence[str], hostname: str = "launcher") -> list[str]:
        """argv run in the ctl namespace, with a hostname of its own (so no test host is
        "this machine" to the launcher)."""
        return ["ip", "netns", "exec", self.ctl, "unshare", "--uts", "sh", "-c", _WITH_HOSTNAME,
                hostname, *argv]

    def in_host(self, i: int, argv: Sequence[str]) -> list[str]:
        h = self.host(i)
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c", _WITH_HOSTNAME,
                h.name, *argv]

    def hostfile(self, hosts: Sequence[int], *, slots: int = 1, links: int = 1,
                 name: str | None = None, fmt: str = "mpirun", rdma: str | None = None) -> str:
        """Write a hostfile for `hosts` (indices), `slots` ranks each, their first `links`
        data addresses as ips; mpirun style or MLX JSON (`fmt="json"`). `rdma`: a device name
        that each host's `rdma` list (JSON only, as `mlx.distributed_config --backend jaccl`
        writes it) names toward every other host."""
        assert self.root is not None
        if links > self.links:
            raise ValueError(f"the bed has {self.links} data link(s) per host")
        if rdma is not None and fmt != "json":
            raise ValueError("rdma lists are MLX's JSON hostfile's (fmt='json')")
        chosen = [self.host(i) for i in hosts]
        if fmt == "json":
            entries = [{"ssh": h.name, "ips": list(h.data[:links]), "slots": slots} for h in chosen]
            for i, e in enumerate(entries):
                if rdma is not None:
                    e["rdma"] = [None if j == i else rdma for j in range(len(entries))]
            text = json.dumps({"hosts": entries}, indent=1)
        else:
            text = "".join(f"{h.name} slots={slots} ips={','.join(h.data[:links])}\n"
                           for h in chosen)
        path = self.root / (name or f"hosts-{'-'.join(map(str, hosts))}-{slots}x{links}.{fmt}")
        path.write_text(text)
        return str(path)

    def launcher_env(self, **extra: str) -> dict:
        """The test's environment without its FASTCOLL_* settings, plus `extra`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOLL_")}
        env.update(extra)
        return env

    def start_launcher(self, args: Sequence[str], env: dict | None = None,
                       cwd: str | None = None, python: str = sys.executable) -> Run:
        """`fastcoll-launch --ssh 'ssh -F <ssh_config>' ARGS` in the ctl namespace."""
        argv = self.in_ctl([python, "-m", "fastcoll.launch", "--ssh",
                            f"ssh -F {self.ssh_config}", *args])
        run = Run(argv, env if env is not None else self.launcher_env(),
                  cwd or os.getcwd())
        self._runs.append(run)
        return run

    def launch(self, args: Sequence[str], env: dict | None = None, timeout: float = 60.0,
               cwd: str | None = None) -> tuple[int | None, Run]:
        run = self.start_launcher(args, env, cwd)
        return run.wait(timeout), run

    # ---- faults

    def cut(self, i: int, link: int = 0, side: str = "switch") -> None:
        """Pull data cable `link` of host `i`: its switch port down (the host's device then has
        no carrier; packets are lost silently). side="host" downs the host's own device
        instead, which also takes its address's route away (sends fail at once)."""
        if side == "switch":
            self._ip(self.switch, "link", "set", "dev", f"h{i}d{link}", "down")
        else:
            self._ip(self.host(i).ns, "link", "set", "dev", f"d{link}", "down")

    def cut_management(self, i: int) -> None:
        self._ip(self.switch, "link", "set", "dev", f"h{i}m", "down")

    def vanish(self, i: int) -> None:
        """Host `i` drops off every network at once (its processes keep running)."""
        self.cut_management(i)
        for k in range(self.links):
            self.cut(i, k)

    def drop_one_way(self, src: int, dst: int, links: Sequence[int] | None = None) -> None:
        """Drop every IP packet host `src` sends to host `dst` on the data links (all, or
        `links`); dst -> src still flows, and so does ARP. Several calls add up."""
        h = self.host(src)
        for k in (range(self.links) if links is None else links):
            dev = f"d{k}"
            shown = _run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "show", "dev", dev]).stdout
            if "htb 1:" not in shown:
                # No default class: unclassified packets go out directly, unshaped.
                self._tc(h.ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb")
                self._tc(h.ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:9",
                         "htb", "rate", "1mbit")
                self._tc(h.ns, "qdisc", "add", "dev", dev, "parent", "1:9", "handle", "9:",
                         "pfifo", "limit", "0")
            self._tc(h.ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                     "prio", "1", "u32", "match", "ip", "dst",
                     f"{self.host(dst).data[k]}/32", "flowid", "1:9")

    def blackhole(self, i: int, link: int = 0) -> None:
        """Drop every packet the switch forwards to host `i` on data link `link` (a `pfifo
        limit 0` on its switch port): the cable stays in and the host sees a carrier, but
        nothing arrives, so senders lose packets silently and back off as over a failing
        switch. Blackhole both ends of a pair to drop both ways; heal() undoes it."""
        self._tc(self.switch, "qdisc", "replace", "dev", f"h{i}d{link}", "root", "pfifo",
                 "limit", "0")
        self._holes.add((i, link))

    def shape(self, rate: str = "1gbit", burst: str = "256kb", latency: str = "20ms") -> None:
        """Limit every host's data links to `rate` on the way out (a tbf qdisc on each data
        device; a pair's traffic is then limited both ways). heal() takes it off."""
        for h in self.hosts:
            for k in range(self.links):
                self._tc(h.ns, "qdisc", "replace", "dev", f"d{k}", "root", "tbf", "rate", rate,
                         "burst", burst, "latency", latency)

    def set_hostname(self, i: int, name: str) -> None:
        """Give host `i` the hostname `name` (its sshd's UTS namespace, so every session and
        rank started from now on sees it); heal() gives it its own name back."""
        h = self.host(i)
        assert h.sshd is not None
        _run(["nsenter", "-t", str(h.sshd.pid), "-u", "hostname", name])
        if name != h.name:
            self._renamed.add(i)

    def dropped(self, src: int) -> int:
        """Packets the one-way drops on host `src` have dropped so far."""
        total = 0
        for k in range(self.links):
            shown = _run(["ip", "netns", "exec", self.host(src).ns, "tc", "-s", "qdisc", "show",
                          "dev", f"d{k}"], check=False).stdout
            m = re.search(r"pfifo 9:.*?dropped (\d+)", shown, re.S)
            total += int(m.group(1)) if m else 0
        return total

    def _tc(self, ns: str, *args: str) -> None:
        _run(["ip", "netns", "exec", ns, "tc", *args])

    def heal(self) -> None:
        """Every cable back in, every drop filter gone."""
        if not self._made:
            return
        cmds = []
        for h in self.hosts:
            cmds.append(f"link set dev h{h.index}m up")
            cmds += [f"link set dev h{h.index}d{k} up" for k in range(self.links)]
        _run(["ip", "-n", self.switch, "-force", "-batch", "-"], check=False,
             input="\n".join(cmds) + "\n")
        for h in self.hosts:
            _run(["ip", "-n", h.ns, "-force", "-batch", "-"], check=False,
                 input="".join(f"link set dev d{k} up\n" for k in range(self.links)))
            _run(["ip", "netns", "exec", h.ns, "tc", "-force", "-batch", "-"], check=False,
                 input="".join(f"qdisc del dev d{k} root\n" for k in range(self.links)))
        if self._holes:
            _run(["ip", "netns", "exec", self.switch, "tc", "-force", "-batch", "-"],
                 check=False, input="".join(f"qdisc del dev h{i}d{k} root\n"
                                            for i, k in sorted(self._holes)))
            self._holes.clear()
        for i in sorted(self._renamed):
            h = self.host(i)
            if h.sshd is not None and h.sshd.poll() is None:
                _run(["nsenter", "-t", str(h.sshd.pid), "-u", "hostname", h.name], check=False)
        self._renamed.clear()

    # ---- looking

    def link_bytes(self, i: int, link: int) -> tuple[int, int]:
        """(bytes host `i` sent, bytes it received) on data link `link`, counted at its switch
        port (the port receives what the host sends)."""
        done = _run(["ip", "-n", self.switch, "-j", "-s", "link", "show", "dev", f"h{i}d{link}"])
        stats = json.loads(done.stdout)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def processes(self) -> dict[str, list[tuple[int, str]]]:
        """What runs in each host (and the ctl) namespace, sshd listeners left out."""
        keep = {h.sshd.pid for h in self.hosts if h.sshd is not None}
        out = {}
        for name, ns in [(h.name, h.ns) for h in self.hosts] + [("ctl", self.ctl)]:
            if ns in self._made:
                found = [(p, cmdline(p)) for p in netns_pids(ns) if p not in keep]
                out[name] = [(p, c) for p, c in found if c]
        return out

    def kill_strays(self) -> None:
        """Kill everything the tests started (launchers, ssh clients, sessions, agents, ranks);
        the sshd listeners stay."""
        for run in self._runs:
            run.kill()
        self._runs.clear()
        keep = [h.sshd.pid for h in self.hosts if h.sshd is not None]
        _empty_namespaces([ns for ns in self._made if ns != self.switch], keep=keep)

    # ---- tearing down

    def teardown(self) -> None:
        """Kill every process in the bed's namespaces, delete them (and with them every veth and
        bridge), remove the temp folder. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for run in self._runs:
            try:
                run.kill()
            except Exception:
                pass
        _empty_namespaces(self._made)
        for h in self.hosts:
            if h.sshd is not None:
                try:
                    h.sshd.kill()
                    h.sshd.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        for ns in reversed(self._made):
            _run(["ip", "netns", "delete", ns], check=False)
        self._made.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        try:
            atexit.unregister(self.teardown)
        except Exception:
            pass


if __name__ == "__main__":
    if sys.argv[1:] == ["--cleanup"]:
        for what in cleanup_leftovers():
            print("removed", what)
    elif sys.argv[1:2] == ["--up"]:
        # Build a bed by hand and keep it until Enter: python tests/netns.py --up [HOSTS]
        bed = TestBed(int(sys.argv[2]) if len(sys.argv) > 2 else 4).build()
        print(f"bed {bed.prefix}: ssh -F {bed.ssh_config} host1 (from: ip netns exec {bed.ctl})")
        try:
            input("Enter tears it down. ")
        finally:
            bed.teardown()
    else:
        print("usage: python tests/netns.py --cleanup | --up [HOSTS]")
