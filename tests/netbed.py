"""The multi-host bed where every host has cores of its own (the lent GPU machine's 16 CPUs),
built with pyroute2 and plain system calls: that machine has no `ip`, `tc`, `iptables`, `nft`
or sshd, and nothing can be installed there but carried wheels.

Layout (N = 2..4 hosts), the addresses of `tests/netns.py`'s bed::

    <prefix>-sw     the "switch": bridges swm (management) and swd0 (the data link, unshaped)
    <prefix>-hI     host I: m0 10.201.0.I (management), d0 10.202.0.I (data)
    <prefix>-ctl    where launchers run: m0 10.201.0.254 on the management bridge only

The data link d0 is either a veth pair into the bridge swd0 (`set_link()`: unshaped, the
kernel's own speed) or a tap device served by `bench/bedlink.c` (`set_link(delay_us, rate_bps)`):
a switch in user space that holds each frame for the one-way delay and serializes it at the rate,
since that kernel has no netem. The address and name stay `d0` either way, so hostfiles and
`FI_TCP_IFACE=d0` hold across settings.

Processes enter a host through `<root>/bin/ssh` (this file's `ssh` command): it joins the
host's network namespace, takes a UTS namespace of its own named after the host (ranks of
different hosts see different hostnames, so fastcoll keeps them on the network), is pinned to
the host's cores, and runs the command with the login shell, as ssh would: `fastcoll-launch
--ssh`, `mlx.launch` and MPICH's hydra (through PATH) start ranks through it unchanged.
Launchers run in the ctl namespace on cores of their own (`in_ctl`); bedlink on one more.

The prefix is `fcbed-<pid>-<start time>`; `python tests/netbed.py --cleanup` removes the
namespaces of beds whose owner is dead. `python tests/netbed.py --smoke [HOSTS]` builds a bed,
checks every host reaches every other over both kinds of link, and tears it down.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

BASE = "fcbed"
MGMT_NET, DATA_NET = "10.201.0.", "10.202.0."
CTL_ADDR = MGMT_NET + "254"
NETNS_DIR = "/run/netns"
CLONE_NEWNET, CLONE_NEWUTS = 0x40000000, 0x04000000
TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
HERE = Path(__file__).resolve()
BEDLINK_C = HERE.parent.parent / "bench" / "bedlink.c"
# What a login over ssh would see of the launcher's environment: the rest is the job's to pass.
SSH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "LOGNAME", "SHELL", "TERM", "PYTHONPATH",
           "LD_LIBRARY_PATH", "TMPDIR")


class Unavailable(RuntimeError):
    """The bed cannot be built here; the message says why."""


_libc = ctypes.CDLL(None, use_errno=True)


def _enter_netns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def ns_pids(ns: str) -> list[int]:
    """Every live process whose network namespace is `ns` (by the namespace's inode)."""
    try:
        ino = os.stat(os.path.join(NETNS_DIR, ns)).st_ino
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/net").st_ino == ino:
                    found.append(int(name))
            except OSError:
                pass
    return found


def empty_namespaces(names: Sequence[str], wait: float = 10.0) -> None:
    """SIGKILL every process in the namespaces `names` until none is left (or `wait` passed)."""
    deadline = time.monotonic() + wait
    me = os.getpid()
    while time.monotonic() < deadline:
        pids = [p for ns in names for p in ns_pids(ns) if p != me and _alive(p)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """False for a gone process or a zombie (already dead; only its parent can reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cleanup_leftovers(base: str = BASE) -> list[str]:
    """Delete the namespaces of beds whose owner process is gone, killing what runs in them."""
    from pyroute2 import netns as pr_netns

    owned = re.compile(rf"^{base}-(\d+)-(\d+)-")
    stale = [ns for ns in (os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else [])
             if (m := owned.match(ns)) and start_time(int(m.group(1))) != m.group(2)]
    empty_namespaces(stale)
    for ns in stale:
        pr_netns.remove(ns)
    return stale


def plan_cores(hosts: int, cpus: int) -> tuple[list[list[int]], list[int], int | None]:
    """(each host's cores, the launchers' cores, bedlink's core). With 8 CPUs or more: up to 4
    a host, bedlink on the last CPU, the launchers on what is left between; with fewer (a
    development VM) nothing is pinned, and the record must say the cores were shared."""
    if cpus < 8:
        every = list(range(cpus))
        return [every] * hosts, every, None
    per = min(4, (cpus - 2) // hosts)
    cores = [list(range(i * per, (i + 1) * per)) for i in range(hosts)]
    return cores, list(range(hosts * per, cpus - 1)), cpus - 1


@dataclass
class Host:
    index: int
    name: str  # its hostname, its name in hostfiles and to the bed's ssh
    ns: str
    mgmt: str
    data: tuple[str, ...]
    cores: list[int] = field(default_factory=list)


class Bed:
    """`Bed(hosts=4).build()`; `set_link(50, 10**9)` shapes the data link; `teardown()` removes
    everything (also at exit); `with Bed(4) as bed:` builds and tears down around a block. Offers
    what `bench/multihost.Hosts` uses of `netns.TestBed`."""

    def __init__(self, hosts: int = 2, base: str = BASE, cpus: int | None = None) -> None:
        if not 2 <= hosts <= 4:
            raise ValueError("2 to 4 hosts")
        self.n = hosts
        self.prefix = f"{base}-{os.getpid()}-{start_time(os.getpid())}-{time.monotonic_ns() % 10**6}"
        self.switch, self.ctl = f"{self.prefix}-sw", f"{self.prefix}-ctl"
        cores, self.ctl_cores, self.relay_core = plan_cores(hosts, cpus or os.cpu_count() or 1)
        self.hosts = [Host(i, f"host{i}", f"{self.prefix}-h{i}", f"{MGMT_NET}{i}", (f"{DATA_NET}{i}",),
                           cores[i - 1]) for i in range(1, hosts + 1)]
        self.root: Path | None = None
        self.link = "unshaped"
        self._made: list[str] = []
        self._taps: list[int] = []
        self._relay: subprocess.Popen | None = None
        self._closed = False

    # ---- building

    def __enter__(self) -> "Bed":
        return self.build()

    def __exit__(self, *exc) -> None:
        self.teardown()

    def build(self) -> "Bed":
        if os.geteuid() != 0 or not sys.platform.startswith("linux"):
            raise Unavailable("the bed needs Linux and root (network namespaces)")
        try:
            import pyroute2  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"pyroute2 is not importable ({e}); carry its wheel") from e
        cleanup_leftovers()
        atexit.register(self.teardown)
        try:
            self.root = Path(tempfile.mkdtemp(prefix=self.prefix + "-"))
            self._build_network()
            self._write_tools()
        except Exception as e:
            self.teardown()
            raise Unavailable(f"cannot build the bed: {e}") from e
        return self

    def _build_network(self) -> None:
        from pyroute2 import NetNS

        for ns in [self.switch, *(h.ns for h in self.hosts), self.ctl]:
            self._netns(ns)
        with NetNS(self.switch) as sw:
            for br in ("swm", "swd0"):
                sw.link("add", ifname=br, kind="bridge")
                sw.link("set", index=sw.link_lookup(ifname=br)[0], state="up")
        for h in self.hosts:
            self._veth(h.ns, f"h{h.index}m", "m0", "swm", h.mgmt)
            self._veth(h.ns, f"h{h.index}d0", "d0", "swd0", h.data[0])
        self._veth(self.ctl, "ctlm", "m0", "swm", CTL_ADDR)

    def _netns(self, ns: str) -> None:
        from pyroute2 import NetNS
        from pyroute2 import netns as pr_netns

        pr_netns.create(ns)
        self._made.append(ns)
        # No IPv6: nothing but the job's IPv4 on the links (no router solicitations, no DAD).
        self._in_ns(ns, lambda: [Path(f"/proc/sys/net/ipv6/conf/{c}/disable_ipv6").write_text("1")
                                 for c in ("all", "default")
                                 if Path(f"/proc/sys/net/ipv6/conf/{c}").exists()])
        with NetNS(ns) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

    def _in_ns(self, ns: str, fn):
        """fn() with this thread in namespace `ns` (a tap is made where its opener is)."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _enter_netns(os.path.join(NETNS_DIR, ns))
            return fn()
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the builder's namespace")
            os.close(home)

    def _veth(self, ns: str, port: str, dev: str, bridge: str, addr: str) -> None:
        """A veth pair: `port` in the switch (a port of `bridge`), `dev` in `ns` with `addr`."""
        from pyroute2 import NetNS

        with NetNS(self.switch) as sw:
            sw.link("add", ifname=port, kind="veth", peer={"ifname": dev, "net_ns_fd": ns})
            sw.link("set", index=sw.link_lookup(ifname=port)[0],
                    master=sw.link_lookup(ifname=bridge)[0], state="up")
        self._address(ns, dev, addr)

    def _address(self, ns: str, dev: str, addr: str) -> None:
        from pyroute2 import NetNS

        with NetNS(ns) as ipr:
            idx = ipr.link_lookup(ifname=dev)[0]
            ipr.addr("add", index=idx, address=addr, prefixlen=24)
            ipr.link("set", index=idx, state="up")

    def _write_tools(self) -> None:
        """bed.json (what `ssh`/`exec` read) and bin/ssh, first on the PATH of launchers."""
        assert self.root is not None
        spec = {"hosts": [asdict(h) for h in self.hosts],
                "ctl": {"name": "launcher", "ns": self.ctl, "cores": self.ctl_cores}}
        (self.root / "bed.json").write_text(json.dumps(spec))
        bindir = self.root / "bin"
        bindir.mkdir()
        ssh = bindir / "ssh"
        ssh.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE} ssh {self.root / 'bed.json'} \"$@\"\n")
        ssh.chmod(0o755)

    # ---- the data link

    def set_link(self, delay_us: float | None = None, rate_bps: int | None = None) -> None:
        """Unshaped (no arguments: veths into a bridge), or every host's d0 through bedlink with
        this one-way delay and rate (either may be 0)."""
        if delay_us is None and rate_bps is None:
            if self._relay is not None:
                self._stop_relay()
                for h in self.hosts:
                    self._veth(h.ns, f"h{h.index}d0", "d0", "swd0", h.data[0])
            self.link = "unshaped"
            return
        if self._relay is None:
            self._start_relay()
        got = self._relay_say(f"set {int((delay_us or 0) * 1000)} {int(rate_bps or 0)}")
        if not got.startswith("ok"):
            raise RuntimeError(f"bedlink did not take the setting: {got!r}")
        self.link = f"{(rate_bps or 0) / 1e9:g}gbit+{delay_us or 0:g}us"

    def _start_relay(self) -> None:
        from pyroute2 import NetNS

        assert self.root is not None
        exe = Path(os.environ.get("BEDLINK") or self.root / "bedlink")  # BEDLINK: one built elsewhere
        if not exe.exists():
            if not shutil.which("gcc"):
                raise Unavailable("no gcc to build bench/bedlink.c: set BEDLINK to a built one")
            subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(BEDLINK_C)], check=True,
                           capture_output=True, timeout=60)
        if not os.path.exists("/dev/net/tun"):  # CONFIG_TUN is built in; a bare /dev may lack the node
            os.makedirs("/dev/net", exist_ok=True)
            os.mknod("/dev/net/tun", stat.S_IFCHR | 0o666, os.makedev(10, 200))
        for h in self.hosts:
            with NetNS(self.switch) as sw:
                found = sw.link_lookup(ifname=f"h{h.index}d0")
                if found:
                    sw.link("del", index=found[0])  # its peer d0 goes with it
            self._taps.append(self._in_ns(h.ns, _open_tap))
            self._address(h.ns, "d0", h.data[0])
        self._relay = subprocess.Popen([str(exe), "86400", *map(str, self._taps)], pass_fds=self._taps,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.relay_core is not None:
            os.sched_setaffinity(self._relay.pid, {self.relay_core})
        line = self._relay.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"bedlink did not start: {line!r}")

    def _relay_say(self, line: str) -> str:
        assert self._relay is not None and self._relay.stdin and self._relay.stdout
        self._relay.stdin.write(line + "\n")
        self._relay.stdin.flush()
        return self._relay.stdout.readline().strip()

    def relay_stats(self) -> dict:
        """bedlink's counters: frames late on their due time (mean, max ns), per port in/out."""
        if self._relay is None:
            return {}
        words = self._relay_say("stats").split()[1:]
        return dict(w.split("=", 1) for w in words)

    def probe_link(self, port: int = 47000, count: int = 500, mib: int = 64) -> dict:
        """host1 -> host2 over d0 (tests/linkprobe.py): round trips, one stream of `mib` MiB, and
        bedlink's lateness meanwhile; {"error": ...} where the probe failed."""
        probe = [sys.executable, str(HERE.parent / "linkprobe.py")]
        server = subprocess.Popen(self.in_host(2, [*probe, "serve", str(port), "60"]), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        try:
            server.stdout.readline()  # "listening"
            self.relay_stats()  # bedlink counts lateness from here
            done = subprocess.run(self.in_host(1, [*probe, "probe", self.host(2).data[0], str(port), str(count),
                                                   str(mib)]), capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                return {"error": done.stderr[-500:], "bedlink": self.relay_stats()}
            return json.loads(done.stdout.strip().splitlines()[-1]) | {"bedlink": self.relay_stats()}
        finally:
            server.kill()
            server.wait()
            self.kill_strays()

    def _stop_relay(self) -> None:
        if self._relay is not None:
            try:
                self._relay.stdin.close()
                self._relay.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._relay.kill()
                self._relay.wait()
            self._relay = None
        for fd in self._taps:
            os.close(fd)  # the last holder gone, the tap device goes too
        self._taps.clear()

    # ---- using it (the names netns.TestBed has, for bench/multihost.Hosts)

    @property
    def ssh_command(self) -> str:
        assert self.root is not None
        return str(self.root / "bin" / "ssh")

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    def in_ctl(self, argv: Sequence[str]) -> list[str]:
        """argv run in the ctl namespace, named "launcher", on the launchers' cores."""
        assert self.root is not None
        return [sys.executable, str(HERE), "exec", str(self.root / "bed.json"), "ctl", "--", *argv]

    def in_host(self, i: int, argv: Sequence[str]) -> list[str]:
        assert self.root is not None
        return [sys.executable, str(HERE), "exec", str(self.root / "bed.json"), self.host(i).name, "--", *argv]

    def hostfile(self, hosts: Sequence[int], *, slots: int = 1, links: int = 1, name: str | None = None,
                 fmt: str = "mpirun") -> str:
        assert self.root is not None
        chosen = [self.host(i) for i in hosts]
        if fmt == "json":
            text = json.dumps({"hosts": [{"ssh": h.name, "ips": list(h.data), "slots": slots} for h in chosen]})
        elif fmt == "mlx":  # mlx.launch's --hostfile: a list of hosts, one process each
            text = json.dumps([{"ssh": h.name, "ips": list(h.data)} for h in chosen])
        else:
            text = "".join(f"{h.name} slots={slots} ips={','.join(h.data)}\n" for h in chosen)
        path = self.root / (name or f"hosts-{'-'.join(map(str, hosts))}-{slots}.{fmt}")
        path.write_text(text)
        return str(path)

    def launcher_env(self, **extra: str) -> dict:
        """This environment without FASTCOLL_* settings, bin/ssh first on PATH, plus `extra`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCOLL_")}
        env["PATH"] = f"{self.root}/bin:{os.path.dirname(sys.executable)}:{env.get('PATH', '')}"
        env.update(extra)
        return env

    def kill_strays(self) -> None:
        """Kill everything started in the hosts and the ctl namespace."""
        empty_namespaces([ns for ns in self._made if ns != self.switch])

    def heal(self) -> None:
        self.set_link()

    def describe(self) -> dict:
        """What a record says of the bed: each host's cores, the launchers' and bedlink's."""
        return {"prefix": self.prefix, "cpus": os.cpu_count(), "link": self.link,
                "hosts": [{"name": h.name, "mgmt": h.mgmt, "data": list(h.data), "cores": h.cores}
                          for h in self.hosts],
                "launcher_cores": self.ctl_cores, "bedlink_core": self.relay_core,
                "pinned": self.relay_core is not None}

    # ---- tearing down

    def teardown(self) -> None:
        """Stop bedlink, kill every process in the bed's namespaces, delete them (and every
        veth, tap and bridge with them), remove the temp folder. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        from pyroute2 import netns as pr_netns

        self._stop_relay()
        empty_namespaces(self._made)
        for ns in reversed(self._made):
            pr_netns.remove(ns)
        self._made.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.teardown)


LINK_UNITS = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3}


def parse_link(text: str) -> tuple[float | None, int | None]:
    """`set_link`'s (one-way delay in us, rate in bit/s) of a link as bench/hostbed.py names it:
    `unshaped`, `1gbit+50us`, `0+200us` (a delay alone) or `1gbit` (a rate alone)."""
    if text == "unshaped":
        return None, None
    rate, _, delay = text.partition("+")
    bps = 0
    if rate not in ("", "0"):
        unit = next((u for u in LINK_UNITS if rate.endswith(u)), None)
        if unit is None:
            raise ValueError(f"link {text!r}: the rate must end in gbit, mbit or kbit (or be 0)")
        bps = int(float(rate.removesuffix(unit)) * LINK_UNITS[unit])
    if delay and not delay.endswith("us"):
        raise ValueError(f"link {text!r}: the delay must end in us")
    return float(delay.removesuffix("us") or 0), bps


def kernel_has_tbf() -> str:
    """Whether a tbf qdisc can be added here (through netlink, in a scratch namespace): "yes", or
    why not. The record says it; the bed's rate is bedlink's either way, one model for both."""
    from pyroute2 import NetNS
    from pyroute2 import netns as pr_netns

    ns = f"{BASE}-{os.getpid()}-{start_time(os.getpid())}-tbf"
    pr_netns.create(ns)
    try:
        with NetNS(ns) as ipr:
            ipr.link("add", ifname="t0", kind="veth", peer={"ifname": "t1"})
            idx = ipr.link_lookup(ifname="t0")[0]
            ipr.tc("add", "tbf", index=idx, handle="1:", rate="1gbit", burst=262144, latency="20ms")
            return "yes"
    except Exception as e:  # the answer is the record's, not a failure of the run
        return f"no: {e}"
    finally:
        pr_netns.remove(ns)


def _open_tap() -> int:
    """A tap device d0 in this thread's namespace, its frames with a virtio_net_hdr so that
    TCP's 64 KiB batches cross bedlink whole (TSO on), not as 1500-byte frames."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"d0", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    except OSError:
        os.close(fd)
        raise
    return fd


# --------------------------------------------------------------------------- entering a host


def _enter(spec_path: str, name: str) -> None:
    """Join host `name`'s (or "ctl"'s) namespace, hostname and cores; for `ssh` and `exec`."""
    spec = json.loads(Path(spec_path).read_text())
    where = spec["ctl"] if name == "ctl" else next((h for h in spec["hosts"] if h["name"] == name), None)
    if where is None:
        sys.exit(f"ssh: Could not resolve hostname {name}: not a host of the bed")
    _enter_netns(os.path.join(NETNS_DIR, where["ns"]))
    if _libc.unshare(CLONE_NEWUTS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
    socket.sethostname(where["name"])
    os.sched_setaffinity(0, where["cores"])


_SSH_FLAGS_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def parse_ssh(args: Sequence[str]) -> tuple[str, str, bool]:
    """(host, the remote command as ssh joins it, whether -G asked for the configuration) of an
    ssh command line; ValueError without a host."""
    i, show_config = 0, False
    while i < len(args) and args[i].startswith("-") and len(args[i]) > 1:
        flag = args[i][1]
        show_config |= flag == "G"
        i += 2 if flag in _SSH_FLAGS_WITH_VALUE and len(args[i]) == 2 else 1
    if i >= len(args):
        raise ValueError("usage: ssh [options] HOST [COMMAND...]")
    return args[i], " ".join(args[i + 1:]), show_config


def ssh_main(spec_path: str, args: list[str]) -> None:
    """`ssh [options] HOST [COMMAND...]` into a host of the bed: the command through the login
    shell in the home folder, with the environment a login would have (SSH_ENV)."""
    try:
        host, command, show_config = parse_ssh(args)
    except ValueError as e:
        sys.exit(str(e))
    if show_config:  # what `ssh -G` prints, for the launcher's check of which network is ssh's
        spec = json.loads(Path(spec_path).read_text())
        addr = next((h["mgmt"] for h in spec["hosts"] if h["name"] == host), host)
        print(f"hostname {addr}")
        return
    _enter(spec_path, host.rpartition("@")[2])
    home = pwd.getpwuid(os.getuid()).pw_dir
    shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    env = {k: v for k, v in os.environ.items() if k in SSH_ENV}
    os.chdir(home)
    if command:
        os.execve(shell, [shell, "-c", command], env)
    os.execve(shell, [shell, "-l"], env)


def smoke(hosts: int) -> int:
    """Build, check every host reaches every other (unshaped and through bedlink), tear down."""
    bed = Bed(hosts).build()
    try:
        print(f"bed {bed.prefix}: hosts' cores {[h.cores for h in bed.hosts]}, launchers {bed.ctl_cores}, "
              f"bedlink {bed.relay_core}")
        for setting in ((None, None), (200, 10**9)):
            bed.set_link(*setting)
            for h in bed.hosts:
                for peer in bed.hosts:
                    if peer is not h:
                        probe = f"import socket; socket.create_connection(('{peer.data[0]}', 9), 2)"
                        done = subprocess.run(bed.in_host(h.index, [sys.executable, "-c", probe]),
                                              capture_output=True, text=True, timeout=30)
                        refused = "ConnectionRefused" in done.stderr  # an RST came back: reached
                        print(f"{bed.link}: {h.name} -> {peer.name}: {'ok' if refused else done.stderr[-200:]}")
                        if not refused:
                            return 1
        print("stats", bed.relay_stats())
        return 0
    finally:
        bed.teardown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["ssh"] and len(sys.argv) > 3:
        ssh_main(sys.argv[2], sys.argv[3:])
    elif sys.argv[1:2] == ["exec"] and len(sys.argv) > 5 and sys.argv[4] == "--":
        _enter(sys.argv[2], sys.argv[3])
        os.execvp(sys.argv[5], sys.argv[5:])
    elif sys.argv[1:] == ["--cleanup"]:
        for ns in cleanup_leftovers():
            print("removed", ns)
    elif sys.argv[1:2] == ["--smoke"]:
        sys.exit(smoke(int(sys.argv[2]) if len(sys.argv) > 2 else 2))
    else:
        print("usage: python tests/netbed.py --smoke [HOSTS] | --cleanup | ssh BED.json ... | exec BED.json HOST -- ARGV")
        sys.exit(2)
