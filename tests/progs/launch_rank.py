"""A rank for the launcher's tests: `launch_rank.py MARKER ACTION [ARGS...]`.

MARKER only makes this process (and the children it starts) findable in the process table.
Actions:
  env [ARGS...]        print one JSON line: the FASTCOLL_* variables, argv, cwd, executable
  sleep                print "ready", start a marked grandchild, sleep 60 s
  ignore-term          like sleep, but ignore SIGTERM (so only SIGKILL ends it)
  exit-if RANK CODE    rank RANK exits with CODE after 0.3 s; the others `sleep`
  kill-if RANK SIG     rank RANK kills itself with SIG after 0.3 s; the others `sleep`
  exit-or-ignore RANK CODE   rank RANK exits with CODE after 1 s; the others `ignore-term`
  spam LINES           write LINES long lines to stdout and stderr, each in two pieces
  junk                 write binary junk, then a last line with no newline
  tokencheck           print whether the token appears on any process's command line
  first-fails RANK CODE LATER DELAY LOCK   rank RANK exits with CODE; every other rank waits
                       for that exit (RANK's flock on LOCK is released), then exits with LATER
                       DELAY seconds after it, saying so: a rank that fails because a peer died
  fail-first RANK CODE print the FASTCOLL_* variables as JSON; then, on the first attempt
                       (FASTCOLL_RESTART_COUNT=0), rank RANK exits with CODE and the others `sleep`
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time


def _grandchild(marker: str) -> None:
    # A child in the rank's process group: the launcher must stop it too.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])


def _sleep(marker: str) -> None:
    _grandchild(marker)
    print("ready", flush=True)
    time.sleep(60)


def _token_on_command_lines(token: bytes) -> bool:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token in f.read():
                    return True
        except OSError:
            pass
    return False


def _first_fails(rank: int, first: int, code: int, later: int, delay: float, lock: str) -> None:
    import fcntl

    if rank == first:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.close(os.open(lock + ".held", os.O_WRONLY | os.O_CREAT))
        time.sleep(0.2)  # the others are waiting on the lock by now
        os._exit(code)  # the kernel releases the lock as the process ends
    deadline = time.monotonic() + 20
    while not os.path.exists(lock + ".held"):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: rank {first} never took {lock}")
        time.sleep(0.005)
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # returns once rank `first` has exited
    time.sleep(delay)
    print(f"rank {rank}: ends with {later}, {delay:g} s after rank {first}", flush=True)
    os._exit(later)


def main() -> None:
    marker, action, *args = sys.argv[1:]
    rank = int(os.environ.get("FASTCOLL_RANK", "0"))
    if action == "env":
        info = {k: v for k, v in os.environ.items() if k.startswith("FASTCOLL_")}
        info.update(
            argv=args,
            cwd=os.getcwd(),
            executable=sys.executable,
            extra=os.environ.get("EXTRA"),
            passed=os.environ.get("PASSED"),
            unbuffered=os.environ.get("PYTHONUNBUFFERED"),
        )
        if hasattr(os, "sched_getaffinity"):  # where the rank, and a thread it starts, may run
            seen: dict = {}
            t = threading.Thread(target=lambda: seen.update(cpus=sorted(os.sched_getaffinity(0))))
            t.start()
            t.join()
            info.update(cpus=sorted(os.sched_getaffinity(0)), thread_cpus=seen["cpus"])
        print(json.dumps(info), flush=True)
    elif action == "sleep":
        _sleep(marker)
    elif action == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _sleep(marker)
    elif action == "exit-or-ignore":
        if rank == int(args[0]):
            time.sleep(1.0)
            sys.exit(int(args[1]))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _sleep(marker)
    elif action in ("exit-if", "kill-if"):
        if rank == int(args[0]):
            time.sleep(0.3)
            if action == "exit-if":
                sys.exit(int(args[1]))
            os.kill(os.getpid(), int(args[1]))
        _sleep(marker)
    elif action == "spam":
        body = f"{rank}:" + "x" * 3000
        for i in range(int(args[0])):
            for stream in (sys.stdout, sys.stderr):
                line = f"{body}:{i}\n"
                stream.write(line[:1500])
                stream.flush()
                stream.write(line[1500:])
                stream.flush()
    elif action == "junk":
        out = sys.stdout.buffer
        out.write(b"junk:\xff\xfe\x00\x80 end\n")
        out.write(b"tail-without-newline-%d" % rank)
        out.flush()
    elif action == "fail-first":
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("FASTCOLL_")}), flush=True)
        if os.environ.get("FASTCOLL_RESTART_COUNT") == "0":
            if rank == int(args[0]):
                time.sleep(0.3)
                sys.exit(int(args[1]))
            _sleep(marker)
    elif action == "first-fails":
        _first_fails(rank, int(args[0]), int(args[1]), int(args[2]), float(args[3]), args[4])
    elif action == "tokencheck":
        token = os.environ["FASTCOLL_TOKEN"].encode()
        print("token-on-command-line:", _token_on_command_lines(token), flush=True)
    else:
        sys.exit(f"unknown action {action!r}")


if __name__ == "__main__":
    main()
