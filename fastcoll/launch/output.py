"""Rank output: every line of every rank, tagged `[rank] `, written whole, never mixed mid-line.

One reader thread per pipe reads complete lines (bytes, so binary junk passes through); one lock
around the writes keeps each line in one piece. A final line without a newline gets one. A line
longer than `MAX_LINE` is written in pieces of that size, each tagged, so that a program writing
megabytes without a newline cannot hold the lock or grow the launcher's memory without bound.
"""

from __future__ import annotations

import os
import threading
from typing import BinaryIO, Callable, IO

MAX_LINE = 1 << 20


class OutputMux:
    """Where rank lines go: the launcher's stdout/stderr, and optionally one log file per rank."""

    def __init__(
        self,
        stdout: BinaryIO,
        stderr: BinaryIO,
        *,
        tag: bool = True,
        log_dir: str | None = None,
    ) -> None:
        self._out = stdout
        self._err = stderr
        self._tag = tag
        self._log_dir = log_dir
        self._logs: dict[int, IO[bytes]] = {}
        self._lock = threading.Lock()
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    def open_log(self, rank: int) -> None:
        """Create (truncate) `rank.N.log` in the log directory, if there is one."""
        if self._log_dir and rank not in self._logs:
            self._logs[rank] = open(os.path.join(self._log_dir, f"rank.{rank}.log"), "wb")

    def line(self, rank: int, data: bytes, *, err: bool = False) -> None:
        """Write one line of `rank` (with or without its newline) as one piece."""
        if not data.endswith(b"\n"):
            data += b"\n"
        dest = self._err if err else self._out
        text = b"[%d] %s" % (rank, data) if self._tag else data
        with self._lock:
            try:
                dest.write(text)
                dest.flush()
            except (OSError, ValueError):
                pass  # our own stdout is gone (closed pipe): keep running the job regardless
            log = self._logs.get(rank)
            if log is not None:
                log.write(data)
                log.flush()

    def message(self, text: str) -> None:
        """A line from the launcher itself, on stderr, never inside a rank's line."""
        with self._lock:
            try:
                self._err.write(f"fastcoll-launch: {text}\n".encode(errors="replace"))
                self._err.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Close the log files."""
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()


def pump(
    pipe: BinaryIO,
    emit: Callable[[bytes], None],
    *,
    on_eof: Callable[[], None] | None = None,
) -> threading.Thread:
    """Start a daemon thread that calls `emit(line)` for every line of `pipe`, then `on_eof`.

    Daemon, so that a grandchild that keeps the pipe open can never keep the launcher alive.
    """

    def run() -> None:
        try:
            while True:
                data = pipe.readline(MAX_LINE)
                if not data:
                    break
                emit(data)
        except (OSError, ValueError):
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass
            if on_eof is not None:
                on_eof()

    thread = threading.Thread(target=run, daemon=True, name="fastcoll-launch-output")
    thread.start()
    return thread
