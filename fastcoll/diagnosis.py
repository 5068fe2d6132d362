"""Who stopped answering: what the ranks that can still talk tell each other when a call times out.

A rank whose wait runs out knows only whom it waited for, which is often a healthy neighbour
that was itself waiting. So before it raises, it tells every peer whom it waited for (its abort
notice carries that rank: `Transport.abort`), every peer that hears such a notice stops waiting
and tells its own, and each rank collects the notices for a moment (`Transport.notices`). From
the reports it follows the chain of waits from itself: the first rank on it that sent no
report (it is cut off, stopped, or gone) is the one that stopped answering, and every rank that
can still talk names the same one, with its host. A rank that heard from nobody says that its own
link is the likely failure. A chain that closes on itself, every rank in it having reported, is a
cycle of waits: a message between them was lost one way, or they called collectives in different
orders; unless this rank had only just entered the call when it heard of the timeout, and the
chain comes back to it: then it was the rank the others waited for, and came too late.
"""

from __future__ import annotations

import os
from typing import Callable

from fastcoll.errors import CollectiveTimeoutError, PeerLostError

# How long a rank collects the others' notices: long enough for every rank that is waiting in a
# transport (they answer within milliseconds), short beside the timeout that has already run out.
WINDOW_MAX_S = 1.0


def window(limit: float) -> float:
    """Seconds to collect notices for, after a wait of `limit` seconds ran out."""
    return min(WINDOW_MAX_S, max(0.05, limit / 4))


def timed_out(message: str, waiting_for: int | None, moving: bool = False) -> CollectiveTimeoutError:
    """A CollectiveTimeoutError that knows which rank the wait was for, and whether data still
    moved on that rank's link when the call's limit ran out (then no rank stopped)."""
    err = CollectiveTimeoutError(message)
    err.waiting_for = waiting_for
    err.moving = moving
    return err


def on_host(error: PeerLostError, hosts: list[str]) -> PeerLostError:
    """`error`, saying which host its lost rank ran on, where the job knows it: across hosts the
    host is what a user goes to look at."""
    host = "" if error.peer is None else _host(error.peer, hosts)
    if not host:
        return error
    named = PeerLostError(f"{error}; rank {error.peer} ran on host {host}", error.peer)
    named.__cause__ = error.__cause__
    return named


def _host(rank: int, hosts: list[str]) -> str:
    """Rank `rank`'s host name, or "" where the job does not know it."""
    return hosts[rank] if 0 <= rank < len(hosts) and hosts[rank] else ""


def rank_name(rank: int, hosts: list[str]) -> str:
    """'rank 1 (host host2)', or 'rank 1' where the job does not know its host: how every
    message names a rank."""
    host = _host(rank, hosts)
    return f"rank {rank} (host {host})" if host else f"rank {rank}"


def this_process() -> dict:
    """This process as a peer on the same host can find it again (`process_state`): its pid and,
    on Linux, its start time and pid namespace, which tell it apart from a later process that
    got the same pid, or one of another container."""
    me: dict = {"pid": os.getpid()}
    try:
        with open("/proc/self/stat") as f:
            me["start"] = int(f.read().rpartition(")")[2].split()[19])  # field 22: start time
        me["ns"] = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError, IndexError):
        pass
    return me


def process_state(process: object) -> str | None:
    """What a peer's process on this host (`this_process()` there, as the rendezvous brought it)
    is doing, in words for a timeout's message, or None where this host cannot tell (not Linux,
    another pid namespace, a process that is not the one that joined)."""
    if not isinstance(process, dict) or "start" not in process:
        return None
    pid, start = process.get("pid"), process.get("start")
    if not isinstance(pid, int) or not 0 < pid < 1 << 31 or process.get("ns") != this_process().get("ns"):
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        state, started = fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None  # gone since: its connection's end says so, not this
    if started != start or state in ("Z", "X"):
        return None
    if state in ("T", "t"):
        return (f"it is stopped (process {pid} on this host, stopped by a signal or held by a "
                "debugger) and has not made this call")
    return (f"it is alive (process {pid} on this host) but has not made this call: it is busy "
            "elsewhere, or waits for something else")


def explain(me: int, size: int, reports: dict[int, int | None], lost: set[int], hosts: list[str],
            late: bool = False, state: Callable[[int], str | None] | None = None) -> tuple[int | None, str]:
    """(the rank that stopped answering, or None for a cycle; what to say), from this rank's
    view. `reports[r]`: whom rank r waited for (None: it gave up for another reason), this rank's
    own among them; `lost`: peers whose connection ended; `late`: this rank was told of a peer's
    timeout soon after it entered the call, so a chain of waits that ends at it means it was the
    one that came too late; `state(r)`: what rank r's process is doing, where this rank can see
    it (`process_state`), else None."""
    said = state or (lambda r: None)
    heard = set(reports) - {me}
    if not heard and not lost and size == 2:  # one peer: it, or the one link to it, failed
        other = 1 - me
        doing = said(other)
        return other, (f"{rank_name(other, hosts)} stopped answering: " + (doing or (
            f"it stopped, or the network between it and {rank_name(me, hosts)} failed")))
    if not heard and not lost and size > 2:
        return me, (f"no rank answered {rank_name(me, hosts)}: its own network (or every peer at once) "
                    "failed")
    if reports.get(me) is None:  # this rank's own wait names no rank (a send, a flush)
        if lost:
            gone = min(lost)
            return gone, f"{rank_name(gone, hosts)} is gone (its connection ended)"
        silent = [r for r in range(size) if r != me and r not in reports]
        if silent:
            names = ", ".join(rank_name(r, hosts) for r in silent)
            return silent[0], f"{names} told no rank whom they wait for: they stopped answering"
        return None, "every rank answered: the wait that ran out was this rank's own"
    chain = [me]
    cur = reports.get(me)
    while cur is not None and cur not in chain:
        chain.append(cur)
        if cur in lost:
            return cur, f"{_waits(chain, hosts)}: {rank_name(cur, hosts)} is gone (its connection ended)"
        if cur not in reports:
            doing = said(cur)
            return cur, (f"{_waits(chain, hosts)}: {rank_name(cur, hosts)} stopped answering (it told no rank "
                         "whom it waits for)" + (f": {doing}" if doing else ""))
        cur = reports[cur]
    if cur is None:
        last = chain[-1]
        return last, f"{_waits(chain, hosts)}: {rank_name(last, hosts)} waits for nobody (it gave up for another reason)"
    if late and cur == me and len(chain) > 1:
        return me, (f"{_waits(chain[1:] + [me], hosts)}: {rank_name(me, hosts)}, this rank, came to the "
                    "call only after the others had waited out their limit for it (it was stopped, "
                    "busy or far behind)")
    loop = chain[chain.index(cur):] + [cur]
    names = ", ".join(rank_name(r, hosts) for r in loop[:-1])
    return None, (f"the ranks wait for each other in a cycle ({' -> '.join(map(str, loop))}: "
                  f"{names}), each having reported: a message between them was lost one way, or "
                  "they called collectives in different orders")


def _waits(chain: list[int], hosts: list[str]) -> str:
    if len(chain) <= 2:
        return f"rank {chain[0]} waits for {rank_name(chain[1], hosts)}"
    hops = ", ".join(f"rank {a} waits for rank {b}" for a, b in zip(chain, chain[1:]))
    return hops
