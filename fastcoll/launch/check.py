"""`fastcoll-launch --check`: can a job run on these hosts? Answer before starting one.

For every host: ssh answers without a prompt; its Python (major.minor) and fastcoll version match
the launcher's; each listed address is the host's own; and every host can open a TCP connection
to every other host's listed addresses (each host's agent listens, the others connect and must
be greeted by the right host). Then, one pair at a time so that no two measurements share a
link, the round trip (median of `PINGS` exchanges of 64 bytes) and the throughput (`PROBE_BYTES`
sent one way) from every host to every address of every other host: the addresses a job's data
uses (each host's `ips`, connection k to address k, else its name, the ssh network). Prints a
table, and the launcher's warnings about data on the ssh network (`routes.data_warnings`); the
exit code is 1 on any failure.

Where an MLX hostfile's `rdma` lists name devices: each host says whether its verbs library loads
and lists the devices named for it, then every pair of hosts that the lists join opens a verbs
link per cable, as a job would, one at a time, and measures it (`fastcoll/launch/rdmalink.py`);
each link's row says ok, or the one-line reason it could not be opened.
"""

from __future__ import annotations

import platform
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence, TextIO

import fastcoll
from fastcoll.launch import rdmalink
from fastcoll.launch.agent import RDMA_TIMEOUT
from fastcoll.launch.hostfile import Host, HostList, is_local_host
from fastcoll.launch.remote import AgentSession, agent_command, explain_ssh_failure
from fastcoll.launch.routes import data_warnings, ssh_address

CONNECT_TIMEOUT = 3.0
PINGS = 20
PROBE_BYTES = 4 << 20


@dataclass
class HostCheck:
    """What the check learnt about one host."""

    host: Host
    session: AgentSession | None = None
    hello: dict | None = None
    problems: list[str] = field(default_factory=list)
    routes: list[tuple[str, str, int, bool, str]] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)  # per route; its "via": "data 0", "ssh name"...
    measured: list[dict | None] = field(default_factory=list)  # per route: rtt_s, bytes, seconds


def run_check(
    hosts: HostList,
    *,
    ssh: list[str] | None,
    python: str,
    cwd: str,
    env: dict[str, str] | None = None,
    out: TextIO = sys.stdout,
    timeout: float = 30.0,
    from_hostfile: bool | None = None,
) -> int:
    """Check every host, print the table to `out`, and return 0 if all is well, else 1."""
    unique: dict[str, Host] = {}
    for h in hosts.hosts:
        unique.setdefault(h.name, h)
    checks = [HostCheck(h) for h in unique.values()]
    ids = {c.host.name: secrets.token_hex(8) for c in checks}
    try:
        _open_sessions(checks, ids, hosts.hosts, ssh=ssh, python=python, cwd=cwd, env=env)
        deadline = time.monotonic() + timeout
        for c in checks:
            _hello(c, deadline, python)
        alive = [c for c in checks if c.hello is not None and c.session is not None]
        _connect(alive, ids, deadline)
        for c in alive:  # one host at a time, each measuring its routes one at a time
            _measure(c, deadline)
        links = _rdma_links(hosts, {c.host.name: c for c in checks}, ids)
    finally:
        for c in checks:
            if c.session is not None:
                c.session.close()
    warnings = [] if from_hostfile is None else data_warnings(
        hosts, from_hostfile=from_hostfile, resolve=lambda name: ssh_address(ssh, name))
    return _report(checks, out, warnings, links)


def _open_sessions(checks: Sequence[HostCheck], ids: dict[str, str], hosts: Sequence[Host], *,
                   ssh: list[str] | None, python: str, cwd: str, env: dict[str, str] | None) -> None:
    """Start the agent in check mode on every host (here, for a local one)."""
    marker = f"\x1efastcoll-check:{secrets.token_hex(8)}:"
    named: dict[str, list[str]] = {}  # the RDMA devices each host's entries name
    for h in hosts:
        named.setdefault(h.name, []).extend(sorted({d for names in h.rdma or () if names for d in names}))
    for c in checks:
        where = None if is_local_host(c.host.name) else c.host.name
        request = {"mode": "check", "marker": marker, "id": ids[c.host.name], "addresses": list(c.host.ips),
                   "cwd": cwd, "env": env or {}, "rdma_devices": named.get(c.host.name, [])}
        c.session = AgentSession(agent_command(ssh, where, python, "check"), request, marker)


def _connect(alive: Sequence[HostCheck], ids: dict[str, str], deadline: float) -> None:
    """Every host tries every other host's data addresses, all at once; each route's outcome."""
    for c in alive:
        targets = [
            {"host": o.host.name, "addr": addr, "port": o.hello["port"], "id": ids[o.host.name],
             "via": f"data {k}" if o.host.ips else "ssh name"}
            for o in alive
            if o is not c
            for k, addr in enumerate(o.host.ips or (o.host.address,))
        ]
        if targets:
            c.session.send({"connect": targets, "timeout": CONNECT_TIMEOUT})
            c.routes = [(t["host"], t["addr"], t["port"], False, "") for t in targets]
            c.targets = targets
    for c in alive:
        if c.routes:
            reply = c.session.reply(max(1.0, deadline - time.monotonic()) + CONNECT_TIMEOUT)
            results = (reply or {}).get("results") or []
            padded = results + [None] * len(c.routes)
            c.routes = [
                (h, a, p, bool(r.get("ok")), r.get("error", "")) if r else (h, a, p, False, "no answer")
                for (h, a, p, _, _), r in zip(c.routes, padded)
            ]


def _measure(c: HostCheck, deadline: float) -> None:
    """Round trip and throughput of each of c's routes that connected, one at a time."""
    ok = [t for t, r in zip(c.targets, c.routes) if r[3]]
    c.measured = [None] * len(c.routes)
    if not ok:
        return
    c.session.send({"measure": ok, "pings": PINGS, "bytes": PROBE_BYTES, "timeout": CONNECT_TIMEOUT})
    wait = max(1.0, deadline - time.monotonic()) + 10.0 * len(ok)
    got = iter(((c.session.reply(wait) or {}).get("measured") or []) + [None] * len(ok))
    c.measured = [next(got) if r[3] else None for r in c.routes]


def _hello(c: HostCheck, deadline: float, python: str) -> None:
    assert c.session is not None
    reply = c.session.reply(max(0.1, deadline - time.monotonic()))
    if reply is None or "hello" not in reply:
        code = c.session.close(wait=1.0)
        c.problems.append(explain_ssh_failure(c.host.name, code, c.session.stderr, python))
        return
    c.hello = reply["hello"]
    mine = platform.python_version()
    theirs = str(c.hello.get("python", "?"))
    if theirs.split(".")[:2] != mine.split(".")[:2]:
        c.problems.append(f"Python {theirs} here, {mine} on the launcher")
    if c.hello.get("fastcoll") != fastcoll.__version__:
        c.problems.append(
            f"fastcoll {c.hello.get('fastcoll')} here, {fastcoll.__version__} on the launcher"
        )
    for addr, err in (c.hello.get("bind_errors") or {}).items():
        c.problems.append(f"listed address {addr} is not this host's ({err})")
    rdma = c.hello.get("rdma")
    if isinstance(rdma, dict) and rdma.get("error"):
        c.problems.append(f"RDMA: {rdma['error']}")


@dataclass
class RdmaLink:
    """One verbs link of the hostfile's `rdma` lists: host entry a's cable toward entry b."""

    a: Host
    b: Host
    device_a: str | None
    device_b: str | None
    result: dict = field(default_factory=dict)  # ok, error, or rtt_s, bytes, seconds


def rdma_pairs(hosts: Sequence[Host]) -> list[RdmaLink]:
    """The verbs links the hosts' `rdma` lists ask for: one per pair of entries and cable (the
    k-th name of each side's list), and one with a missing side where only one side names any."""
    links = []
    for i, a in enumerate(hosts):
        for j in range(i + 1, len(hosts)):
            b = hosts[j]
            ab = a.rdma[j] if a.rdma else None
            ba = b.rdma[i] if b.rdma else None
            if ab is None and ba is None:
                continue
            if ab is None or ba is None:
                links.append(RdmaLink(a, b, ab[0] if ab else None, ba[0] if ba else None))
                continue
            links.extend(RdmaLink(a, b, ab[k % len(ab)], ba[k % len(ba)]) for k in range(max(len(ab), len(ba))))
    return links


def _rdma_links(hosts: HostList, checks: dict[str, HostCheck], ids: dict[str, str]) -> list[RdmaLink]:
    """Open and measure every verbs link the hostfile asks for, one at a time (entry b's host
    opens it toward entry a's, whose agent serves the other end)."""
    links = rdma_pairs(hosts.hosts)
    for link in links:
        ca, cb = checks[link.a.name], checks[link.b.name]
        if link.device_a is None or link.device_b is None:
            named, other = (link.a, link.b) if link.device_a else (link.b, link.a)
            link.result = {"ok": False, "error": f"{named.name} names a device toward {other.name}, "
                           f"whose list names none toward it (null): both ends of a pair use RDMA, or neither"}
        elif ca.problems or cb.problems or ca.session is None or cb.session is None or not ca.hello:
            link.result = {"ok": False, "error": "not tried: see the hosts' table"}
        else:
            target = {"host": link.a.name, "addr": link.a.address, "port": ca.hello["port"], "id": ids[link.a.name],
                      "device": link.device_b, "peer_device": link.device_a}
            cb.session.send({"rdma": [target], "timeout": RDMA_TIMEOUT})
            reply = cb.session.reply(RDMA_TIMEOUT * 3) or {}
            link.result = (reply.get("rdma_results") or [{"ok": False, "error": "no answer"}])[0]
    return links


def _report_rdma(links: Sequence[RdmaLink], out: TextIO) -> bool:
    """The RDMA links' table; True if every link is ok."""
    out.write(f"\nRDMA LINKS (host -> host, device -> device, as the hostfile's rdma lists name them; round "
              f"trip: median of {rdmalink.PINGS} exchanges of {rdmalink.PING_BYTES} B; throughput: "
              f"{rdmalink.BULK_BYTES >> 20} MiB each way; one link at a time)\n")
    table = [("FROM -> TO", "DEVICES", "STATUS", "ROUND TRIP", "THROUGHPUT")]
    for link in links:
        r = link.result
        rtt = thr = "-"
        if r.get("ok"):
            rtt = f"{r['rtt_s'] * 1e6:.1f} us"
            thr = f"{2 * r['bytes'] / max(r['seconds'], 1e-9) / 1e9:.3f} GB/s"
        table.append((f"{link.b.name} -> {link.a.name}", f"{link.device_b or 'null'} -> {link.device_a or 'null'}",
                      "ok" if r.get("ok") else f"FAIL: {r.get('error', '?')}", rtt, thr))
    widths = [max(len(row[k]) for row in table) for k in range(4)]
    for row in table:
        out.write(("  ".join(v.ljust(w) for v, w in zip(row, widths)) + "  " + row[4]).rstrip() + "\n")
    return all(link.result.get("ok") for link in links)


def _report(checks: Sequence[HostCheck], out: TextIO, warnings: Sequence[str] = (),
            links: Sequence[RdmaLink] = ()) -> int:
    rows = [("HOST", "SSH", "PYTHON", "FASTCOLL", "MLX", "STATUS")]
    rows.append(
        ("(launcher)", "-", platform.python_version(), fastcoll.__version__, _mlx_version(), "")
    )
    failed = False
    for c in checks:
        h = c.hello or {}
        bad_routes = [r for r in c.routes if not r[3]]
        status = "ok" if not c.problems and not bad_routes else "FAIL"
        failed |= status != "ok"
        unreached = sorted({r[0] for r in bad_routes})
        problems = c.problems + (
            [f"cannot reach {', '.join(unreached)} (see below)"] if unreached else []
        )
        detail = "; ".join(problems)
        rows.append((
            c.host.name,
            "local" if is_local_host(c.host.name) else ("ok" if c.hello else "FAIL"),
            str(h.get("python", "-")),
            _short(str(h.get("fastcoll", "-"))),
            str(h.get("mlx", "-")),
            status + (f": {detail}" if detail else ""),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[5] + "\n")
    routes = [(c, i) for c in checks for i in range(len(c.routes))]
    if routes:
        out.write(f"\nROUTES (from -> to address:port, the addresses a job's data uses; round trip: "
                  f"median of {PINGS} exchanges of 64 B; throughput: {PROBE_BYTES >> 20} MiB one "
                  f"way; one pair at a time)\n")
        table = [("FROM -> TO ADDRESS:PORT", "VIA", "STATUS", "ROUND TRIP", "THROUGHPUT")]
        for c, i in routes:
            dst, addr, port, ok, err = c.routes[i]
            via = c.targets[i]["via"] if i < len(c.targets) else "-"
            m = c.measured[i] if i < len(c.measured) else None
            rtt = thr = "-"
            if ok and m and m.get("ok"):
                rtt = f"{m['rtt_s'] * 1e3:.3f} ms"
                thr = f"{m['bytes'] / max(m['seconds'], 1e-9) / 1e9:.3f} GB/s"
            elif ok and m:
                rtt = f"FAIL: {m.get('error', '?')}"
            table.append((f"{c.host.name} -> {dst} {addr}:{port}", via,
                          "ok" if ok else f"FAIL: {err}", rtt, thr))
        widths = [max(len(r[k]) for r in table) for k in range(4)]
        for r in table:
            line = "  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[4]
            out.write(line.rstrip() + "\n")
    if links and not _report_rdma(links, out):
        failed = True
    for w in warnings:
        out.write(f"\nwarning: {w}\n")
    out.write("\nall hosts ok\n" if not failed else "\nsome hosts FAILED the check\n")
    out.flush()
    return 1 if failed else 0


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _mlx_version() -> str:
    try:
        from importlib.metadata import version

        return version("mlx")
    except Exception:  # not installed, or no metadata: the column is informative only
        return "-"
