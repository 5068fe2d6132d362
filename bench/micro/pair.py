"""One loopback TCP connection between two processes, for the socket micro-benchmarks."""

from __future__ import annotations

import socket
import time


def connect_pair(server: bool, port) -> socket.socket:
    """The server side listens on a free port and publishes it in `port` (a multiprocessing
    Value); the client side waits for it and connects."""
    if server:
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        port.value = lst.getsockname()[1]
        s, _ = lst.accept()
        lst.close()
        return s
    while port.value == 0:
        time.sleep(0.01)
    return socket.create_connection(("127.0.0.1", port.value))
