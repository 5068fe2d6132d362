"""FASTCOLL_TRANSPORT=rdma: verbs links (RDMA queue pairs) to the peers that have a device.

The job forms as the `tcp` transport's does (rendezvous, an authenticated TCP connection to every
peer, shared memory to the ranks of this host); then, toward each peer for which this rank has an
RDMA device, the native engine opens a verbs link over that connection (the queue pairs' numbers
are exchanged on it, and it stays open for the job's life, so that a peer's death ends every wait
on it). The devices come from FASTCOLL_RDMA_DEVICES (one entry per rank, in MLX's hostfile `rdma`
form; fastcoll-launch sets it from an MLX hostfile), or, where it is unset, the verbs library's
first device toward every peer. The verbs library is FASTCOLL_VERBS_LIB, else the platform's
(`librdma.dylib`, Apple's RDMA over Thunderbolt; `libibverbs.so.1`, rdma-core on Linux).

Only the native engine drives verbs links. Every rank says at the rendezvous whether it can run
them (`Setup.caps`), and every rank checks the others' word (`Setup.plan`) before any link is
made, so that a missing library or device on one rank is one clear error on every rank, never a
hang: the other ranks would otherwise wait in their link's setup for a peer that never comes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

from fastcoll.errors import FastcollError, MismatchError

# The platform's verbs library, loaded only when a job asks for rdma (never at import).
DEFAULT_LIBRARY = "librdma.dylib" if sys.platform == "darwin" else "libibverbs.so.1"
# The longest reason a rank may give at the rendezvous for not running RDMA (it is printed).
MAX_PROBLEM = 500


def library_hint(library: str | None) -> str:
    """What to do when `library` (None: the platform's) does not load."""
    if library:
        return "FASTCOLL_VERBS_LIB names it: check the path"
    if sys.platform == "darwin":
        return "RDMA over Thunderbolt needs macOS 26.2 or later; FASTCOLL_VERBS_LIB names another library"
    return "install rdma-core's libibverbs (Debian: libibverbs1), or name a library with FASTCOLL_VERBS_LIB"


def list_devices(library: str | None) -> list[str]:
    """The RDMA devices `library` (None: DEFAULT_LIBRARY) lists on this host, in its order.
    OSError with a one-line reason where the library cannot be loaded or cannot list them."""
    name = library or DEFAULT_LIBRARY
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        get_list, get_name, free_list = lib.ibv_get_device_list, lib.ibv_get_device_name, lib.ibv_free_device_list
    except (OSError, AttributeError) as e:
        raise OSError(f"cannot load the verbs library {name} ({' '.join(str(e).split())}); "
                      f"{library_hint(library)}") from None
    get_list.restype = ctypes.POINTER(ctypes.c_void_p)
    get_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.c_void_p]
    free_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    count = ctypes.c_int(0)
    devices = get_list(ctypes.byref(count))
    if not devices:
        err = ctypes.get_errno()
        # rdma-core answers ENOSYS where the kernel has no verbs support at all (no RDMA here).
        hint = ": this kernel has no RDMA (verbs) support" if err == errno.ENOSYS else ""
        raise OSError(f"the verbs library {name} cannot list RDMA devices"
                      + (f" ({os.strerror(err)}){hint}" if err else ""))
    try:
        # Bounded: a library may report any count; 4096 devices is beyond any host.
        return [get_name(devices[i]).decode("utf-8", "replace") for i in range(min(max(count.value, 0), 4096))
                if devices[i]]
    finally:
        free_list(devices)


def no_devices_hint() -> str:
    if sys.platform == "darwin":
        return "is RDMA over Thunderbolt enabled? (`rdma_ctl enable` in macOS Recovery; `ibv_devices` lists them)"
    return "`ibv_devices` lists them"


def device_problem(library: str | None, named: list[str]) -> tuple[str | None, str | None]:
    """(None, the library's first device) where `library` (None: the platform's) loads and lists
    every device in `named`, else (why not, None)."""
    try:
        found = list_devices(library)
    except OSError as e:
        return str(e), None
    if not found:
        return f"the verbs library {library or DEFAULT_LIBRARY} lists no RDMA device here: {no_devices_hint()}", None
    missing = [n for n in named if n not in found]
    if missing:
        return (f"no RDMA device {', '.join(missing)} here (the verbs library {library or DEFAULT_LIBRARY} "
                f"lists {', '.join(found)})"), None
    return None, found[0]


class Setup:
    """This rank's side of an rdma job: whether it can run verbs links, and toward whom."""

    def __init__(self, config: Any, engine_problem: str | None):
        self.config = config
        self.engine_problem = engine_problem  # the engine's answer (fastcoll.engine.verbs_problem)
        self.first_device: str | None = None  # the library's first, for peers with no name given
        self.problem = self._problem()

    def wants(self) -> list[bool]:
        """For each rank, whether this rank asks for a verbs link to it."""
        devices = self.config.rdma_devices
        me, size = self.config.rank, self.config.world_size
        return [r != me and (devices is None or devices[r] is not None) for r in range(size)]

    def caps(self) -> dict:
        """What this rank says at the rendezvous (Setup.plan reads every rank's)."""
        return {"peers": self.wants(), "reliable": self.config.rdma_reliable, "problem": self.problem}

    def _problem(self) -> str | None:
        """None where this rank can open its verbs links, else why not, in one line."""
        config = self.config
        if not config.native:
            return "FASTCOLL_TRANSPORT=rdma needs the native engine, and FASTCOLL_NATIVE=0 asks for the pure-Python one"
        why = self.engine_problem
        if why is not None or not any(self.wants()):
            return why  # (every peer over TCP or shared memory: no library needed)
        named = sorted({n for names in (config.rdma_devices or ()) if names for n in names})
        why, self.first_device = device_problem(config.verbs_lib, named)
        return why

    def plan(self, caps: list[dict], hosts: list[str]) -> dict[int, list[str]]:
        """From every rank's rendezvous capabilities: this rank's verbs links, as the device of
        each connection to each peer. Raises the same error on every rank where the ranks cannot
        all open theirs: a rank that cannot run RDMA (FastcollError naming it and why), ranks
        that disagree on reliability or on whether a pair of them uses RDMA (MismatchError)."""
        offers = [_offer(c.get("rdma"), r, len(caps)) for r, c in enumerate(caps)]
        _refuse_problems(offers, hosts)
        modes = {o["reliable"] for o in offers}
        if len(modes) > 1:
            which = {r: int(o["reliable"]) for r, o in enumerate(offers)}
            raise MismatchError(f"ranks disagree on FASTCOLL_RDMA_RELIABLE: {which}")
        for a, oa in enumerate(offers):
            for b in range(a + 1, len(offers)):
                if oa["peers"][b] != offers[b]["peers"][a]:
                    yes, no = (a, b) if oa["peers"][b] else (b, a)
                    raise MismatchError(
                        f"ranks disagree on FASTCOLL_RDMA_DEVICES: rank {yes} names an RDMA device toward rank {no}, "
                        f"and rank {no} none toward rank {yes} (null): both ends of a pair use RDMA, or neither")
        return self._devices()

    def _devices(self) -> dict[int, list[str]]:
        config, wants = self.config, self.wants()
        out = {}
        for p, want in enumerate(wants):
            if want:
                names = config.rdma_devices[p] if config.rdma_devices is not None else (self.first_device,)
                out[p] = [names[ch % len(names)] for ch in range(config.connections)]
        return out


def _offer(raw: object, rank: int, size: int) -> dict:
    """A rank's `rdma` capability, checked: a peer's table entry is read, never trusted."""
    ok = (isinstance(raw, dict) and isinstance(raw.get("peers"), list) and len(raw["peers"]) == size
          and all(isinstance(v, bool) for v in raw["peers"]) and isinstance(raw.get("reliable"), bool)
          and (raw.get("problem") is None or isinstance(raw.get("problem"), str)))
    if not ok:
        raise FastcollError(f"rank {rank}'s rendezvous entry has no valid `rdma` capability (is it another fastcoll?)")
    return raw  # type: ignore[return-value]


def _refuse_problems(offers: list[dict], hosts: list[str]) -> None:
    """FastcollError naming every rank that cannot run RDMA and why (ranks with one reason together)."""
    by_reason: dict[str, list[int]] = {}
    for r, o in enumerate(offers):
        if o["problem"]:
            by_reason.setdefault(" ".join(o["problem"].split())[:MAX_PROBLEM], []).append(r)
    if not by_reason:
        return
    parts = []
    for reason, ranks in by_reason.items():
        where = ", ".join(f"{r} ({hosts[r]})" if hosts[r] else str(r) for r in ranks)
        parts.append(f"on rank{'s' if len(ranks) > 1 else ''} {where}: {reason}")
    raise FastcollError("RDMA cannot run " + "; ".join(parts))


class VerbsLink:
    """A connection that the native engine turns into a verbs link (NativeEngine.over): the
    authenticated socket it exchanges the queue pairs' numbers on, the device toward the peer, and
    whether the peer runs on this host (then the link tells the engine which CPU it runs on, so
    that two ranks the scheduler put on one CPU are parted, as over shared memory)."""

    kind = "verbs"

    def __init__(self, sock: Any, device: str, same_host: bool = False):
        self.sock = sock
        self.device = device
        self.same_host = same_host

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


def upgrade(links: dict[int, list[Any]], devices: dict[int, list[str]],
            here: set[int] | frozenset[int] = frozenset()) -> dict[int, list[Any]]:
    """The links, those to the peers in `devices` (Setup.plan's) as VerbsLinks; `here`: the
    peers on this host (the rendezvous table's same_host)."""
    return {p: [VerbsLink(link.sock, devices[p][ch], p in here) if p in devices else link
                for ch, link in enumerate(ls)]
            for p, ls in links.items()}


def describe(kinds: list[str], details: list[str]) -> str:
    """transport_info()'s words for a job's connections: 'rdma (verbs: rdma_en3, UC, MTU 1024) on
    3 of 3 connections' (`details`: each verbs link's own description, the distinct ones listed),
    after 'tcp, shared memory on ...' where some are not RDMA."""
    n, shm, verbs = len(kinds), kinds.count("shm"), kinds.count("verbs")
    rdma = f"rdma (verbs: {'; '.join(dict.fromkeys(details))}) on {verbs} of {n} connections"
    if verbs == n:
        return rdma
    words = ["tcp"] + ([f"shared memory on {shm} of {n} connections"] if shm else []) + ([rdma] if verbs else [])
    return ", ".join(words)


def connect(config: Any, caps: dict[str, Any], deadline: float) -> Any:
    """The transport registry's entry point, for the pure-Python engine: verbs links have none
    (fastcoll.engine.connect takes an rdma job to the native engine, or refuses it on every rank)."""
    raise FastcollError("FASTCOLL_TRANSPORT=rdma runs on the native engine only")
