"""Shared helpers for the launcher's tests: run the launcher, scan the process table, clean up.

Standard library only; the process table is read from /proc (no psutil).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
RANK_PROG = str(REPO / "tests" / "progs" / "launch_rank.py")


def json_lines(out: bytes) -> dict[int, dict]:
    """Each rank's JSON object from a job's `[rank] {...}` lines; every line must be one."""
    ranks = {}
    for line in out.decode().splitlines():
        m = re.fullmatch(r"\[(\d+)\] (\{.*\})", line)
        assert m, f"untagged or torn line: {line!r}"
        ranks[int(m.group(1))] = json.loads(m.group(2))
    return ranks


def launcher_env() -> dict[str, str]:
    """The test's environment, with the repository importable (the package is not installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


def launcher_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fastcoll.launch", *args]


def processes_with(needle: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line contains `needle`."""
    found = []
    me = os.getpid()
    data = needle.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()  # empty for zombies, which are already dead
        except OSError:
            continue
        if data in cmdline:
            found.append((int(name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def survivors(needle: str, wait: float = 2.0) -> list[tuple[int, str]]:
    """Processes still carrying `needle` after up to `wait` seconds (SIGKILL is asynchronous)."""
    deadline = time.monotonic() + wait
    while True:
        found = processes_with(needle)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def kill_all_with(needle: str) -> None:
    for pid, _ in processes_with(needle):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Launches:
    """Starts launchers for one test and, whatever happens, kills everything they started."""

    def __init__(self) -> None:
        self.marker = "fctest-" + secrets.token_hex(6)
        self._procs: list[subprocess.Popen] = []

    def start(self, args: Sequence[str], cwd: str | Path = REPO, argv: Sequence[str] | None = None) -> subprocess.Popen:
        """Start `fastcoll-launch ARGS` (or `argv` itself) with pipes for its output."""
        proc = subprocess.Popen(
            list(argv) if argv is not None else launcher_argv(*args),
            cwd=str(cwd),
            env=launcher_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def run(
        self, args: Sequence[str], timeout: float = 30.0, cwd: str | Path = REPO, argv: Sequence[str] | None = None
    ) -> tuple[int, bytes, bytes, float]:
        """Run the launcher (or `argv`) to its end: (exit code, stdout, stderr, seconds)."""
        began = time.monotonic()
        proc = self.start(args, cwd, argv)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - began

    def rank_args(self, action: str, *extra: str) -> list[str]:
        """`python launch_rank.py MARKER ACTION EXTRA...`: a rank program carrying the marker."""
        return ["python", RANK_PROG, self.marker, action, *extra]

    def cleanup(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                proc.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        kill_all_with(self.marker)


@pytest.fixture
def launches() -> Iterator[Launches]:
    """A `Launches` whose processes are all gone after the test, passed or failed."""
    lx = Launches()
    try:
        yield lx
    finally:
        lx.cleanup()


def wait_for_lines(
    proc: subprocess.Popen, needle: bytes, count: int, timeout: float
) -> list[bytes]:
    """Read the launcher's stdout until `count` lines contain `needle`; returns lines read."""
    import selectors

    assert proc.stdout is not None
    lines: list[bytes] = []
    seen = 0
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    fd = proc.stdout.fileno()
    while seen < count:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            raise AssertionError(f"only {seen}/{count} lines with {needle!r}: {lines!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"launcher output ended early: {lines!r}")
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += done
        seen += sum(needle in line for line in done)
    sel.close()
    return lines
