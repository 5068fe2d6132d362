"""A job's plan: which rank runs where, with which command and environment.

Nothing here starts a process; `plan_job` is a pure function of the options, so the placement
rules can be tested without launching anything.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from fastcoll.wire import parse_address
from fastcoll.launch.agent import bind_errors, free_port
from fastcoll.launch.hostfile import Host, HostList, is_local_host, is_loopback, rdma_devices

LOOPBACK = "127.0.0.1"
BIND_CHOICES = ("none", "cores")  # --bind-to
# A bare interpreter name on the command line means "the job's Python", as it does for
# mlx.launch and torchrun: on another host, PATH may find a different one.
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


class PlanError(ValueError):
    """The options do not describe a job that can run; the message says why."""


@dataclass(frozen=True)
class RankPlan:
    """One rank: where it runs, its argv, and the variables the launcher adds for it."""

    rank: int
    host: Host
    local_rank: int
    local: bool
    argv: tuple[str, ...]
    env: Mapping[str, str]
    # (i, n): run on share i of n of its host's cores (--bind-to cores); None: unbound
    cpu_share: tuple[int, int] | None = None


@dataclass(frozen=True)
class JobPlan:
    """Every rank of a job, the coordinator address, and the job's shared secret."""

    ranks: tuple[RankPlan, ...]
    coordinator: str
    token: str
    cwd: str
    python: str

    @property
    def size(self) -> int:
        return len(self.ranks)


def program_argv(program: Sequence[str], python: str) -> tuple[str, ...]:
    """The argv a rank runs: `python`/`python3` become the job's interpreter, and a bare
    `script.py` is run with it; anything else (a path, another program) runs as written."""
    if not program:
        raise PlanError("no program to run: fastcoll-launch [options] PROGRAM [ARGS...]")
    first = program[0]
    if "/" not in first and _PYTHON_NAME.fullmatch(first):
        return (python, *program[1:])
    if first.endswith(".py"):
        return (python, *program)
    return tuple(program)


def parse_env_items(items: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """`KEY=VALUE` sets a variable; a bare `KEY` passes on the launcher's value (mpirun -x)."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise PlanError(f"--env {item!r}: {key!r} is not a variable name")
        if not eq:
            if key not in environ:
                raise PlanError(f"--env {key}: {key} is not set in the launcher's environment")
            value = environ[key]
        out[key] = value
    return out


def launcher_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's own FASTCOLL_* settings (FASTCOLL_TRANSPORT=zmq fastcoll-launch ...): they
    reach remote ranks, and --check's agents, as they reach local ones through inheritance."""
    return {k: v for k, v in environ.items() if k.startswith("FASTCOLL_")}


def plan_job(
    hosts: HostList | None,
    program: Sequence[str],
    *,
    nprocs: int | None = None,
    env_items: Sequence[str] = (),
    interface: str | None = None,
    coordinator: str | None = None,
    cwd: str | None = None,
    python: str | None = None,
    environ: Mapping[str, str] | None = None,
    remote_port: Callable[[Host], int] | None = None,
    bind: str = "none",
) -> JobPlan:
    """Place the ranks and build each one's environment.

    Ranks fill the hosts in order, each host up to its slots (mpirun's --map-by slot). With no
    hosts, `nprocs` ranks run here. `bind="cores"` gives each rank a share of its host's cores,
    in local-rank order (fastcoll/launch/agent.py's `cpu_share`). `remote_port(host)` asks a
    remote first host for a free coordinator port; local ones are bind-tested here.
    """
    environ = os.environ if environ is None else environ
    python = python or sys.executable
    cwd = cwd or os.getcwd()
    if hosts is None:
        hosts = HostList((Host("localhost", 1 if nprocs is None else nprocs),))
    n = _rank_count(hosts, nprocs, bind)
    argv = program_argv(program, python)
    extra = parse_env_items(list(hosts.envs) + list(env_items), environ)
    inherited = launcher_settings(environ)
    placement, per_host = _placement(hosts, n)
    all_local = all(is_local_host(h.name) for h, _ in placement)
    _refuse_foreign_ips([h for h, _ in placement if is_local_host(h.name)])
    if coordinator is None or not _has_port(coordinator):
        coordinator = _with_port(coordinator, placement[0][0], all_local, remote_port)
    token = secrets.token_hex(32)
    # A host listing several ips (one per Thunderbolt cable, as in MLX's hostfiles) gets a
    # connection per address, as MLX's ring does; every rank must open the same number.
    links = max(len(h.ips) for h, _ in placement)
    if links > 1 and "FASTCOLL_CONNECTIONS" not in extra and "FASTCOLL_CONNECTIONS" not in inherited:
        extra["FASTCOLL_CONNECTIONS"] = str(links)
    shared = {"PYTHONUNBUFFERED": "1", **inherited, **extra}  # --env PYTHONUNBUFFERED= turns it off
    rdma = rdma_settings(hosts.hosts, _entries(hosts, n), shared)
    ranks = []
    for rank, (host, local_rank) in enumerate(placement):
        own = interface or (",".join(host.ips) if len(host.ips) > 1 else LOOPBACK if all_local else host.address)
        if not all_local and not interface:
            _refuse_loopback_name(host, own)
        # FASTCOLL_HOST: the ranks' errors name a host as the launcher's own messages do.
        env = dict(shared, **rdma[rank], FASTCOLL_RANK=str(rank), FASTCOLL_WORLD_SIZE=str(n),
                   FASTCOLL_LOCAL_RANK=str(local_rank), FASTCOLL_COORDINATOR=coordinator,
                   FASTCOLL_TOKEN=token, FASTCOLL_INTERFACE=own, FASTCOLL_HOST=host.name)
        share = (local_rank, per_host[host.name.lower()]) if bind == "cores" else None
        ranks.append(RankPlan(rank, host, local_rank, is_local_host(host.name), argv, env, share))
    return JobPlan(tuple(ranks), coordinator, token, cwd, python)


def _rank_count(hosts: HostList, nprocs: int | None, bind: str) -> int:
    """How many ranks the job has (every slot when `nprocs` is None); PlanError for options
    that describe no job."""
    if bind not in BIND_CHOICES:
        raise PlanError(f"--bind-to {bind!r}: choose one of {', '.join(BIND_CHOICES)}")
    if nprocs is not None and nprocs < 1:
        raise PlanError(f"-n must be at least 1, not {nprocs}")
    n = hosts.slots if nprocs is None else nprocs
    if n > hosts.slots:
        raise PlanError(
            f"-n {n} asks for more ranks than the hosts have slots ({hosts.slots}); "
            "add slots (host slots=N, or host:N) or lower -n"
        )
    return n


def _placement(hosts: HostList, n: int) -> tuple[list[tuple[Host, int]], dict[str, int]]:
    """The first n slots, hosts in order, each up to its slots: (host, local rank) for each rank,
    and how many ranks each host (by lower-case name) gets."""
    placement: list[tuple[Host, int]] = []
    per_host: dict[str, int] = {}
    for host in hosts.hosts:
        for _ in range(host.slots):
            if len(placement) == n:
                break
            key = host.name.lower()
            placement.append((host, per_host.get(key, 0)))
            per_host[key] = per_host.get(key, 0) + 1
    return placement, per_host


def _entries(hosts: HostList, n: int) -> tuple[int, ...]:
    """The host entry (its index in the hostfile) of each of the first n slots, as _placement fills them."""
    return tuple(i for i, host in enumerate(hosts.hosts) for _ in range(host.slots))[:n]


def rdma_settings(hosts: tuple[Host, ...], entries: tuple[int, ...], shared: Mapping[str, str]) -> list[dict[str, str]]:
    """Each rank's RDMA variables from its host's MLX `rdma` list: FASTCOLL_RDMA_DEVICES (its device
    toward each rank: the list's item for the peer's host entry, null toward a rank of its own
    entry, which shared memory serves), and FASTCOLL_TRANSPORT=rdma where any device is named.
    What the user set (--env, the hostfile's envs, the launcher's own FASTCOLL_*) wins: with
    FASTCOLL_TRANSPORT=tcp an MLX jaccl hostfile runs over TCP."""
    lists = [rdma_devices(hosts, entries, r) for r in range(len(entries))]
    named = any(item is not None for devices in lists if devices for item in devices)
    out = []
    for devices in lists:
        env: dict[str, str] = {}
        if named and "FASTCOLL_TRANSPORT" not in shared:
            env["FASTCOLL_TRANSPORT"] = "rdma"
        if named and "FASTCOLL_RDMA_DEVICES" not in shared:  # a host without a list: no RDMA
            env["FASTCOLL_RDMA_DEVICES"] = json.dumps(devices or [None] * len(entries))
        out.append(env)
    return out


def _has_port(address: str) -> bool:
    try:
        parse_address(address, "--coordinator")
    except ValueError:
        return False
    return True


def _with_port(
    address: str | None, first: Host, all_local: bool, remote_port: Callable[[Host], int] | None
) -> str:
    """host:port where rank 0 will listen: `address` or the first host as the job names it."""
    if all_local:
        address = address or LOOPBACK
        port = free_port(LOOPBACK if is_loopback(address) else "")
    else:
        if address is None:
            address = first.address
            _refuse_loopback_name(first, address)
        if is_local_host(first.name):
            port = free_port("")
        elif remote_port is None:
            raise PlanError("the first host is remote and no way to ask it for a port was given")
        else:
            port = remote_port(first)
    host = address.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _refuse_foreign_ips(local: Sequence[Host]) -> None:
    """A host of this machine that lists an address this machine does not have is a mistake in
    the hostfile, as `--check` says (the same test: `agent.bind_errors`); refused, even where a
    job on this machine alone would not use the address."""
    for host in dict.fromkeys(local):
        for addr, err in bind_errors(list(host.ips)).items():
            raise PlanError(f"host {host.name}: listed address {addr} is not this host's ({err}), "
                            "as fastcoll-launch --check says too: list an address it has")


def _refuse_loopback_name(host: Host, address: str) -> None:
    """In a job across hosts, `localhost` as a host's only name cannot be reached by the others.

    Listed ips are the user's word and are trusted (a test may well run every "host" here).
    """
    if is_loopback(address) and not host.ips:
        raise PlanError(
            f"host {host.name!r} is named by a loopback address, which the other hosts cannot "
            "reach; name it by an address they can, or list its ips in a hostfile"
        )
