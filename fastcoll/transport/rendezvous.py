"""Rendezvous: rank 0 listens at the coordinator, every rank reports where it listens, and
receives the table of everyone's addresses and capabilities."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

from fastcoll import testhooks
from fastcoll.errors import AuthenticationError, CollectiveTimeoutError, FastcollError, MismatchError, PeerLostError
from fastcoll.transport.auth import client_handshake
from fastcoll.transport.listen import AuthListener
from fastcoll.transport.stream import recv_message, remaining, send_message
from fastcoll.wire import PROTOCOL, VERSION, parse_address

log = logging.getLogger("fastcoll.rendezvous")

MESSAGE_LIMIT = 1 << 20
# What a rendezvous message's fields may hold: each capability's type (others: a scalar, or a
# map of names to scalars), and the longest string anywhere in it (an address list, a host id).
_CAPS = {"transport": str, "gate": bool, "host": str, "name": str, "native": bool, "connections": int,
         "process": dict}
_TEXT_MAX = 4096
_LIST_MAX = 65536  # entries of a list in a capability's map: one a rank, far above any job


@dataclass(frozen=True)
class Table:
    """What every rank learns at rendezvous: each rank's data address and capabilities."""

    addresses: list[str]
    caps: list[dict]

    def same_host(self, rank: int) -> set[int]:
        """The ranks whose host id (the `host` capability) is `rank`'s."""
        mine = self.caps[rank].get("host")
        return {r for r, c in enumerate(self.caps) if c.get("host") == mine}


def join_addresses(addresses: list[tuple[str, int]]) -> str:
    """[("10.0.0.1", 5000), ("::1", 5001)] -> '10.0.0.1:5000,[::1]:5001' (the table's form)."""
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)


def split_addresses(text: object, what: str) -> list[tuple[str, int]]:
    """The inverse of join_addresses, for an entry of the table; FastcollError if malformed."""
    if not isinstance(text, str) or not text:
        raise FastcollError(f"{what} is missing from the rendezvous table")
    try:
        return [parse_address(part, what) for part in text.split(",")]
    except ValueError as e:
        raise FastcollError(str(e)) from None


def agree(caps: list[dict], keys: dict[str, str]) -> None:
    """MismatchError unless every rank reported the same value for each key of `keys`
    (capability name -> the setting behind it, for the message)."""
    for key, var in keys.items():
        if len({repr(c.get(key)) for c in caps}) > 1:
            which = {r: c.get(key) for r, c in enumerate(caps)}
            raise MismatchError(f"ranks disagree on {var}: {which}")


def connect(host: str, port: int, token: bytes, rank: int, deadline: float, what: str) -> socket.socket:
    """Connect and authenticate, retrying while the listener is not up yet (ranks start in any order)."""
    delay = 0.01
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.05, remaining(deadline)))
        except OSError as e:
            if remaining(deadline) <= 0:
                raise CollectiveTimeoutError(f"could not reach {what} at {host}:{port}: {e}") from None
            time.sleep(min(delay, remaining(deadline)))
            delay = min(delay * 2, 0.5)
            continue
        try:
            client_handshake(sock, token, rank, deadline)
        except OSError as e:  # the listener's process ended between its accept and our proof
            sock.close()
            raise PeerLostError(f"{what} at {host}:{port} closed the connection during the handshake ({e})") from None
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock


def _tell(sock: socket.socket, error: FastcollError) -> None:
    """Best effort: tell a rank waiting for the table why there will be none (so that it raises
    the same error as the coordinator, not a bare 'connection reset')."""
    try:
        sock.settimeout(1.0)
        send_message(sock, {"error": str(error), "kind": type(error).__name__}, MESSAGE_LIMIT)
    except (OSError, ValueError):
        pass


_REPLY_ERRORS = {cls.__name__: cls for cls in (CollectiveTimeoutError, MismatchError, AuthenticationError,
                                              PeerLostError, FastcollError)}


def _runs(info: dict) -> str:
    """'fastcoll 0.1.0 (protocol 2)': what a rendezvous message says its sender runs."""
    protocol, version = info.get("protocol"), info.get("fastcoll")
    if not isinstance(protocol, int) or isinstance(protocol, bool):
        return "an older fastcoll (its rendezvous message carries no protocol version)"
    shown = version[:64] if isinstance(version, str) else "of an unknown version"
    return f"fastcoll {shown} (protocol {protocol})"


def check_version(info: dict, who: str, me: str = "rank 0") -> None:
    """MismatchError naming both versions unless `who`'s message (a map) speaks this protocol."""
    if info.get("protocol") != PROTOCOL or isinstance(info.get("protocol"), bool):
        raise MismatchError(f"{who} runs {_runs(info)} but {me} runs fastcoll {VERSION} (protocol "
                            f"{PROTOCOL}): every rank of a job must run the same fastcoll")


def caps_problem(caps: object) -> str | None:
    """What is wrong with a rank's capabilities, or None: a map of names to scalars or to maps of
    names to scalars or lists of them, the known ones of their type."""
    if not isinstance(caps, dict):
        return f"its 'caps' is {_kind(caps)}, not a map"
    for key, value in caps.items():
        if not isinstance(key, str):
            return f"its 'caps' has a key that is {_kind(key)}, not a string"
        want = _CAPS.get(key)
        if want is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            return f"its capability {key[:64]!r} is {_kind(value)}, not {_kind(want())}"
        inner = value.items() if isinstance(value, dict) else [(key, value)]
        for name, v in inner:
            if not (isinstance(name, str) and (_scalar(v) or _scalars(v))):
                return f"its capability {key[:64]!r} is {_kind(value)}, not a scalar or a map of them"
    return None


def _scalar(value: object) -> bool:
    """A value a capability may hold: None, a bool, a number, or a string of at most _TEXT_MAX."""
    if isinstance(value, str):
        return len(value) <= _TEXT_MAX
    return value is None or isinstance(value, (bool, int, float))


def _scalars(value: object) -> bool:
    """A list of scalars inside a capability's map (rdma's one entry a rank), at most _LIST_MAX:
    the capability's owner checks its meaning (transport/rdma.py's _offer)."""
    return isinstance(value, list) and len(value) <= _LIST_MAX and all(_scalar(v) for v in value)


def message_problem(info: dict) -> str | None:
    """What is wrong with a rank's rendezvous message (a map of this protocol), or None."""
    size, address = info.get("size"), info.get("address")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return f"its 'size' is {_kind(size)}, not a world size"
    if not isinstance(address, str) or not address or len(address) > _TEXT_MAX:
        # (its form is the transport's: TCP parses host:port lists, ZeroMQ takes an endpoint)
        return f"its 'address' is {_kind(address)}, not an address"
    return caps_problem(info.get("caps"))


def _kind(value: object) -> str:
    """How a message's field is described in an error: 'missing', 'a list', 'an int'..."""
    if value is None:
        return "missing"
    name = type(value).__name__
    return {"dict": "a map", "list": "a list", "str": "a string", "bytes": "bytes", "int": "an int"}.get(
        name, f"a {name}")


def _malformed(info: object, rank: int) -> FastcollError | None:
    """The error that fails the rendezvous for rank `rank`'s message, if it breaks a rule: not a
    map, another protocol (MismatchError naming both versions), a field of the wrong type."""
    if not isinstance(info, dict):
        why: str | None = f"it is {_kind(info)}, not a map"
    elif not isinstance(info.get("job", ""), str):
        why = f"its 'job' is {_kind(info.get('job'))}, not a string"
    else:
        try:
            check_version(info, f"rank {rank}")
        except MismatchError as e:
            return e
        if info.get("rank") != rank:
            why = f"it names rank {str(info.get('rank'))[:32]}"
        else:
            why = message_problem(info)
    return None if why is None else FastcollError(f"rank {rank} sent a malformed rendezvous message: {why}")


def _job(job: object) -> str:
    return repr(job) if job else "none (its launcher names no job and FASTCOLL_TOKEN is how to tell jobs apart)"


def rendezvous(config: Any, address: str, caps: dict, deadline: float) -> Table:
    """Exchange data addresses and capabilities with every rank through the coordinator.

    Every rank sends its job identity (Config.job, from its launcher); the coordinator refuses
    a rank of another job, before it can take a rank's place, with a MismatchError that names
    both jobs, so two jobs on one coordinator port never merge."""
    host, port = config.coordinator
    if not config.token and not config.job:
        log.warning(
            "rank %d: no FASTCOLL_TOKEN, and the launcher (%s) names no job: another job that uses "
            "the coordinator %s:%d could not be told from this one; set FASTCOLL_TOKEN (a secret "
            "shared by this job's ranks) or give each job its own FASTCOLL_COORDINATOR port",
            config.rank, config.launcher, host, port)
    me = {"rank": config.rank, "size": config.world_size, "address": address, "caps": caps, "job": config.job,
          "protocol": PROTOCOL, "fastcoll": VERSION}
    table = _join(config, me, deadline) if config.rank != 0 else _coordinate(config, me, deadline)
    testhooks.point("rendezvous-done")
    return table


def _join(config: Any, me: dict, deadline: float) -> Table:
    """A rank other than 0: send `me` to the coordinator and read the table back."""
    host, port = config.coordinator
    sock = connect(host, port, config.token, config.rank, deadline, "the coordinator (rank 0)")
    try:
        send_message(sock, me, MESSAGE_LIMIT)
        reply = recv_message(sock, MESSAGE_LIMIT, deadline, "the coordinator")
    finally:
        sock.close()
    if isinstance(reply, dict) and "error" in reply:
        kind = reply.get("kind")
        cls = _REPLY_ERRORS.get(kind, MismatchError) if isinstance(kind, str) else MismatchError
        raise cls(f"rendezvous refused: {str(reply.get('error'))[:_TEXT_MAX]}")
    return _table(reply, config.world_size, config.rank)


def _table(reply: object, size: int, me: int) -> Table:
    """The table in the coordinator's reply, every field checked: FastcollError naming rank 0
    otherwise (MismatchError, naming both versions, where it runs another protocol)."""
    who = "rank 0 (the coordinator)"
    if not isinstance(reply, dict):
        raise FastcollError(f"{who} sent a malformed rendezvous table: it is {_kind(reply)}, not a map")
    check_version(reply, who, f"rank {me}")
    addresses, caps = reply.get("addresses"), reply.get("caps")
    if not (isinstance(addresses, list) and isinstance(caps, list) and len(addresses) == len(caps) == size):
        raise FastcollError(f"{who} sent a malformed rendezvous table: not {size} addresses and capabilities")
    for r, (address, cap) in enumerate(zip(addresses, caps)):
        why = message_problem({"size": size, "address": address, "caps": cap})
        if why is not None:
            raise FastcollError(f"{who} sent a malformed rendezvous table: rank {r}'s entry: {why}")
    return Table(addresses, caps)


def _coordinate(config: Any, me: dict, deadline: float) -> Table:
    """Rank 0: take every other rank's message (refusing any of another job), check that the
    world sizes agree, and send everyone the table (or the error)."""
    host, port = config.coordinator

    def vet(rank: int, sock: socket.socket, handshake_deadline: float) -> dict | FastcollError:
        """A connection's rendezvous message, read on its own thread: refused (and told so) if
        it comes from another job; the error that fails the rendezvous if it is malformed or of
        another fastcoll (a rank that knows the token takes its place, and every rank is told)."""
        info = recv_message(sock, MESSAGE_LIMIT, min(deadline, handshake_deadline), f"rank {rank}")
        if not isinstance(info, dict) or not isinstance(info.get("job", ""), str):
            return _malformed(info, rank)
        if info.get("job", "") != config.job:
            error = MismatchError(
                f"a rank {rank} of another job reached this job's coordinator {host}:{port}: its job is "
                f"{_job(str(info.get('job'))[:_TEXT_MAX])}, this job's is {_job(config.job)}; give each "
                "job its own coordinator port (FASTCOLL_COORDINATOR) or its own FASTCOLL_TOKEN")
            _tell(sock, error)
            raise error
        return _malformed(info, rank) or info

    listener = AuthListener(host, port, config.token, vet=vet)
    try:
        socks = listener.accept(set(range(1, config.world_size)), deadline, notify=_tell)
    finally:
        listener.close()
    entries = {0: me, **{rank: listener.notes[rank] for rank in socks}}
    try:
        bad = {r: e.get("size") for r, e in entries.items() if e.get("size") != config.world_size}
        if bad:
            reply: dict = {"error": f"world sizes disagree: rank 0 has {config.world_size}, others {bad}"}
        else:
            reply = {
                "addresses": [entries[r]["address"] for r in range(config.world_size)],
                "caps": [entries[r]["caps"] for r in range(config.world_size)],
                "protocol": PROTOCOL,
                "fastcoll": VERSION,
            }
        for sock in socks.values():
            send_message(sock, reply, MESSAGE_LIMIT)
    finally:
        for sock in socks.values():
            sock.close()
    if "error" in reply:
        raise MismatchError(reply["error"])
    return Table(reply["addresses"], reply["caps"])

