"""The launcher's helper on a remote host. Standard library only, and self-contained.

The launcher does not rely on fastcoll being importable over there: it runs
``PYTHON -u -c BOOTSTRAP`` through ssh and sends this file's source, then one JSON request, on
ssh's standard input. So the job's secrets never appear on a command line that `ps` shows.

Requests (the first JSON line after the source):

- ``{"mode": "run", "argv": [...], "env": {...}, "cwd": ..., "grace": s, "marker": m,
  "heartbeat": s, "cpu_share": [i, n] or null}``: start the rank in its own session (with
  `cpu_share`, on share i of n of this host's cores: `cpu_share()`), then obey ``signal N``
  lines on stdin (lines of at most `MAX_REQUEST` bytes; anything else is ignored); on end of
  input (the launcher or the connection is gone) stop the rank: SIGTERM, then SIGKILL after the
  grace period. The rank's stdout and stderr go through pipes to this process, which passes them on
  to its own (ssh's) line by line, whole. Status lines go to stderr between the rank's lines,
  after a marker only the launcher knows: ``<m>started <pid>``, then ``<m>beat`` every
  `heartbeat` seconds while the rank runs (the launcher takes a host whose beats stop for
  a few seconds as lost), then ``<m>exit <code>`` or ``<m>signal <number>``.
- ``{"mode": "port"}``: print a free TCP port on this host and exit.
- ``{"mode": "check", ...}``: see `check_mode`; the replies are JSON lines on stdout, after
  the marker.

`python -m fastcoll.launch.agent` runs the same program, for hosts where fastcoll is installed.
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

MAX_REQUEST = 4096  # the longest line the launcher sends after the request (`signal N`)
MAX_LINE = 1 << 20  # a rank's line longer than this is passed on in pieces of this size

# The ssh command line runs this: read the source length, the source, and run it.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;"
    'exec(compile(b.read(int(b.readline())),"<fastcoll-agent>","exec"))'
)


def main() -> None:
    """Read the request on stdin and serve it."""
    line = sys.stdin.buffer.readline(1 << 24)  # the request: argv and environment, bounded
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
        print(free_port(), flush=True)
        sys.exit(0)
    if mode == "check":
        sys.exit(check_mode(request))
    sys.stderr.write(f"fastcoll agent: unknown mode {mode!r}\n")
    sys.exit(2)


def run_mode(request: dict) -> int:
    """Start the rank, relay its output and signals, beat, and return its exit status."""
    status = Status(request["marker"])
    env = dict(os.environ)
    env.update(request.get("env", {}))
    try:
        child = start_rank(request, env)
    except NotStarted as e:
        sys.stderr.write(f"fastcoll-launch: on {socket.gethostname()}: {e}\n")
        status(f"exit {e.code}")
        return e.code
    status(f"started {child.pid}")
    relays = [relay(child.stdout, sys.stdout.buffer, threading.Lock()),
              relay(child.stderr, sys.stderr.buffer, status.lock)]
    threading.Thread(target=listen, args=(child, float(request.get("grace", 5.0))), daemon=True).start()
    ended = threading.Event()
    heartbeat = float(request.get("heartbeat", 0) or 0)
    if heartbeat > 0:
        threading.Thread(target=beat, args=(status, heartbeat, ended), daemon=True).start()
    # The launcher's signals are for the rank; this helper ends when the rank does.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, lambda s, f: killpg(child, s))
    code = child.wait()
    killpg(child, signal.SIGKILL)  # whatever the rank left behind in its group goes with it
    deadline = time.monotonic() + 2.0  # its last lines (a traceback, often) before the status
    for t in relays:
        t.join(max(0.0, deadline - time.monotonic()))
    ended.set()
    if code < 0:
        status(f"signal {-code}")
        return 128 - code
    status(f"exit {code}")
    return code


class Status:
    """Status lines to the launcher on stderr, after the marker, between the rank's lines."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.lock = threading.Lock()  # held while a whole line goes out, the rank's or a status

    def __call__(self, text: str) -> None:
        with self.lock:
            try:
                sys.stderr.write(f"{self.marker}{text}\n")
                sys.stderr.flush()
            except OSError:
                pass  # the launcher is gone; nobody is left to tell


class NotStarted(Exception):
    """The rank could not be started here; the message says why, `code` is its exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def start_rank(request: dict, env: dict) -> subprocess.Popen:
    """The rank's process, in its own session, in the request's directory and on its CPUs."""
    try:
        os.chdir(request.get("cwd") or os.path.expanduser("~"))
    except OSError as e:
        raise NotStarted(f"cannot enter {request.get('cwd')}: {e.strerror} (pass --cwd)", 127) from None
    problem = trace_problem(env.get("FASTCOLL_TRACE", ""), env.get("FASTCOLL_RANK", "0"))
    if problem:
        raise NotStarted(problem, 2)
    share = request.get("cpu_share")
    try:
        cpus = cpu_share(int(share[0]), int(share[1])) if share else None
    except BindError as e:
        raise NotStarted(str(e), 2) from None
    try:
        with on_cpus(cpus):
            return subprocess.Popen(request["argv"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise NotStarted(f"cannot run {request['argv'][0]}: {e.strerror}", 127) from None


def relay(src, dest, lock: threading.Lock) -> threading.Thread:
    """A started thread passing `src`'s lines on to `dest`, whole lines only, so that a status
    line never lands inside one of the rank's."""

    def run() -> None:
        try:
            while True:
                data = src.readline(MAX_LINE)
                if not data:
                    break
                with lock:
                    try:
                        dest.write(data)
                        dest.flush()
                    except OSError:
                        pass  # ssh is gone; keep draining so the rank never blocks
        except (OSError, ValueError):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def killpg(child: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the rank's process group, if it is still there."""
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def listen(child: subprocess.Popen, grace: float) -> None:
    """Obey the launcher's `signal N` lines; at end of input (the launcher or the link is gone)
    stop the rank: SIGTERM, then SIGKILL after `grace` seconds."""
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline(MAX_REQUEST)
        if not raw:
            break
        words = raw.split()
        if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
            killpg(child, int(words[1]))
    killpg(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killpg(child, signal.SIGKILL)


def beat(status: Status, heartbeat: float, ended: threading.Event) -> None:
    """`beat` every `heartbeat` seconds until the rank has ended."""
    while not ended.wait(heartbeat):
        status("beat")


def trace_problem(path: str, rank: str) -> str | None:
    """Why rank `rank` could not write its trace of FASTCOLL_TRACE=`path` here (relative to the
    current directory), or None: fastcoll.trace.check_path's rule, which this file cannot
    import (fastcoll need not be installed where it runs; a test keeps the two alike)."""
    if not path:
        return None
    root, ext = os.path.splitext(path)
    target = os.path.abspath(f"{root}.rank{rank}{ext or '.json'}")
    folder = os.path.dirname(target)
    rule = "FASTCOLL_TRACE must be path.json in an existing directory this rank may write to"
    if not os.path.isdir(folder):
        return f"{rule}; the directory {folder} does not exist (FASTCOLL_TRACE={path!r})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{rule}; the directory {folder} is not writable (FASTCOLL_TRACE={path!r})"
    if os.path.isdir(target):
        return f"{rule}; {target} is a directory (FASTCOLL_TRACE={path!r})"
    return None


class BindError(RuntimeError):
    """The ranks cannot be bound to cores here (the error says why)."""


def cpu_share(index: int, count: int) -> list[int]:
    """The CPUs of share `index` of `count` of this host's cores (`--bind-to cores`).

    Whole physical cores (a core's hyperthreads stay together), in consecutive blocks, so that a
    rank's cores share caches and memory; a count that does not divide gives the first shares one
    core more. Raises BindError where the system cannot bind (macOS) or has fewer cores than
    `count`.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise BindError(f"--bind-to cores needs Linux (sched_setaffinity); {platform.system()} "
                        "cannot bind a process to cores: use --bind-to none")
    blocks = core_blocks()
    if len(blocks) < count:
        raise BindError(f"--bind-to cores: {socket.gethostname()} has {len(blocks)} core(s) "
                        f"this process may use for {count} rank(s); give fewer ranks to this "
                        "host or use --bind-to none")
    per, extra = divmod(len(blocks), count)
    start = index * per + min(index, extra)
    return sorted(cpu for block in blocks[start:start + per + (index < extra)] for cpu in block)


def core_blocks() -> list[list[int]]:
    """The CPUs this process may use, grouped by physical core, in order of each core's first CPU."""
    cores: dict[tuple[str, str], list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        top = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(top + "physical_package_id") as f, open(top + "core_id") as g:
                key = (f.read().strip(), g.read().strip())
        except OSError:  # no topology (a container may hide it): each CPU a core
            key = ("", str(cpu))
        cores.setdefault(key, []).append(cpu)
    return list(cores.values())


@contextmanager
def on_cpus(cpus: list[int] | None) -> Iterator[None]:
    """Processes started inside run on `cpus` (None: where this one runs). Linux gives a new
    process the CPU mask of the thread that started it, so this thread's mask is set for the
    while; no code runs in the child before exec, and the rank's threads inherit the mask."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


LOWEST_PORT = 10000  # below are the well-known and registered services' usual ports


def free_port(host: str = "") -> int:
    """A TCP port free on `host` now, for rank 0 to listen on later: below the kernel's ephemeral
    range where there is room.

    A port the kernel hands out (bind to port 0) may become the local port of some outgoing
    connection, or of another rank's listener, before rank 0 binds it ('Address already in use',
    seen in CI); the kernel never hands out a port below the range."""
    low = _ephemeral_low()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        port = random.randrange(LOWEST_PORT, low) if low > LOWEST_PORT + 100 else 0
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                if port == 0:
                    raise
                continue
            return s.getsockname()[1]
    raise OSError(f"no free TCP port on {host or 'any address'} between {LOWEST_PORT} and {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's setting; elsewhere IANA's 49152,
    macOS's default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def check_mode(request: dict) -> int:
    """Answer `--check`: versions, then reachability of the other hosts' addresses.

    1. Reply ``hello``: Python and fastcoll versions, and the port of a listener on all
       interfaces that greets each connection with this host's id, then serves what the
       connection asks (`_serve_probe`: echoes for a round trip, or bytes to count).
    2. Read ``{"connect": [{"addr", "port", "id"}, ...]}``; reply ``results`` after trying each
       (all at once).
    3. Read ``{"measure": [targets], "pings": n, "bytes": n}``; reply ``measured`` after
       measuring each target in turn: the median round trip of `pings` small exchanges and the
       throughput of `bytes` sent one way.
    4. Read ``{"rdma": [targets]}`` (a target as above, with "device", this host's device toward
       it, and "peer_device", its device toward this host); reply ``rdma_results`` after opening
       a verbs link to each in turn (`_rdma_link`) and measuring it, as `measured`'s entries.
       The hello carries ``rdma``: what `fastcoll.launch.rdmalink.probe` says of the devices the
       request's "rdma_devices" lists, where it lists any.
    5. End at end of input. Request lines are at most `MAX_REQUEST * 16` bytes; JSON only.
    """
    marker = request["marker"]

    def reply(obj: dict) -> None:
        sys.stdout.write(marker + json.dumps(obj) + "\n")
        sys.stdout.flush()

    fc_version, mlx_version = _versions(request.get("env") or {}, request.get("cwd"))
    listener = _probe_listener((request["id"] + "\n").encode())
    reply({
        "hello": {
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "executable": sys.executable,
            "fastcoll": fc_version,
            "mlx": mlx_version,
            "port": listener.getsockname()[1],
            "bind_errors": bind_errors(request.get("addresses", [])),
            "rdma": _rdma_probe(request.get("rdma_devices")),
        }
    })
    while True:
        raw = sys.stdin.buffer.readline(MAX_REQUEST * 16)
        if not raw:
            break
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if "connect" in msg:
            reply({"results": _try_connect(msg["connect"], float(msg.get("timeout", 5.0)))})
        elif "measure" in msg:
            pings = max(1, min(int(msg.get("pings", 20)), MAX_PINGS))
            nbytes = max(1, min(int(msg.get("bytes", 4 << 20)), MAX_PROBE_BYTES))
            timeout = float(msg.get("timeout", 5.0))
            reply({"measured": [_measure(t, pings, nbytes, timeout) for t in msg["measure"]]})
        elif "rdma" in msg:
            timeout = min(float(msg.get("timeout", RDMA_TIMEOUT)), MAX_RDMA_TIMEOUT)
            reply({"rdma_results": [_rdma_link(t, timeout) for t in msg["rdma"]]})
    listener.close()
    return 0


def _versions(env: dict, cwd: str | None) -> tuple[str, str]:
    """fastcoll's and MLX's versions, looked for where the job's ranks would look (the job's cwd
    and PYTHONPATH); a reason instead of fastcoll's where it does not import."""
    os.environ.update(env)
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
    return fc_version, mlx_version


def _rdmalink():
    """fastcoll's RDMA check (fastcoll/launch/rdmalink.py), imported only where RDMA is asked for:
    this file runs without fastcoll, and a host without it gets the reason, not a crash."""
    from fastcoll.launch import rdmalink

    return rdmalink


def _rdma_probe(devices: object) -> dict | None:
    """The hello's `rdma`: whether this host's verbs library lists `devices` (None: none asked)."""
    if not devices or not isinstance(devices, list):
        return None
    try:
        return _rdmalink().probe([str(d) for d in devices])
    except Exception as e:  # report any failure (fastcoll missing, a library that crashes politely)
        return {"error": f"{type(e).__name__}: {e}"}


def bind_errors(addresses: list) -> dict:
    """Each listed address this host cannot bind (so not one of its own), with the reason: what
    `--check` reports for every host, and the launcher refuses for a host of this machine."""
    errors = {}
    for addr in addresses:
        try:
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            with socket.socket(family) as s:
                s.bind((addr, 0))
        except OSError as e:
            errors[addr] = e.strerror or str(e)
    return errors


def _probe_listener(greeting: bytes) -> socket.socket:
    """A listener on every interface whose connections `_serve_probe` serves, each on a thread."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", 0))
    listener.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_serve_probe, args=(conn, greeting), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener


# The probe a --check connection may ask for after the greeting: b"E" + u32 n (n echoes of
# PING_BYTES), or b"T" + u64 n (n bytes to swallow, then one byte back). Both bounded.
PING_BYTES = 64
MAX_PINGS = 1000
MAX_PROBE_BYTES = 64 << 20
PROBE_TIMEOUT = 10.0


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def _serve_probe(conn: socket.socket, greeting: bytes) -> None:
    """One connection to the check listener: greet it, then serve one probe if it asks."""
    with conn:
        try:
            conn.settimeout(PROBE_TIMEOUT)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(greeting)
            kind = conn.recv(1)
            if kind == b"E":
                n = min(int.from_bytes(_recv_exact(conn, 4), "little"), MAX_PINGS)
                for _ in range(n):
                    conn.sendall(_recv_exact(conn, PING_BYTES))
            elif kind == b"R":
                _serve_rdma(conn)
            elif kind == b"T":
                left = min(int.from_bytes(_recv_exact(conn, 8), "little"), MAX_PROBE_BYTES)
                while left > 0:
                    chunk = conn.recv(min(left, 1 << 20))
                    if not chunk:
                        return
                    left -= len(chunk)
                conn.sendall(b"K")
        except (OSError, ValueError):
            pass


# An RDMA probe (b"R"): one JSON line of at most MAX_REQUEST bytes, {"device", "timeout"}: the
# serving host's device toward the asking one. The answer is one JSON line, {"ok": true} once this
# host can open that device, or {"error": why}; then both ends open a verbs link over this
# connection (rdmalink.run_link: the serving end is rank 0) and measure it.
RDMA_TIMEOUT = 10.0
MAX_RDMA_TIMEOUT = 120.0


def _read_line(conn: socket.socket, limit: int) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        if len(data) >= limit:
            raise ValueError(f"a line longer than {limit} bytes")
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def _serve_rdma(conn: socket.socket) -> None:
    """The serving end of an RDMA probe (see RDMA_TIMEOUT's comment)."""
    ask = json.loads(_read_line(conn, MAX_REQUEST))
    device = str(ask.get("device", ""))
    timeout = min(float(ask.get("timeout", RDMA_TIMEOUT)), MAX_RDMA_TIMEOUT)
    try:
        link = _rdmalink()
        said = link.probe([device])
    except Exception as e:
        said = {"error": f"{type(e).__name__}: {e}"}
    conn.sendall((json.dumps({"ok": True} if "error" not in said else said) + "\n").encode())
    if "error" not in said:
        conn.settimeout(None)
        link.run_link(conn.dup(), 0, device, timeout)


def _rdma_link(t: dict, timeout: float) -> dict:
    """The asking end of an RDMA probe to target `t`: the verbs link's measurement, or why not."""
    try:
        s = _open_probe(t, min(timeout, RDMA_TIMEOUT))
        with s:
            s.sendall(b"R" + (json.dumps({"device": t["peer_device"], "timeout": timeout}) + "\n").encode())
            said = json.loads(_read_line(s, MAX_REQUEST))
            if "error" in said:
                return {"ok": False, "error": f"on {t['host']}: {said['error']}"}
            s.settimeout(None)
            return _rdmalink().run_link(s.dup(), 1, str(t["device"]), timeout)
    except Exception as e:  # the check reports it, never crashes
        return {"ok": False, "error": getattr(e, "strerror", None) or str(e) or type(e).__name__}


def _open_probe(t: dict, timeout: float) -> socket.socket:
    """A connection to target `t`'s check listener whose greeting is the right host's id."""
    s = socket.create_connection((t["addr"], t["port"]), timeout=timeout)
    try:
        s.settimeout(timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while not data.endswith(b"\n") and len(data) < 200:
            chunk = s.recv(200)
            if not chunk:
                break
            data += chunk
        if data.decode(errors="replace").strip() != t["id"]:
            raise ConnectionError("answered by another host or program")
        return s
    except BaseException:
        s.close()
        raise


def _measure(t: dict, pings: int, nbytes: int, timeout: float) -> dict:
    """Round trip (median of `pings` exchanges of PING_BYTES) and one-way throughput to `t`."""
    try:
        with _open_probe(t, timeout) as s:
            s.sendall(b"E" + pings.to_bytes(4, "little"))
            payload = b"\x5a" * PING_BYTES
            rtts = []
            for _ in range(pings):
                t0 = time.perf_counter()
                s.sendall(payload)
                _recv_exact(s, PING_BYTES)
                rtts.append(time.perf_counter() - t0)
        rtts.sort()
        with _open_probe(t, timeout) as s:
            block = bytes(min(nbytes, 1 << 20))
            t0 = time.perf_counter()
            s.sendall(b"T" + nbytes.to_bytes(8, "little"))
            left = nbytes
            while left > 0:
                s.sendall(block[:left])
                left -= min(left, len(block))
            if s.recv(1) != b"K":
                raise ConnectionError("the throughput probe was not acknowledged")
            seconds = time.perf_counter() - t0
        return {"ok": True, "rtt_s": rtts[len(rtts) // 2], "bytes": nbytes, "seconds": seconds}
    except (OSError, ValueError) as e:
        return {"ok": False, "error": getattr(e, "strerror", None) or str(e) or type(e).__name__}


def _try_connect(targets: list, timeout: float) -> list:
    results: list = [None] * len(targets)

    def one(i: int, t: dict) -> None:
        try:
            _open_probe(t, timeout).close()
            results[i] = {"ok": True}
        except (OSError, ValueError) as e:
            results[i] = {"ok": False,
                          "error": getattr(e, "strerror", None) or str(e) or type(e).__name__}

    threads = [threading.Thread(target=one, args=(i, t)) for i, t in enumerate(targets)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


if __name__ == "__main__":
    main()
