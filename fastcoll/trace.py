"""FASTCOLL_TRACE=path.json: a Chrome/Perfetto trace of every collective's phases, per rank.

Each rank writes `path` with `.rankN` before the extension (trace.json -> trace.rank0.json);
`python -m fastcoll.trace merged.json trace.rank*.json` joins them into one file in which every
rank is a process. Open it at ui.perfetto.dev or chrome://tracing. Phases: `queue` (submitted
to started), the collective itself, `send`, `wait` (for a peer's header), `receive` (payload
bytes), `reduce`, and `flush` (waiting for the sends to leave).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator


def rank_path(path: str, rank: int) -> str:
    """trace.json -> trace.rank0.json."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


class Tracer:
    """Collects complete ('X') events in memory; `write()` saves them as Chrome trace JSON."""

    def __init__(self, path: str, rank: int):
        self.path = rank_path(path, rank)
        self.rank = rank
        self.events: list[dict] = []
        self._threads: dict[int, str] = {}
        self._lock = threading.Lock()
        # Wall-clock microseconds, so that the ranks of one host line up in a merged trace.
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def now(self) -> int:
        """A timestamp for span()."""
        return time.perf_counter_ns()

    def span(self, name: str, start_ns: int, end_ns: int | None = None, **args) -> None:
        """Record an event that began at start_ns (from now()) and ends now or at end_ns."""
        end_ns = time.perf_counter_ns() if end_ns is None else end_ns
        tid = threading.get_ident()
        ev = {
            "name": name,
            "ph": "X",
            "pid": self.rank,
            "tid": tid,
            "ts": (start_ns + self._offset_ns) / 1000,
            "dur": (end_ns - start_ns) / 1000,
        }
        if args:
            ev["args"] = args
        with self._lock:
            if tid not in self._threads:
                self._threads[tid] = threading.current_thread().name
            self.events.append(ev)

    @contextmanager
    def phase(self, name: str, **args) -> Iterator[None]:
        """Record the enclosed block as an event."""
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.span(name, t0, **args)

    def write(self) -> str:
        """Write the trace file and return its path."""
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}}
            for tid, name in self._threads.items()
        ]
        with self._lock:
            events = meta + list(self.events)
        with open(self.path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
        return self.path


def merge(out: str, paths: list[str]) -> int:
    """Join per-rank trace files into one; returns the number of events."""
    events: list[dict] = []
    for p in paths:
        with open(p) as f:
            events.extend(json.load(f)["traceEvents"])
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    return len(events)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m fastcoll.trace MERGED.json RANK_TRACE.json...")
    n = merge(sys.argv[1], sys.argv[2:])
    print(f"wrote {n} events to {sys.argv[1]}")
