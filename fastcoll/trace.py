"""FASTCOLL_TRACE=path.json: a Chrome/Perfetto trace of every collective's phases, per rank.

Each rank writes `path` with `.rankN` before the extension (trace.json -> trace.rank0.json);
`python -m fastcoll.trace merged.json trace.rank*.json` joins them into one file in which every
rank is a process. Open it at ui.perfetto.dev or chrome://tracing. Phases: `queue` (submitted
to started), the collective itself, `send`, `wait` (for a peer's header), `receive` (payload
bytes), `reduce`, and `flush` (waiting for the sends to leave). The calls MLX's graph makes in
graph mode, which no Python sees, the engine notes itself; they are collected when the file is
written (`add_collector`) and shown on a row of their own.

`init()` checks the path at once (`check_path`: its directory must exist and be writable), and so
does `fastcoll-launch` for the ranks it starts, so a bad path fails before any collective runs.
The merge tool never writes over an input: it refuses an output that is one of its inputs or is
named like a rank's file (`*.rankN.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

PROG = "python -m fastcoll.trace"
# The phases within a collective, by the names both engines write (the native engine's
# _native.PHASES, in its codes' order, must be these).
PHASES = ("send", "wait", "receive", "reduce", "flush")
# The names rank_path() gives: trace.rank0.json, trace.rank12 (no extension).
RANK_FILE = re.compile(r"\.rank\d+(\.[^./]*)?$")


def rank_path(path: str, rank: int) -> str:
    """trace.json -> trace.rank0.json."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def check_path(path: str, rank: int = 0, cwd: str | None = None) -> str:
    """The file rank `rank` writes for FASTCOLL_TRACE=`path` (relative to `cwd`, default the
    current directory); a one-line ValueError naming FASTCOLL_TRACE unless its directory exists
    and is writable and the file is not a directory."""
    target = os.path.abspath(os.path.join(cwd or os.getcwd(), rank_path(path, rank)))
    folder = os.path.dirname(target)
    rule = "FASTCOLL_TRACE must be path.json in an existing directory this rank may write to"
    if not os.path.isdir(folder):
        raise ValueError(f"{rule}; the directory {folder} does not exist (FASTCOLL_TRACE={path!r})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{rule}; the directory {folder} is not writable (FASTCOLL_TRACE={path!r})")
    if os.path.isdir(target):
        raise ValueError(f"{rule}; {target} is a directory (FASTCOLL_TRACE={path!r})")
    return target


class Tracer:
    """Collects complete ('X') events in memory; `write()` saves them as Chrome trace JSON, with
    the events each collector gives then (`add_collector`)."""

    def __init__(self, path: str, rank: int):
        self.path = rank_path(path, rank)
        self.rank = rank
        self.events: list[dict] = []
        self._threads: dict[int, str] = {}
        self._lanes: dict[str, int] = {}
        self._collectors: list[Callable[[], list[dict]]] = []
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
        ev = self.event(name, tid, start_ns, end_ns, **args)
        with self._lock:
            if tid not in self._threads:
                self._threads[tid] = threading.current_thread().name
            self.events.append(ev)

    def event(self, name: str, tid: int, start_ns: int, end_ns: int | None = None, **args) -> dict:
        """A complete ('X') event of thread or lane `tid` from start_ns to end_ns (now()'s clock),
        or an instant ('i') one at start_ns where end_ns is None; not recorded (a collector's)."""
        ev = {"name": name, "ph": "X" if end_ns is not None else "i", "pid": self.rank, "tid": tid,
              "ts": (start_ns + self._offset_ns) / 1000}
        if end_ns is not None:
            ev["dur"] = (end_ns - start_ns) / 1000
        else:
            ev["s"] = "t"  # an instant of its row
        if args:
            ev["args"] = args
        return ev

    def lane(self, name: str) -> int:
        """The tid of a row named `name` for events no Python thread records (MLX's graph)."""
        with self._lock:
            if name not in self._lanes:
                self._lanes[name] = len(self._lanes) + 1  # (a Python thread's ident is never this small)
                self._threads[self._lanes[name]] = name
            return self._lanes[name]

    def add_collector(self, collect: Callable[[], list[dict]]) -> None:
        """Call collect() as the file is written: its events (made with `event`) go in too."""
        with self._lock:
            self._collectors.append(collect)

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
        collected = [ev for collect in list(self._collectors) for ev in collect()]
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}}
            for tid, name in self._threads.items()
        ]
        with self._lock:
            events = meta + list(self.events) + collected
        with open(self.path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
        return self.path


def merge(out: str, paths: Sequence[str]) -> int:
    """Join per-rank trace files into `out`; returns the number of events. A ValueError, before
    anything is written, if `out` is one of `paths` or named like a rank's file (`output_problem`)."""
    problem = output_problem(out, paths)
    if problem:
        raise ValueError(problem)
    events: list[dict] = []
    for p in paths:
        events.extend(_events(p))
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    return len(events)


def output_problem(out: str, paths: Sequence[str]) -> str | None:
    """Why `out` may not be the merged file (it would overwrite an input, or looks like one), or
    None."""
    real = os.path.realpath(out)
    if any(os.path.realpath(p) == real for p in paths):
        return f"the output {out} is also an input; name the merged file first: {PROG} merged.json {out} ..."
    if RANK_FILE.search(os.path.basename(out)):
        return (f"the output {out} is named like a rank's trace (NAME.rankN.json), an input; "
                f"name the merged file first: {PROG} merged.json NAME.rank*.json")
    return None


def _events(path: str) -> list[dict]:
    """The events of one rank's trace file; a one-line ValueError if it is not one."""
    try:
        with open(path) as f:
            data = json.load(f)
        return list(data["traceEvents"])
    except FileNotFoundError:
        raise ValueError(f"no such trace file: {path}") from None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a trace (JSON with traceEvents, as FASTCOLL_TRACE writes)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fastcoll.trace MERGED.json RANK_TRACE.json...`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Join the per-rank traces that FASTCOLL_TRACE=path.json writes "
        "(path.rank0.json, path.rank1.json, ...) into one Chrome/Perfetto trace, every rank a "
        "process. The output comes first and is never one of the inputs.",
        epilog=f"example: {PROG} merged.json trace.rank*.json",
    )
    parser.add_argument("output", metavar="MERGED.json", help="the file to write")
    parser.add_argument("inputs", metavar="RANK_TRACE.json", nargs="+", help="the ranks' traces")
    args = parser.parse_args(argv)
    missing = [p for p in args.inputs if not os.path.isfile(p)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        parser.exit(2, f"{PROG}: no such trace file: {missing[0]}{more}\n")
    try:
        n = merge(args.output, args.inputs)
    except ValueError as e:
        parser.exit(2, f"{PROG}: {e}\n")
    except OSError as e:
        parser.exit(1, f"{PROG}: cannot write {args.output}: {e.strerror}\n")
    sys.stdout.write(f"wrote {n} events from {len(args.inputs)} file(s) to {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
