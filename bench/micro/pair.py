"""One loopback TCP connection between two processes, for the socket micro-benchmarks."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from typing import Any, Callable


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


def run_pair(side: Callable[..., None], *args: Any) -> Any:
    """Run side(server, port, *args, out) in a server and a client process; return what the
    server side put in `out` (a multiprocessing Queue)."""
    port, out = mp.Value("i", 0), mp.Queue()
    ps = [mp.Process(target=side, args=(srv, port, *args, out)) for srv in (True, False)]
    for p in ps:
        p.start()
    result = out.get()
    for p in ps:
        p.join()
    return result
