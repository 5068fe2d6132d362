"""Shared memory between two ranks on one host, behind the socket interface the TCP transport uses.

A connection between two ranks that turn out to share a host is upgraded after it is made: the
lower rank creates a segment holding two single-producer single-consumer byte rings (one per
direction) and offers it with a random nonce over the authenticated socket; the higher rank
attaches, checks the nonce (so a segment of another host is never taken for it) and answers.
On Linux the segment is a memfd that has no name anywhere, whose size is sealed before it is
offered (F_SEAL_SHRINK, F_SEAL_GROW: neither rank can shrink it under the other, which would
end the other with SIGBUS), and which the peer opens as /proc/<pid>/fd/<fd> of its creator;
nothing is left behind however the processes end. Elsewhere (macOS) it is a POSIX shared-memory
object whose name the attaching rank removes as soon as it holds it (and the creator once
answered). From then on the TCP transport reads and writes a `ShmLink`
as if it were the socket: the bytes go through the rings, and the TCP connection only carries
one-byte doorbells that wake a reader asleep in poll(), and end-of-file when a rank exits. A
message costs two memory copies and no system call where the reader is awake (it spins a few
microseconds first, as the TCP transport's reads do).

Memory ordering: the writer copies the bytes, then publishes the ring's head; the reader reads the
head, then the bytes, then publishes the tail. x86-64 keeps stores in order and loads in order
(TSO), so no fence is needed there. Apple silicon does not, so on macOS a full barrier
(libSystem's OSMemoryBarrier) goes between the copies and the counters. Where neither holds,
connections stay on TCP. Counters are 8-byte aligned words written and read in one access.

The peer can write every word of the segment, so every counter read from it is checked before
it is used (0 <= tail <= head <= tail + capacity): one out of range is a malformed peer
(`RingCorrupt`, which the transport reports as such), never an index outside the ring.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import logging
import mmap
import os
import platform
import secrets
import select
import socket
import stat
import sys
import time
from typing import Callable

from fastcoll import testhooks
from fastcoll.errors import FastcollError
from fastcoll.transport.link import SocketLink
from fastcoll.transport.stream import DONTWAIT, recv_message, remaining, send_message, yield_cpu

log = logging.getLogger("fastcoll.transport")

RING_BYTES = 2 << 20  # per direction and connection; a larger message streams through
_LINE = 128  # Apple silicon's cache line: each counter on its own
_HEAD, _TAIL, _ASLEEP = 0, _LINE // 8, 2 * _LINE // 8  # word indices in a ring's control block
_CONTROL = 3 * _LINE
_MAGIC = b"fastcoll-shm-v1\0"
_PREAMBLE = 64  # magic (16) + nonce (16), padded
PREAMBLE_PAGE = 4096  # where a segment's page-aligned contents may start, after the preamble
_OFFER_LIMIT = 4096
# Linux: segments are sealed memfds of this name (as /proc/<pid>/fd shows it: "/memfd:NAME").
_MEMFD_NAME = "fastcoll-shm"
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
_FD_MAX = 1 << 24  # an fd number an offer may name
# A reader that found its ring empty and went to sleep in poll() is woken by a doorbell, which
# the writer sends only when it sees the reader's "asleep" flag. Without a store-load fence the
# two can cross (each sees the other's old value), so a sleeper also looks again this often.
RECHECK_SECONDS = 0.001
SPIN_CHECKS = 64  # ring checks (each after yield_cpu(), which lets go of the GIL) before sleeping


def _fence_function():
    """(usable, barrier): whether shared memory can be used safely on this platform, and the
    full memory barrier needed between the data and the counters (None: the hardware keeps
    order)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):  # not 32-bit x86: there an 8-byte counter is two stores
        return True, None
    if sys.platform == "darwin":
        try:
            # PyDLL: called with the GIL held (CDLL would let go of it and take it back each time)
            barrier = ctypes.PyDLL("/usr/lib/libSystem.B.dylib").OSMemoryBarrier
        except (OSError, AttributeError):
            return False, None
        barrier.restype = None
        barrier.argtypes = []
        return True, barrier
    return False, None


_usable, fence = _fence_function()


def available() -> bool:
    """Whether this platform can move data through shared memory (see the module's docstring)."""
    return _usable and _shm_api() is not None


def _shm_api():
    try:
        import _posixshmem  # what multiprocessing.shared_memory is built on, on every POSIX CPython
    except ImportError:
        return None
    return _posixshmem


class RingCorrupt(OSError):
    """The peer wrote a ring counter out of range (errno EPROTO): a malformed peer."""


class Ring:
    """One direction: a byte ring in shared memory with a head (bytes ever written, published by
    the writer), a tail (bytes ever read, published by the reader) and the reader's asleep flag.
    Each counter the peer publishes is checked when read (RingCorrupt)."""

    def __init__(self, mem: memoryview, capacity: int):
        self.ctl = mem[:_CONTROL].cast("q")
        self.data = mem[_CONTROL : _CONTROL + capacity]
        self.cap = capacity
        self.head = self.ctl[_HEAD]  # the writer's copy of its own counter
        self.tail = self.ctl[_TAIL]  # the reader's
        # Whichever side this is, its own counter starts from memory the peer could write.
        self.spoiled = None if self.head >= 0 and self.tail >= 0 else ("a start", min(self.head, self.tail))

    def _corrupt(self, what: str, value: int, mine: int) -> RingCorrupt:
        if self.spoiled is not None:
            what, value = self.spoiled
        return RingCorrupt(errno.EPROTO, f"a shared-memory ring counter out of range: {what} {value} where "
                                         f"this side is at {mine}, capacity {self.cap}")

    # writer side
    def free(self) -> int:
        tail = self.ctl[_TAIL]
        if not 0 <= self.head - tail <= self.cap or tail < 0 or self.spoiled:
            raise self._corrupt("tail", tail, self.head)
        return self.cap - (self.head - tail)

    def put(self, src: memoryview | bytes) -> None:
        """Copy src (which fits in free()) after the head; publish() makes it visible."""
        n, i = len(src), self.head % self.cap
        first = min(n, self.cap - i)
        self.data[i : i + first] = src[:first]
        if first < n:
            self.data[: n - first] = src[first:]
        self.head += n

    def publish(self) -> bool:
        """Make what put() wrote visible; True if the reader is asleep and needs a doorbell."""
        if fence is not None:
            fence()
        self.ctl[_HEAD] = self.head
        if self.ctl[_ASLEEP]:
            self.ctl[_ASLEEP] = 0
            return True
        return False

    # reader side
    def get(self, dst) -> int:
        """Copy up to len(dst) published bytes into dst (bytes); how many."""
        head = self.ctl[_HEAD]
        avail = head - self.tail
        if not 0 < avail <= self.cap or self.spoiled:
            if avail == 0 and not self.spoiled:
                return 0
            raise self._corrupt("head", head, self.tail)
        if fence is not None:
            fence()
        n, i = min(avail, len(dst)), self.tail % self.cap
        first = min(n, self.cap - i)
        dst[:first] = self.data[i : i + first]
        if first < n:
            dst[first:n] = self.data[: n - first]
        if fence is not None:
            fence()
        self.tail += n
        self.ctl[_TAIL] = self.tail
        return n

    def ready(self) -> bool:
        return self.ctl[_HEAD] != self.tail

    def sleep(self) -> bool:
        """Raise the asleep flag before a wait; False if data came meanwhile (do not sleep)."""
        self.ctl[_ASLEEP] = 1
        if fence is not None:
            fence()
        return not self.ready()


def _bytes(data) -> memoryview | bytes:
    if type(data) is bytes:
        return data
    mv = memoryview(data)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class ShmLink:
    """A link (fastcoll/transport/link.py) whose bytes go through two rings; `sock` (the TCP
    connection the rings replaced) carries doorbells and the end of the connection."""

    kind = "shm"
    # A sleeper looks at its ring again this often, in case a doorbell was never sent.
    recheck_s = RECHECK_SECONDS

    def __init__(self, sock: socket.socket, tx: Ring, rx: Ring, segment: tuple | None = None):
        # (mapping, tx offset, rx offset, capacity): where the rings lie, for an engine that
        # takes the link over (fastcoll/engine/native.py)
        self.segment = segment
        # A blocking socket: each call on it passes MSG_DONTWAIT where it must not wait (with a
        # Python-level timeout left from the handshake, a DONTWAIT recv would raise a timeout).
        sock.settimeout(None)
        self.sock = sock
        self.tx, self.rx = tx, rx  # their views keep the mapping alive
        self._send_timeout: float | None = None
        self._recv_timeout: float | None = None
        self._shut = False  # shutdown(SHUT_WR) was called: nothing more goes out
        self._eof = False  # the peer closed its end
        self._closed = False
        self._poll = select.poll()  # poll(), not select(): any fd number
        self._poll.register(sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self.sock.fileno()

    def set_timeouts(self, seconds: float) -> None:
        """Bound this link's blocking waits as SO_SNDTIMEO/SO_RCVTIMEO bound a socket's."""
        self._send_timeout = self._recv_timeout = seconds

    def fits(self, nbytes: int) -> bool:
        try:
            return self.tx.free() >= nbytes
        except RingCorrupt:
            return False  # the send that follows reports it

    def ready(self) -> bool:
        return self.rx.ready()

    def prepare_sleep(self) -> bool:
        return self.rx.sleep()

    def woken(self) -> None:
        self.drain()

    # ---- sending
    def _write(self, views) -> None:
        """Put views (which fit in the ring) after the head, publish once, ring if need be."""
        for v in views:
            self.tx.put(v)
        if self.tx.publish():
            try:
                self.sock.send(b"\0", DONTWAIT)
            except OSError:  # doorbells already queued (the reader will wake), or the peer is
                pass  # gone (the next wait on it finds out)

    def _check_send(self) -> None:
        if self._shut or self._closed:
            raise BrokenPipeError("connection shut for writing")

    def _wait_space(self, deadline: float | None) -> None:
        """Until the ring has room (the reader has no doorbell for this: it is a rarer wait,
        and a short sleep costs little next to the copy of a large message)."""
        spins, nap = 0, 1e-5
        while not self.tx.free():
            self._check_send()
            if deadline is not None and time.monotonic() > deadline:
                raise BlockingIOError("send timed out")  # what SO_SNDTIMEO gives a socket
            spins += 1
            if spins < SPIN_CHECKS:
                yield_cpu()
                continue
            # The peer's end of the stream. drain() takes doorbells too, which a reading thread
            # of this rank may have wanted: it looks at its ring again within RECHECK_SECONDS.
            self.drain()
            if self._eof:
                raise BrokenPipeError("the peer closed its connection")
            time.sleep(nap)
            nap = min(nap * 2, RECHECK_SECONDS)

    def sendall(self, data) -> None:
        self._check_send()
        src = _bytes(data)
        deadline = None if self._send_timeout is None else time.monotonic() + self._send_timeout
        done, n = 0, len(src)
        while done < n:
            room = self.tx.free()
            if not room:
                self._wait_space(deadline)
                continue
            k = min(room, n - done)
            self._write((src[done : done + k],))
            done += k

    def sendmsg(self, buffers) -> int:
        """As a socket's: all of `buffers` if they fit (the common case: one publish), else as
        many bytes as there is room for, waiting up to the send timeout for the first
        (BlockingIOError then). Returns how many bytes went."""
        views = [_bytes(b) for b in buffers]
        total = sum(map(len, views))
        self._check_send()
        room = self.tx.free()
        if total <= room:
            self._write(views)
            return total
        room = self._room(0)
        out, sent = [], 0
        for v in views:
            if sent + len(v) > room:
                out.append(v[: room - sent])
                sent = room
                break
            out.append(v)
            sent += len(v)
        self._write(out)
        return sent

    def send(self, data, flags: int = 0) -> int:
        """As a socket's: as many bytes of `data` as there is room for now, waiting up to the
        send timeout for room (none with MSG_DONTWAIT): BlockingIOError when there is none."""
        self._check_send()
        src = _bytes(data)
        room = self._room(flags)
        k = min(room, len(src))
        self._write((src[:k],))
        return k

    def _room(self, flags: int) -> int:
        """Free bytes in the ring, once there are any (waiting up to the send timeout, or not
        at all with MSG_DONTWAIT); BlockingIOError if none came."""
        room = self.tx.free()
        if room:
            return room
        if flags & DONTWAIT:
            raise BlockingIOError("ring full")
        self._wait_space(None if self._send_timeout is None else time.monotonic() + self._send_timeout)
        return self.tx.free()

    # ---- receiving
    def drain(self) -> None:
        """Take the doorbells; note end-of-file. Call when poll() finds the socket readable."""
        while not self._eof:
            try:
                got = self.sock.recv(4096, DONTWAIT)
            except BlockingIOError:
                return
            except OSError:  # reset: the peer is gone as surely as with an orderly end
                got = b""
            if not got:
                self._eof = True
            elif len(got) < 4096:
                return

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        dst = memoryview(buffer)[:nbytes] if nbytes else buffer  # a bytearray or a 1-D byte memoryview
        n = self.rx.get(dst)
        if n:
            return n
        if flags & DONTWAIT:
            # No system call here: this is the transport's spin. Its poll() takes the
            # doorbells and notes the end of the stream (drain()).
            if self._eof:
                return 0
            raise BlockingIOError("nothing in the ring")
        return self._wait_data(dst)

    def _wait_data(self, dst) -> int:
        deadline = None if self._recv_timeout is None else time.monotonic() + self._recv_timeout
        spins = 0
        while True:
            n = self.rx.get(dst)
            if n:
                return n
            if self._eof:
                return 0
            spins += 1
            if spins < SPIN_CHECKS:
                # The rest of a large message: this rank's own sender thread may be filling its
                # peer's ring meanwhile, and a pure-Python spin would keep the GIL from it.
                yield_cpu()
                continue
            self.drain()
            if deadline is not None and time.monotonic() > deadline:
                raise BlockingIOError("receive timed out")  # what SO_RCVTIMEO gives a socket
            if self.rx.sleep():
                wait = RECHECK_SECONDS if deadline is None else min(RECHECK_SECONDS, remaining(deadline))
                self._poll.poll(wait * 1000)

    # ---- ending
    def shutdown(self, how: int) -> None:
        self._shut = True
        self.sock.shutdown(how)

    def close(self) -> None:
        # The mapping itself is left to the garbage collector: a sender thread that gave up
        # waiting for room may still hold the ring, and unmapping under it would crash it.
        self._closed = True
        self.sock.close()


def _segment_size(capacity: int) -> int:
    return _PREAMBLE + 2 * (_CONTROL + capacity)


def _rings(mem: mmap.mmap, capacity: int, lower: bool) -> tuple[Ring, Ring, tuple]:
    """(tx, rx, segment) for the lower rank or the higher one: ring 0 carries lower -> higher;
    segment is (mem, tx offset, rx offset, capacity)."""
    view = memoryview(mem)
    # Map every page now (a read of one byte per page): the first large message would otherwise
    # take its page faults mid-collective, and the rank's resident size would creep up later.
    bytes(view[:: mmap.PAGESIZE])
    size = _CONTROL + capacity
    first = Ring(view[_PREAMBLE : _PREAMBLE + size], capacity)
    second = Ring(view[_PREAMBLE + size : _PREAMBLE + 2 * size], capacity)
    view.release()
    if lower:
        return first, second, (mem, _PREAMBLE, _PREAMBLE + size, capacity)
    return second, first, (mem, _PREAMBLE + size, _PREAMBLE, capacity)


def pair(capacity: int = RING_BYTES) -> tuple[ShmLink, ShmLink]:
    """Two ShmLinks joined to each other in this process (socket.socketpair's twin, over an
    anonymous mapping), as upgrade() joins two ranks: for tests and measurements."""
    mem = mmap.mmap(-1, _segment_size(capacity))
    a, b = socket.socketpair()
    return ShmLink(a, *_rings(mem, capacity, lower=True)), ShmLink(b, *_rings(mem, capacity, lower=False))


def create_segment(size: int) -> tuple[str, bytes, mmap.mmap]:
    """A new shared-memory segment of `size` bytes (its first bytes hold a magic and a
    random nonce): its name, the nonce, and this process's mapping. Unlink the name once the
    peers have attached; OSError where shared memory cannot be had."""
    api = _shm_api()
    name = "/fc" + secrets.token_hex(12)  # macOS allows 31 characters
    nonce = secrets.token_bytes(16)
    fd = api.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        try:
            if hasattr(os, "posix_fallocate"):
                # Reserve the pages now: a tmpfs out of room would otherwise SIGBUS on first touch.
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            mem = mmap.mmap(fd, size)
        except BaseException:
            api.shm_unlink(name)
            raise
    finally:
        os.close(fd)
    mem[: len(_MAGIC) + len(nonce)] = _MAGIC + nonce
    return name, nonce, mem


def attach_segment(name: str, nonce: bytes, size: int) -> mmap.mmap | None:
    """A peer's segment made by create_segment, if it is on this host (it exists here, is at
    least `size` bytes and holds the nonce), else None."""
    api = _shm_api()
    try:
        fd = api.shm_open(name, os.O_RDWR, mode=0o600)
    except OSError:
        return None  # another host
    try:
        if os.fstat(fd).st_size < size:
            return None
        mem = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    if mem[: len(_MAGIC) + len(nonce)] != _MAGIC + nonce:
        mem.close()
        return None
    return mem


def unlink_segment(name: str) -> None:
    """Remove a segment's name (the mappings stay valid)."""
    _shm_api().shm_unlink(name)


def _unlink_quietly(name: str) -> None:
    try:
        unlink_segment(name)
    except FileNotFoundError:  # the attaching rank removed it first
        pass


def _memfd_usable() -> bool:
    """Linux: ring segments are sealed memfds (the module's docstring says why)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS") \
        and _SEALS != 0


def _create(capacity: int) -> tuple[dict, bytes, mmap.mmap, Callable[[], None]]:
    """A new segment for two rings of `capacity`: where the peer finds it (an offer's "memfd":
    [pid, fd], or its "name"), its nonce, this rank's mapping, and what to call once the peer
    has answered (closes the fd, or removes the name). OSError where shared memory cannot be had."""
    size = _segment_size(capacity)
    if not _memfd_usable():
        name, nonce, mem = create_segment(size)
        return {"name": name}, nonce, mem, functools.partial(_unlink_quietly, name)
    fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.posix_fallocate(fd, 0, size)  # the pages now: a tmpfs out of room would SIGBUS on first touch
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)  # its size, for good
        mem = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    nonce = secrets.token_bytes(16)
    mem[: len(_MAGIC) + len(nonce)] = _MAGIC + nonce
    return {"memfd": [os.getpid(), fd]}, nonce, mem, functools.partial(os.close, fd)


def _attach(where: dict, nonce: bytes, capacity: int, what: str) -> mmap.mmap | None:
    """The segment a peer (`what`) offered, if it is on this host and holds the nonce, else None.
    A named one loses its name here: both ranks hold it now, and a job killed later leaves
    nothing behind."""
    size = _segment_size(capacity)
    if "name" in where:
        mem = attach_segment(where["name"], nonce, size)
        if mem is not None:
            _unlink_quietly(where["name"])
        return mem
    pid, fd = where["memfd"]
    path = f"/proc/{pid}/fd/{fd}"
    try:
        if not os.readlink(path).startswith(f"/memfd:{_MEMFD_NAME}"):
            return None
        mine = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # another host, another user or PID namespace: the connection stays on TCP
    try:
        return _map_sealed(mine, nonce, size, what)
    finally:
        os.close(mine)


def _map_sealed(fd: int, nonce: bytes, size: int, what: str) -> mmap.mmap | None:
    """Map a memfd a peer offered: a file of `size` bytes or more whose size is sealed, holding the
    nonce; None if it is not that segment."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < size:
            return None
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise FastcollError(f"{what} offered a shared-memory segment whose size is not sealed (it could "
                                "shrink it under this rank): a malformed peer; refused")
        mem = mmap.mmap(fd, size)
    except OSError:
        return None
    if mem[: len(_MAGIC) + len(nonce)] != _MAGIC + nonce:
        mem.close()
        return None
    return mem


def _where(offer: dict) -> dict | None:
    """Where an offer says its segment is ({"name": ...} or {"memfd": [pid, fd]}), if well formed."""
    name, memfd = offer.get("name"), offer.get("memfd")
    if (name is None) == (memfd is None):
        return None
    if name is not None:
        return {"name": name} if isinstance(name, str) and name.startswith("/fc") and len(name) <= 31 else None
    ok = (isinstance(memfd, list) and len(memfd) == 2 and all(type(v) is int for v in memfd)
          and 0 < memfd[0] < 1 << 31 and 0 <= memfd[1] < _FD_MAX)
    return {"memfd": list(memfd)} if ok else None


def _check_offer(offer: object, what: str) -> tuple[dict, bytes, int] | None:
    if offer is None:
        return None
    where = _where(offer) if isinstance(offer, dict) else None
    nonce = offer.get("nonce") if isinstance(offer, dict) else None
    try:
        raw = bytes.fromhex(nonce) if isinstance(nonce, str) and len(nonce) == 32 else None
    except ValueError:
        raw = None
    if where is None or raw is None or offer.get("capacity") != RING_BYTES:
        raise FastcollError(f"{what} sent a malformed shared-memory offer")
    return where, raw, offer["capacity"]


def host_id() -> str:
    """This host as the rendezvous table shows it: segments are offered only to ranks with the
    same id (the nonce check decides; this only spares segments for ranks that surely are
    elsewhere)."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}/{boot}"


def upgrade(
    rank: int, links: dict[int, list[SocketLink]], enabled: bool, deadline: float, here: set[int] | None = None
) -> dict[int, list[SocketLink | ShmLink]]:
    """Replace each link to a rank on this host by a ShmLink over its socket, where both ends
    want it; the others are returned as they came.

    Every rank must call it with its freshly made links (no data sent yet). `here`: the ranks
    that may share this host (default: all). Offers go from the lower rank to the higher,
    answers back; all offers are sent before any is read, so no two ranks wait on each other."""
    enabled = enabled and available()
    made: dict[tuple[int, int], tuple[Callable[[], None], mmap.mmap]] = {}
    out: dict[int, list[SocketLink | ShmLink]] = {p: list(ls) for p, ls in links.items()}
    ok = False
    try:
        _offer(rank, links, enabled, here, made)
        testhooks.point("shm-offered")
        _answer(rank, links, enabled, deadline, out)
        _collect(links, deadline, made, out)
        ok = True
    finally:
        for forget, mem in made.values():
            forget()
            mem.close()
        if not ok:  # a peer failed mid-way: the job cannot start, so nothing is kept open
            for ls in out.values():
                for link in ls:
                    link.close()
    _say_shared(rank, out, enabled, here)
    return out


def _offer(rank: int, links: dict[int, list[SocketLink]], enabled: bool, here: set[int] | None,
           made: dict[tuple[int, int], tuple[Callable[[], None], mmap.mmap]]) -> None:
    """To each higher rank, on each link: a fresh segment (kept in `made`), or None."""
    for p, ls in links.items():
        if p < rank:
            continue
        for ch, link in enumerate(ls):
            offer = None
            if enabled and (here is None or p in here):
                try:
                    where, nonce, mem, forget = _create(RING_BYTES)
                    made[(p, ch)] = (forget, mem)
                    offer = {**where, "nonce": nonce.hex(), "capacity": RING_BYTES}
                except OSError as e:
                    log.info("rank %d: no shared memory for rank %d (%s); staying on TCP", rank, p, e)
            send_message(link.sock, offer, _OFFER_LIMIT)


def _answer(rank: int, links: dict[int, list[SocketLink]], enabled: bool, deadline: float,
            out: dict[int, list[SocketLink | ShmLink]]) -> None:
    """Each lower rank's offer: attach its segment if it can (a ShmLink in `out`), and say so."""
    for p, ls in links.items():
        if p > rank:
            continue
        for ch, link in enumerate(ls):
            what = f"rank {p}"
            found = _check_offer(recv_message(link.sock, _OFFER_LIMIT, deadline, what), what)
            if found is None:
                continue  # nothing offered, nothing to answer
            mem = _attach(*found, what) if enabled else None
            if mem is not None:  # its rings read their starts before the answer lets the peer write
                out[p][ch] = ShmLink(link.sock, *_rings(mem, RING_BYTES, lower=False))
            send_message(link.sock, mem is not None, _OFFER_LIMIT)


def _collect(links: dict[int, list[SocketLink]], deadline: float,
             made: dict[tuple[int, int], tuple[Callable[[], None], mmap.mmap]],
             out: dict[int, list[SocketLink | ShmLink]]) -> None:
    """Each answer to this rank's offers: a ShmLink where the peer attached; the segment's fd
    closed (or name removed) either way (both ends have it mapped, or nobody needs it)."""
    for (p, ch), (forget, mem) in list(made.items()):
        sock = links[p][ch].sock
        taken = recv_message(sock, _OFFER_LIMIT, deadline, f"rank {p}")
        forget()
        del made[(p, ch)]
        if taken is True:
            out[p][ch] = ShmLink(sock, *_rings(mem, RING_BYTES, lower=True))
        else:
            mem.close()


def _say_shared(rank: int, out: dict[int, list[SocketLink | ShmLink]], enabled: bool, here: set[int] | None) -> None:
    shared = sum(link.kind == "shm" for ls in out.values() for link in ls)
    peers = sorted(p for p, ls in out.items() if any(link.kind == "shm" for link in ls))
    if shared:
        # Said at info because it bypasses the network: namespaces or containers that keep the
        # machine's hostname and see each other's processes look like one host (docs/multihost.md).
        log.info("rank %d: %d of %d connections through shared memory, to rank(s) %s (same hostname "
                 "and boot id, and their shared-memory segment opened here); FASTCOLL_SHM=0 keeps "
                 "them on TCP", rank, shared, sum(map(len, out.values())), peers)
    elif not enabled and here and here - {rank}:
        log.info("rank %d: shared memory is off (FASTCOLL_SHM=0, or no POSIX shared memory here): "
                 "rank(s) %s of this host stay on TCP", rank, sorted(here - {rank}))
