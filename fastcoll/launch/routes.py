"""Which network a job's data takes, and the warnings the launcher prints about it at start.

A rank's data goes to the addresses its host is listed with (`ips`, one connection per address),
else to the host's name: the one ssh uses. Data over the ssh network is not wrong, but on Macs
joined by Thunderbolt it is usually the slow path, and easy to end up on by mistake: a host left
without `ips` in a hostfile that lists them for the others, an `ips` entry that is in fact the
address ssh logs in to, or a `--hosts` job across hosts (which has no way to list `ips`).
"""

from __future__ import annotations

import subprocess
from typing import Callable, Sequence

from fastcoll.launch.hostfile import Host, HostList, is_local_host


def ssh_address(ssh: Sequence[str] | None, host: str, timeout: float = 5.0) -> str:
    """The address ssh connects to for `host` (its config's HostName, from `ssh -G`, which asks
    no network), or the host part of `host` when that cannot be told."""
    name = host.rpartition("@")[2]
    try:
        done = subprocess.run([*(ssh or ["ssh"]), "-G", host], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return name
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key.lower() == "hostname" and value.strip():
            return value.strip()
    return name


def job_hosts(hosts: HostList, nprocs: int | None) -> list[Host]:
    """The distinct hosts that get at least one rank, in order (ranks fill hosts in order)."""
    left = hosts.slots if nprocs is None else nprocs
    seen: dict[str, Host] = {}
    for h in hosts.hosts:
        if left <= 0:
            break
        seen.setdefault(h.name.lower(), h)
        left -= h.slots
    return list(seen.values())


def data_warnings(
    hosts: HostList,
    *,
    from_hostfile: bool,
    nprocs: int | None = None,
    interface: str | None = None,
    resolve: Callable[[str], str] = lambda name: name.rpartition("@")[2],
) -> list[str]:
    """Warnings for a job whose data would go over the addresses ssh uses (see the module).

    `resolve(name)` gives the address ssh uses for a host (`ssh_address`). None for a job on
    this machine only, or when `--interface` sets the address for every rank."""
    used = job_hosts(hosts, nprocs)
    if interface or len(used) < 2 or all(is_local_host(h.name) for h in used):
        return []
    if not from_hostfile:
        names = ", ".join(h.name for h in used)
        return [f"this --hosts job across hosts sends its data over the addresses ssh uses "
                f"({names}); to keep it on another network (Thunderbolt, a second link), give a "
                f"hostfile listing each host's data addresses (ips=, or MLX's \"ips\")"]
    vias = {h.name: resolve(h.name) for h in used}

    def ssh_side(h: Host) -> set[str]:
        return {vias[h.name].strip("[]").lower(), h.name.rpartition("@")[2].lower()}

    others = [h for h in used if any(a.strip("[]").lower() not in ssh_side(h) for a in h.ips)]
    if not others:
        return []  # the file names no network but the one ssh uses
    named = ", ".join(h.name for h in others)
    out = []
    for h in used:
        if not h.ips:
            out.append(f"host {h.name} lists no ips, though the hostfile lists other addresses "
                       f"for {named}: its data goes over {vias[h.name]}, the address ssh uses; "
                       f"add its data address (ips=)")
            continue
        same = [a for a in h.ips if a.strip("[]").lower() in ssh_side(h)]
        if same:
            out.append(f"host {h.name}'s data address {same[0]} is the address ssh uses, though "
                       f"the hostfile lists other addresses for {named}: its data shares the ssh "
                       f"network; list its address on the data network instead")
    return out
