"""The systems the benchmark compares (names and variants: bench/README.md, "What it measures"),
and the processes of one job of each on localhost: fastcoll as N processes with their launcher's
variables set here, mlx-ring through `mlx.launch`, mpi through the mpich wheel's `mpiexec`.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import harness, report
from bench.harness import REPO_ROOT, Command, JobResult, free_ports, run_job

WORKERS = REPO_ROOT / "bench" / "workers"
KINDS = {"fastcoll-tcp": "fastcoll", "fastcoll-zmq": "fastcoll", "mlx-ring": "mlx", "mpi": "mpi"}
DEFAULT_SYSTEMS = tuple(KINDS)


@dataclass(frozen=True)
class System:
    """One system to benchmark, parsed from its name."""

    name: str
    base: str
    connections: int = 1
    mx_arrays: bool = False
    addresses: int = 1
    shm: bool = True
    rdma: bool = False
    python_engine: bool = False
    tuning: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return KINDS[self.base]

    @property
    def worker(self) -> Path:
        return WORKERS / f"{self.kind}_worker.py"

    @property
    def extra_args(self) -> list[str]:
        return ["--array", "mlx"] if self.mx_arrays else []  # /mx: the worker hands fastcoll mx.arrays


def parse_system(name: str) -> System:
    """'fastcoll-tcp/c4' -> System(base='fastcoll-tcp', connections=4); ValueError if unknown."""
    base, *variants = name.strip().split("/")
    if base not in KINDS:
        raise ValueError(f"unknown system {base!r}; known: {', '.join(KINDS)}")
    fields: dict = {"tuning": ()}
    fastcoll = KINDS[base] == "fastcoll"
    for v in variants:
        number = v[1:].isdigit() and int(v[1:]) >= 1
        if v.startswith("c") and number and KINDS[base] in ("fastcoll", "mlx"):
            fields["connections"] = int(v[1:])
        elif v.startswith("a") and number and int(v[1:]) <= 254 and fastcoll:
            fields["addresses"] = int(v[1:])
        elif v in ("mx", "py") and fastcoll:
            fields["mx_arrays" if v == "mx" else "python_engine"] = True
        elif v == "noshm" and base == "fastcoll-tcp":
            fields["shm"] = False
        elif v == "rdma" and base == "fastcoll-tcp":
            fields["rdma"] = True
        elif "=" in v and fastcoll:
            fields["tuning"] += (v,)
        else:
            raise ValueError(f"{name}: unknown variant {v!r} (known: /cN for fastcoll and mlx-ring; "
                             "/aN, /mx, /noshm, /rdma, /py and /KEY=VALUE for fastcoll)")
    return System(name.strip(), base, **fields)


def launcher() -> list[str]:
    """fastcoll-launch: the console script, or the module where only PYTHONPATH names fastcoll
    (the GPU machine, which installs nothing)."""
    script = tool("fastcoll-launch")
    return [script] if script else [sys.executable, "-m", "fastcoll.launch"]


def tool(name: str) -> str | None:
    """A console script installed beside this interpreter, else the first one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unavailable(system: System) -> str | None:
    """Why `system` cannot run here (e.g. 'torch not installed'), or None when it can."""
    needs = {"mpi": [("mpi4py", "mpi4py not installed (pip install mpich mpi4py)")],
             "mlx": [("mlx", "mlx not installed")],
             "fastcoll": [("fastcoll", "fastcoll not installed")]}[system.kind]
    if system.base == "fastcoll-zmq":
        needs.append(("zmq", "pyzmq not installed"))
    for module, why in needs:
        if not _has(module):
            return why
    launcher = {"mpi": "mpiexec", "mlx": "mlx.launch"}.get(system.kind)
    if launcher and tool(launcher) is None:
        return f"{launcher} not found"
    return None


def fastcoll_ranks(world: int, argv: list[str], env: dict[str, str]) -> list[Command]:
    """N local ranks of a fastcoll job, started the way the README's environment table says."""
    common = env | {"FASTCOLL_WORLD_SIZE": str(world), "FASTCOLL_TOKEN": secrets.token_hex(16),
                    "FASTCOLL_COORDINATOR": f"127.0.0.1:{free_ports()}"}
    return [(argv, common | {"FASTCOLL_RANK": str(r), "FASTCOLL_LOCAL_RANK": str(r)})
            for r in range(world)]


def commands(system: System, world: int, worker_args: list[str]) -> list[Command]:
    """The processes of one job of `system` over `world` ranks (rank 0's first)."""
    py, script, env = sys.executable, str(system.worker), {"BENCH_SYSTEM": system.name}
    if system.kind == "mlx":
        base = free_ports(world * system.connections)
        return [([tool("mlx.launch") or "mlx.launch", "--backend", "ring", "-n", str(world), "-p",
                  str(base), "--connections-per-ip", str(system.connections), "--python", py, "--",
                  script, *worker_args], env)]
    if system.kind == "mpi":
        return [([tool("mpiexec") or "mpiexec", "-n", str(world), py, script, *worker_args], env)]
    env |= fastcoll_env(system)
    if system.rdma:
        env |= {"FASTCOLL_TRANSPORT": "rdma", "FASTCOLL_VERBS_LIB": fabric_library()}
    if system.addresses > 1:
        env["FASTCOLL_INTERFACE"] = ",".join(f"127.0.0.{i}" for i in range(1, system.addresses + 1))
    return fastcoll_ranks(world, [py, script, *worker_args, *system.extra_args], env)


def fastcoll_env(system: System) -> dict[str, str]:
    """What a fastcoll system's ranks are told, here or across a bed's hosts: its transport,
    engine, connections, shared memory and tuning knobs."""
    env = {"FASTCOLL_TRANSPORT": "zmq" if system.base == "fastcoll-zmq" else "tcp",
           "FASTCOLL_NATIVE": "0" if system.python_engine else "1", "BENCH_SYSTEM": system.name}
    if system.connections > 1:
        env["FASTCOLL_CONNECTIONS"] = str(system.connections)
    if not system.shm:
        env["FASTCOLL_SHM"] = "0"
    if system.tuning:
        env["FASTCOLL_TUNING"] = ",".join(system.tuning)
    return env


def fabric_library() -> str:
    """The test fabric's verbs library (tests/fabric/build.py builds it once and prints its path)."""
    built = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "fabric" / "build.py")],
                           capture_output=True, text=True, check=True)
    return built.stdout.strip().splitlines()[-1]


def launch(system: System, world: int, worker_args: list[str], timeout: float) -> JobResult:
    """One job of `system` over `world` ranks on localhost; rank 0's document or why there is none."""
    try:
        cmds = commands(system, world, worker_args)
    except RuntimeError as e:  # no free ports
        return JobResult(None, str(e))
    return run_job(cmds, timeout)


def measure(config: harness.Config, busy: int = 0) -> dict:
    """Run every available system of `config` on localhost; the results document."""
    skipped = {s.name: why for s in config.systems if (why := unavailable(s))}
    for name, why in skipped.items():
        print(f"{name}: {why}; skipped", flush=True)
    config.systems = [s for s in config.systems if s.name not in skipped]
    with harness.busy(busy):
        raw = harness.run(config, launch, lambda msg: print(msg, flush=True), skipped)
    raw["meta"]["busy_processes"] = busy
    return report.assemble(raw)
