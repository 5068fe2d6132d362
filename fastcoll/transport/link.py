"""A link: one connection to one peer, as the TCP transport uses it.

The TCP transport reads and writes links, never sockets directly, so that a connection between
two ranks of one host can be carried by shared memory (`fastcoll.transport.shm.ShmLink`) behind
the same calls. A link offers the socket calls the transport makes (`fileno`, `sendall`,
`sendmsg`, `send`, `recv_into`, `shutdown`, `close`) and five more that say what a socket cannot:

    set_timeouts(s)   how long a blocking send or receive may wait before BlockingIOError
    fits(n)           whether n bytes can be written now without waiting (a socket: unknown, False)
    ready()           whether data waits that poll() would not report (a socket: never)
    prepare_sleep()   about to sleep in poll(): False if data came meanwhile (do not sleep)
    woken()           poll() reported the file descriptor readable: take what wakes it

and two attributes: `kind` ("tcp", "shm") for `transport_info()`, and `recheck_s`, the longest
the transport may sleep in poll() before it looks at `ready()` again (None: as long as it likes).
"""

from __future__ import annotations

import socket
import struct


def tune(sock: socket.socket) -> None:
    """Low latency for a data connection (TCP_NODELAY; nothing to do for a Unix socket).

    Buffer sizes are left to the kernel: setting SO_SNDBUF/SO_RCVBUF turns off autotuning and,
    on loopback here, cost up to half of a 64 MiB transfer's throughput (bench/NOTES.md, entry 2)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class SocketLink:
    """A connected TCP socket as a link (TCP_NODELAY, kernel timeouts)."""

    kind = "tcp"
    recheck_s: float | None = None

    def __init__(self, sock: socket.socket):
        tune(sock)
        self.sock = sock
        # The socket's own methods, bound: a link adds no Python frame to a send or a receive.
        self.fileno = sock.fileno
        self.sendall = sock.sendall
        self.sendmsg = sock.sendmsg
        self.send = sock.send
        self.recv_into = sock.recv_into
        self.shutdown = sock.shutdown

    def set_timeouts(self, seconds: float) -> None:
        """Blocking sends and receives that the kernel gives up on after `seconds` (EAGAIN).

        A Python-level timeout (settimeout) makes CPython poll() before every send and receive;
        with the kernel's SO_SNDTIMEO/SO_RCVTIMEO a small exchange takes two system calls, not
        four (bench/NOTES.md, entry 4)."""
        self.sock.settimeout(None)
        sec = int(seconds)
        tv = struct.pack("ll", sec, int((seconds - sec) * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)

    def fits(self, nbytes: int) -> bool:
        return False  # a socket's free buffer space is not known without a system call

    def ready(self) -> bool:
        return False  # whatever has arrived, poll() reports

    def prepare_sleep(self) -> bool:
        return True

    def woken(self) -> None:
        pass

    def close(self) -> None:
        self.sock.close()
