"""Hosts of a job: `--hosts mac1,mac2:2`, an mpirun-style hostfile, or MLX's JSON hostfile.

mpirun style (Open MPI and MPICH spellings), one host per line::

    # comment
    mac1 slots=2            # Open MPI
    mac2:2                  # MPICH
    mac3 slots=1 ips=10.0.0.3   # fastcoll extension: the address ranks use on that host

MLX style (what `mlx.launch` and `mlx.distributed_config` read and write): a JSON list of
``{"ssh": "mac1", "ips": ["10.0.0.1"]}`` objects, one rank each, or an object
``{"backend": ..., "envs": ["K=V"], "hosts": [...]}``. A host's ``"rdma"`` list (as
`mlx.distributed_config --backend jaccl` writes it) names its RDMA device toward each host entry,
in entry order: null for itself and for a host it reaches without RDMA, a device name, or a list
of names (one per cable).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field

from fastcoll.config import parse_rdma_devices

_SLOTS = re.compile(r"[1-9][0-9]*")
# ssh targets: [user@]host, where host is a name, an IPv4 address or an IPv6 address.
_HOST = re.compile(r"(?:[A-Za-z0-9_.+-]+@)?[A-Za-z0-9_.:%-]+")


class HostfileError(ValueError):
    """A hostfile or a --hosts list that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Host:
    """One host entry: the ssh target, how many ranks it takes, and its listed addresses."""

    name: str
    slots: int = 1
    ips: tuple[str, ...] = ()
    # MLX's "rdma": this host's device(s) toward each host entry (None: no RDMA to it); None: no list
    rdma: tuple[tuple[str, ...] | None, ...] | None = None

    @property
    def address(self) -> str:
        """The address the job knows this host by: the first listed ip, or the host name."""
        if self.ips:
            return self.ips[0]
        return self.name.rpartition("@")[2]


@dataclass(frozen=True)
class HostList:
    """The hosts of a job, plus `KEY=VALUE` variables that an MLX hostfile's "envs" adds."""

    hosts: tuple[Host, ...]
    envs: tuple[str, ...] = field(default=())

    @property
    def slots(self) -> int:
        """The total number of ranks the hosts take."""
        return sum(h.slots for h in self.hosts)


def parse_hosts_arg(text: str) -> HostList:
    """Parse `--hosts mac1,mac2:2` (host[:slots], comma-separated)."""
    hosts = []
    for i, item in enumerate(text.split(","), 1):
        item = item.strip()
        if not item:
            raise HostfileError(f"--hosts {text!r}: entry {i} is empty")
        try:
            hosts.append(_host_with_slots(item))
        except ValueError as e:
            raise HostfileError(f"--hosts {text!r}: entry {i}: {e}") from None
    return HostList(tuple(hosts))


def read_hostfile(path: str) -> HostList:
    """Read a hostfile in either format, telling them apart by the first non-blank character."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise HostfileError(f"cannot read hostfile {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HostfileError(f"hostfile {path} is not UTF-8 text") from None
    return parse_hostfile_text(text, path)


def parse_hostfile_text(text: str, path: str = "<hostfile>") -> HostList:
    """Parse hostfile text; `path` only names the file in error messages."""
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        result = _parse_json(text, path)
    else:
        result = _parse_mpirun(text, path)
    if not result.hosts:
        raise HostfileError(f"{path}: lists no hosts")
    return result


def is_local_host(name: str) -> bool:
    """True when `name` means this machine, so its ranks start without ssh.

    `user@host` is always remote: naming a user asks for a login.
    """
    if "@" in name:
        return False
    name = name.strip().lower().strip("[]")
    if name in ("localhost", "127.0.0.1", "::1", "localhost.localdomain"):
        return True
    hostname = socket.gethostname().lower()
    short = hostname.split(".")[0]
    # macOS answers gethostname() with "mac1.local" or "mac1"; people write either.
    return name in {hostname, short, short + ".local", socket.getfqdn().lower()}


def is_loopback(address: str) -> bool:
    """True for localhost and loopback addresses, which other hosts cannot connect to."""
    address = address.strip().lower().strip("[]")
    if address in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _host_with_slots(item: str) -> Host:
    """'mac1', 'mac1:2', '10.0.0.1:2', '[fe80::1]:2' -> Host (MPICH's host:N spelling)."""
    name, slots = item, 1
    m = re.fullmatch(r"\[([^\]]+)\](?::(.*))?|([^:]+):(.*)", item)
    if m and m.group(1):
        name, count = m.group(1), m.group(2)
    elif m and m.group(3) and ":" not in m.group(4):
        name, count = m.group(3), m.group(4)
    else:
        count = None  # a bare name, or an IPv6 address without brackets
    if count is not None:
        if not _SLOTS.fullmatch(count):
            raise ValueError(f"slot count {count!r} in {item!r} is not a positive integer")
        slots = int(count)
    _check_name(name)
    return Host(name, slots, _ips_of_name(name))


def _ips_of_name(name: str) -> tuple[str, ...]:
    """A host given as an IP address is also its own listed address (as mlx.launch does)."""
    try:
        ipaddress.ip_address(name.rpartition("@")[2])
    except ValueError:
        return ()
    return (name.rpartition("@")[2],)


def _check_name(name: str) -> None:
    if not name or not _HOST.fullmatch(name):
        raise ValueError(f"{name!r} is not a host name or address")


def _parse_mpirun(text: str, path: str) -> HostList:
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            hosts.append(_mpirun_line(line))
        except ValueError as e:
            raise HostfileError(f"{path}, line {lineno}: {e}: {raw.strip()!r}") from None
    return HostList(tuple(hosts))


def _mpirun_line(line: str) -> Host:
    first, *options = line.split()
    host = _host_with_slots(first)
    slots, ips = host.slots, host.ips
    seen = set()
    for opt in options:
        key, eq, value = opt.partition("=")
        key = key.lower()
        if not eq or not value:
            raise ValueError(f"expected key=value after the host name, got {opt!r}")
        if key in seen:
            raise ValueError(f"{key} is given twice")
        seen.add(key)
        if key in ("slots", "max_slots", "max-slots"):
            if not _SLOTS.fullmatch(value):
                raise ValueError(f"{key}={value!r} is not a positive integer")
            if key == "slots":
                slots = int(value)
            # max_slots only bounds oversubscription in Open MPI; ranks never exceed slots here.
        elif key in ("ips", "ip"):
            ips = tuple(_checked_ip(v) for v in value.split(","))
        else:
            raise ValueError(f"unknown option {key!r} (known: slots, max_slots, ips)")
    return Host(host.name, slots, ips)


def _checked_ip(value: str) -> str:
    if not value or not _HOST.fullmatch(value):
        raise ValueError(f"{value!r} is not an address")
    return value


def _parse_json(text: str, path: str) -> HostList:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HostfileError(f"{path}, line {e.lineno}: not valid JSON: {e.msg}") from None
    envs: tuple[str, ...] = ()
    if isinstance(data, dict):
        if "hosts" not in data:
            raise HostfileError(f"{path}, line 1: a JSON hostfile object needs a \"hosts\" list")
        raw_envs = data.get("envs", [])
        if not isinstance(raw_envs, list) or not all(
            isinstance(e, str) and "=" in e for e in raw_envs
        ):
            line = _line_of_key(text, "envs")
            raise HostfileError(
                f'{path}, line {line}: "envs" must be a list of "KEY=VALUE" strings'
            )
        envs = tuple(raw_envs)
        entries = data["hosts"]
        list_start = _list_start_after_key(text, "hosts")
    else:
        entries = data
        list_start = text.index("[")
    if not isinstance(entries, list):
        raise HostfileError(f"{path}, line {_line_at(text, list_start)}: hosts must be a JSON list")
    lines = _element_lines(text, list_start, len(entries))
    hosts = []
    for i, entry in enumerate(entries):
        try:
            hosts.append(_json_entry(entry, i, len(entries)))
        except ValueError as e:
            raise HostfileError(f"{path}, line {lines[i]} (host entry {i + 1}): {e}") from None
    return HostList(tuple(hosts), envs)


def _json_entry(entry: object, index: int, count: int) -> Host:
    if not isinstance(entry, dict):
        raise ValueError('each host must be an object like {"ssh": "mac1", "ips": ["10.0.0.1"]}')
    name = entry.get("ssh")
    if not isinstance(name, str) or not name.strip():
        raise ValueError('"ssh" (the host name to log in to) is missing or not a string')
    _check_name(name.strip())
    ips = entry.get("ips", [])
    if ips is None:
        ips = []
    if not isinstance(ips, list) or not all(isinstance(ip, str) and ip for ip in ips):
        raise ValueError('"ips" must be a list of address strings')
    slots = entry.get("slots", 1)  # not MLX's; lets one entry take several ranks
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError('"slots" must be a positive integer')
    rdma = None
    if entry.get("rdma") is not None:
        rdma = parse_rdma_devices(json.dumps(entry["rdma"]), index, count, '"rdma"', "host entry")
    return Host(name.strip(), slots, tuple(_checked_ip(ip) for ip in ips), rdma)


def rdma_devices(hosts: tuple[Host, ...], entry: tuple[int, ...], rank: int) -> list | None:
    """FASTCOLL_RDMA_DEVICES for `rank` (on host entry entry[rank]), as a JSON-ready list with one
    item per rank of the job: its host's device(s) toward the peer's host entry, null toward a peer
    of its own entry (shared memory) and where the list names none; None where its host has no
    `rdma` list."""
    mine = hosts[entry[rank]].rdma
    if mine is None:
        return None
    out: list = []
    for peer_entry in entry:
        names = None if peer_entry == entry[rank] else mine[peer_entry]
        out.append(None if names is None else names[0] if len(names) == 1 else list(names))
    return out


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _line_of_key(text: str, key: str) -> int:
    m = re.search(r'"%s"\s*:' % re.escape(key), text)
    return _line_at(text, m.start()) if m else 1


def _list_start_after_key(text: str, key: str) -> int:
    m = re.search(r'"%s"\s*:\s*' % re.escape(key), text)
    return m.end() if m else 0


def _element_lines(text: str, list_start: int, count: int) -> list[int]:
    """The line on which each element of the JSON list starting at `list_start` begins.

    json gives no positions for parsed values, so walk the list with raw_decode; the text is
    known to be valid JSON by now.
    """
    decoder = json.JSONDecoder()
    lines = []
    i = text.find("[", list_start) + 1
    for _ in range(count):
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        lines.append(_line_at(text, i))
        try:
            _, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
    lines += [lines[-1] if lines else 1] * (count - len(lines))
    return lines
