"""The systems the benchmark compares, and how to start one job of each on localhost.

System names: `fastcoll-tcp`, `fastcoll-zmq`, `mlx-ring`, `mpi`, `gloo`, optionally followed by
`/`-separated variants: `/cN` for N connections per neighbour (fastcoll: FASTCOLL_CONNECTIONS=N;
mlx-ring: `mlx.launch --connections-per-ip N`), `/aN` (fastcoll only: every rank listens on N
loopback addresses, 127.0.0.1 to 127.0.0.N, and opens a connection to each, as with a hostfile
listing N ips per host), `/mx` (fastcoll only: mx.array inputs instead of numpy arrays),
`/noshm` (fastcoll-tcp only: FASTCOLL_SHM=0, every byte over TCP; by default ranks on one host
replace their connections by shared memory) and `/py` (fastcoll only: FASTCOLL_NATIVE=0, the
pure-Python engine; by default the native one runs). E.g. `fastcoll-tcp/c4`, `fastcoll-tcp/py`.

How each is started:
  fastcoll-*  N processes started here with FASTCOLL_RANK, FASTCOLL_WORLD_SIZE,
              FASTCOLL_COORDINATOR=127.0.0.1:<free port>, FASTCOLL_TOKEN=<random>, FASTCOLL_TRANSPORT
  mlx-ring    mlx.launch --backend ring -n N -p <free port range> --python <python> -- worker
  mpi         <the mpich wheel's mpiexec> -n N <python> worker
  gloo        N processes started here with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORKERS = BENCH_DIR / "workers"

KINDS = {
    "fastcoll-tcp": "fastcoll",
    "fastcoll-zmq": "fastcoll",
    "mlx-ring": "mlx",
    "mpi": "mpi",
    "gloo": "gloo",
}
DEFAULT_SYSTEMS = tuple(KINDS)
WORKER_SCRIPT = {
    "fastcoll": "fastcoll_worker.py",
    "mlx": "mlx_worker.py",
    "mpi": "mpi_worker.py",
    "gloo": "gloo_worker.py",
}


@dataclass(frozen=True)
class System:
    """One system to benchmark, parsed from its name."""

    name: str
    base: str
    connections: int = 1
    mx_arrays: bool = False
    addresses: int = 1
    shm: bool = True
    python_engine: bool = False

    @property
    def kind(self) -> str:
        return KINDS[self.base]

    @property
    def is_fastcoll(self) -> bool:
        return self.kind == "fastcoll"

    @property
    def worker(self) -> Path:
        return WORKERS / WORKER_SCRIPT[self.kind]


def parse_system(name: str) -> System:
    """'fastcoll-tcp/c4' -> System(base='fastcoll-tcp', connections=4); ValueError if unknown."""
    base, *variants = name.strip().split("/")
    if base not in KINDS:
        raise ValueError(f"unknown system {base!r}; known: {', '.join(KINDS)}")
    connections, mx_arrays, addresses, shm, python_engine = 1, False, 1, True, False
    for v in variants:
        if v.startswith("c") and v[1:].isdigit() and int(v[1:]) >= 1:
            if KINDS[base] not in ("fastcoll", "mlx"):
                raise ValueError(f"{name}: /cN applies to fastcoll and mlx-ring only")
            connections = int(v[1:])
        elif v == "mx" and KINDS[base] == "fastcoll":
            mx_arrays = True
        elif v.startswith("a") and v[1:].isdigit() and 1 <= int(v[1:]) <= 254 and KINDS[base] == "fastcoll":
            addresses = int(v[1:])
        elif v == "noshm" and base == "fastcoll-tcp":
            shm = False
        elif v == "py" and KINDS[base] == "fastcoll":
            python_engine = True
        else:
            raise ValueError(f"{name}: unknown variant {v!r} (known: /cN, /aN, /mx, /noshm and /py for fastcoll)")
    return System(name.strip(), base, connections, mx_arrays, addresses, shm, python_engine)


def _python_bin_tool(name: str) -> str | None:
    """A console script installed beside this interpreter, else the first one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every worker: this one, with the repo root first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def unavailable(system: System) -> str | None:
    """Why `system` cannot run here (e.g. 'torch not installed'), or None when it can."""
    if system.kind == "gloo":
        if not _has_module("torch"):
            return "torch not installed (pip install torch)"
        return None
    if system.kind == "mpi":
        if not _has_module("mpi4py"):
            return "mpi4py not installed (pip install mpich mpi4py)"
        if _python_bin_tool("mpiexec") is None:
            return "mpiexec not found (pip install mpich)"
        return None
    if system.kind == "mlx":
        if not _has_module("mlx"):
            return "mlx not installed"
        if _python_bin_tool("mlx.launch") is None:
            return "mlx.launch not found"
        return None
    # fastcoll: the core may not exist yet; ask a fresh interpreter, as the workers will see it.
    probe = ("import fastcoll, sys; missing = [n for n in ('init', 'all_reduce', 'all_gather', "
             "'reduce_scatter', 'broadcast', 'barrier', 'finalize') if not hasattr(fastcoll, n)]; "
             "print(','.join(missing))")
    try:
        r = subprocess.run([sys.executable, "-c", probe], env=worker_env(), capture_output=True,
                           text=True, timeout=60, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return "import fastcoll timed out"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"import fastcoll failed: {last}"
    if r.stdout.strip():
        return f"fastcoll has no {r.stdout.strip()} yet"
    if system.base == "fastcoll-zmq" and not _has_module("zmq"):
        return "pyzmq not installed"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int, tries: int = 50) -> int:
    """The first of `count` consecutive free ports (MLX's ring listens on base..base+count-1)."""
    for _ in range(tries):
        base = free_port()
        if base + count >= 65536:
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass
class LaunchResult:
    """What one job of one system gave: the rank-0 document, or why there is none."""

    doc: dict[str, Any] | None
    error: str | None = None
    wall_s: float = 0.0
    command: list[str] = field(default_factory=list)


@dataclass
class _Proc:
    popen: subprocess.Popen
    stdout: Path
    stderr: Path


def _kill(proc: _Proc) -> None:
    """End a process we started, and its process group (it was started in a new session)."""
    if proc.popen.poll() is not None:
        return
    try:
        os.killpg(proc.popen.pid, signal.SIGTERM)
        proc.popen.wait(timeout=3)
    except (ProcessLookupError, subprocess.TimeoutExpired, PermissionError):
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.popen.wait()


def _start(argv: list[str], env: dict[str, str], workdir: Path, tag: str) -> _Proc:
    out, err = workdir / f"{tag}.out", workdir / f"{tag}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=fo,
                             stderr=fe, start_new_session=True)
    return _Proc(p, out, err)


def _wait_all(procs: list[_Proc], timeout: float) -> str | None:
    """Wait for every process; on a failure or the timeout end the rest. None when all exit 0."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.popen.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # Let the others notice and exit by themselves for a moment, then end them.
            grace = time.monotonic() + 5
            while time.monotonic() < grace and any(p.popen.poll() is None for p in procs):
                time.sleep(0.05)
            for p in procs:
                _kill(p)
            return "; ".join(f"process {i} exited with {c}" for i, c in failed)
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            for p in procs:
                _kill(p)
            return f"timed out after {timeout:.0f} s"
        time.sleep(0.02)


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    keep = [line.strip() for line in text
            if line.strip(" ^~\t") and "FutureWarning" not in line and "return func(" not in line]
    return " | ".join(keep[-lines:])


def parse_document(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a worker's JSON document, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and "points" in doc:
                return doc
    return None


def commands(system: System, world: int, worker_args: list[str]) -> list[tuple[list[str], dict[str, str]]]:
    """The processes to start for one job: (argv, extra environment) each; rank 0's first."""
    script = str(system.worker)
    py = sys.executable
    env = {"BENCH_SYSTEM": system.name}
    if system.kind == "mlx":
        launcher = _python_bin_tool("mlx.launch") or "mlx.launch"
        base = free_port_range(world * system.connections)
        argv = [launcher, "--backend", "ring", "-n", str(world), "-p", str(base),
                "--connections-per-ip", str(system.connections), "--python", py, "--",
                script, *worker_args]
        return [(argv, env)]
    if system.kind == "mpi":
        mpiexec = _python_bin_tool("mpiexec") or "mpiexec"
        return [([mpiexec, "-n", str(world), py, script, *worker_args], env)]
    if system.kind == "gloo":
        port = str(free_port())
        return [([py, script, *worker_args],
                 env | {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
                for r in range(world)]
    # fastcoll
    coordinator = f"127.0.0.1:{free_port()}"
    token = secrets.token_hex(16)
    transport = "zmq" if system.base == "fastcoll-zmq" else "tcp"
    extra = ["--array", "mlx"] if system.mx_arrays else []
    common = env | {"FASTCOLL_WORLD_SIZE": str(world), "FASTCOLL_COORDINATOR": coordinator,
                    "FASTCOLL_TOKEN": token, "FASTCOLL_TRANSPORT": transport,
                    "FASTCOLL_NATIVE": "0" if system.python_engine else "1"}
    if system.connections > 1:
        common["FASTCOLL_CONNECTIONS"] = str(system.connections)
    if not system.shm:
        common["FASTCOLL_SHM"] = "0"
    if system.addresses > 1:
        common["FASTCOLL_INTERFACE"] = ",".join(f"127.0.0.{i}" for i in range(1, system.addresses + 1))
    return [([py, script, *worker_args, *extra],
             common | {"FASTCOLL_RANK": str(r), "FASTCOLL_LOCAL_RANK": str(r)})
            for r in range(world)]


def launch(system: System, world: int, worker_args: list[str], timeout: float) -> LaunchResult:
    """Run one job of `system` with `world` ranks on localhost and collect rank 0's document.

    Never raises for a failing system: the failure is in the result's `error`. Where a job dies
    or times out part-way, the points rank 0 had finished come back (marked incomplete).
    """
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fastcoll-bench-") as tmp:
        workdir = Path(tmp)
        partial = workdir / "partial.json"
        try:
            cmds = commands(system, world, worker_args)
        except RuntimeError as e:
            return LaunchResult(None, str(e))
        procs = [_start(argv, worker_env(extra | {"BENCH_PARTIAL_FILE": str(partial)}), workdir,
                        f"p{i}")
                 for i, (argv, extra) in enumerate(cmds)]
        try:
            error = _wait_all(procs, timeout)
        finally:
            for p in procs:
                _kill(p)
        doc = parse_document(procs[0].stdout.read_text(errors="replace"))
        if doc is None and partial.exists():
            try:
                doc = json.loads(partial.read_text()) | {"incomplete": True}
            except (OSError, json.JSONDecodeError):
                doc = None
        if doc is None and error is None:
            error = "no result printed"  # mlx.launch exits 0 even when a rank fails
        if error is not None or doc is None:
            details = " | ".join(t for t in (_tail(p.stderr) for p in procs) if t)
            error = f"{error}: {details}" if details else error
        return LaunchResult(doc, error, time.monotonic() - t0, cmds[0][0])
