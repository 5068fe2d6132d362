"""The launcher's helper on a remote host. Standard library only, and self-contained.

The launcher does not rely on fastcoll being importable over there: it runs
``PYTHON -u -c BOOTSTRAP`` through ssh and sends this file's source, then one JSON request, on
ssh's standard input. So the job's secrets never appear on a command line that `ps` shows.

Requests (the first JSON line after the source):

- ``{"mode": "run", "argv": [...], "env": {...}, "cwd": ..., "grace": s, "marker": m}``:
  start the rank in its own session, then obey ``signal N`` lines on stdin; on end of input
  (the launcher or the connection is gone) stop the rank: SIGTERM, then SIGKILL after the grace
  period. The rank's stdout and stderr are this process's, i.e. ssh's. Status lines go to
  stderr, after a marker only the launcher knows: ``<m>started <pid>``, then ``<m>exit <code>``
  or ``<m>signal <number>``.
- ``{"mode": "port"}``: print a free TCP port on this host and exit.
- ``{"mode": "check", ...}``: see `check_mode`; the replies are JSON lines on stdout, after
  the marker.

`python -m fastcoll.launch.agent` runs the same program, for hosts where fastcoll is installed.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time

# The ssh command line runs this: read the source length, the source, and run it.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;"
    'exec(compile(b.read(int(b.readline())),"<fastcoll-agent>","exec"))'
)


def main() -> None:
    """Read the request on stdin and serve it."""
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    request = json.loads(line)
    mode = request.get("mode")
    if mode == "run":
        code = run_mode(request)
        # Not sys.exit: the stdin thread may be blocked in a read that holds the buffered
        # reader's lock, which would make interpreter shutdown abort.
        os._exit(code)
    if mode == "port":
        print(_free_port(), flush=True)
        sys.exit(0)
    if mode == "check":
        sys.exit(check_mode(request))
    sys.stderr.write(f"fastcoll agent: unknown mode {mode!r}\n")
    sys.exit(2)


def run_mode(request: dict) -> int:
    """Start the rank, relay signals to its process group, and return its exit status."""
    marker = request["marker"]
    grace = float(request.get("grace", 5.0))
    env = dict(os.environ)
    env.update(request.get("env", {}))
    host = socket.gethostname()

    def status(text: str) -> None:
        try:
            sys.stderr.write(f"{marker}{text}\n")
            sys.stderr.flush()
        except OSError:
            pass  # the launcher is gone; nobody is left to tell

    try:
        os.chdir(request.get("cwd") or os.path.expanduser("~"))
    except OSError as e:
        sys.stderr.write(f"fastcoll-launch: on {host}: cannot enter {request.get('cwd')}: "
                         f"{e.strerror} (pass --cwd)\n")
        status("exit 127")
        return 127
    try:
        child = subprocess.Popen(
            request["argv"], env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as e:
        sys.stderr.write(f"fastcoll-launch: on {host}: cannot run {request['argv'][0]}: "
                         f"{e.strerror}\n")
        status("exit 127")
        return 127
    status(f"started {child.pid}")

    def killpg(sig: int) -> None:
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def listen() -> None:
        # Lines from the launcher; end of input means the launcher or the link is gone.
        for raw in sys.stdin.buffer:
            words = raw.split()
            if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
                killpg(int(words[1]))
        killpg(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        killpg(signal.SIGKILL)

    threading.Thread(target=listen, daemon=True).start()
    # The launcher's signals are for the rank; this helper ends when the rank does.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, lambda s, f: killpg(s))
    code = child.wait()
    killpg(signal.SIGKILL)  # whatever the rank left behind in its group goes with it
    if code < 0:
        status(f"signal {-code}")
        return 128 - code
    status(f"exit {code}")
    return code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def check_mode(request: dict) -> int:
    """Answer `--check`: versions, then reachability of the other hosts' addresses.

    1. Reply ``hello``: Python and fastcoll versions, and the port of a listener on all
       interfaces that greets each connection with this host's id.
    2. Read ``{"connect": [{"addr", "port", "id"}, ...]}``; reply ``results`` after trying each.
    3. End at end of input.
    """
    marker = request["marker"]

    def reply(obj: dict) -> None:
        sys.stdout.write(marker + json.dumps(obj) + "\n")
        sys.stdout.flush()

    # Look for fastcoll where the job's ranks would: in the job's cwd and PYTHONPATH.
    env = request.get("env") or {}
    os.environ.update(env)
    cwd = request.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
        sys.path.insert(0, cwd)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        sys.path.insert(0, entry)
    try:
        import fastcoll

        fc_version = str(getattr(fastcoll, "__version__", "unknown"))
    except Exception as e:  # report any import failure, never crash the check
        fc_version = f"not importable ({type(e).__name__}: {e})"
    try:
        from importlib.metadata import version

        mlx_version = version("mlx")
    except Exception:
        mlx_version = "-"

    bind_errors = {}
    for addr in request.get("addresses", []):
        # A listed address this host cannot bind is not one of its own.
        try:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            with socket.socket(family) as s:
                s.bind((addr, 0))
        except OSError as e:
            bind_errors[addr] = e.strerror or str(e)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", 0))
    listener.listen(64)
    greeting = (request["id"] + "\n").encode()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(greeting)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    reply({
        "hello": {
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "executable": sys.executable,
            "fastcoll": fc_version,
            "mlx": mlx_version,
            "port": listener.getsockname()[1],
            "bind_errors": bind_errors,
        }
    })
    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        if "connect" in msg:
            reply({"results": _try_connect(msg["connect"], float(msg.get("timeout", 5.0)))})
    listener.close()
    return 0


def _try_connect(targets: list, timeout: float) -> list:
    results: list = [None] * len(targets)

    def one(i: int, t: dict) -> None:
        try:
            with socket.create_connection((t["addr"], t["port"]), timeout=timeout) as s:
                s.settimeout(timeout)
                data = b""
                while not data.endswith(b"\n") and len(data) < 200:
                    chunk = s.recv(200)
                    if not chunk:
                        break
                    data += chunk
            got = data.decode(errors="replace").strip()
            if got == t["id"]:
                results[i] = {"ok": True}
            else:
                results[i] = {"ok": False, "error": "answered by another host or program"}
        except OSError as e:
            results[i] = {"ok": False, "error": e.strerror or str(e) or type(e).__name__}

    threads = [threading.Thread(target=one, args=(i, t)) for i, t in enumerate(targets)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


if __name__ == "__main__":
    main()
