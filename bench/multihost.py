"""The bed's hosts and how each system's job starts across them, for bench/hostbed.py's parts (the
collectives' systems and mlx-lm decode's); root and Linux only (docs/multihost.md).

The bed is `tests/netbed.py`'s: each host its own cores where the machine has 8 CPUs or more
(below that nothing is pinned), links shaped by bench/bedlink.c as `netbed.parse_link` reads them
(`unshaped`, `1gbit+50us`, `0+200us` for a delay alone, `1gbit` for a rate alone).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import netbed  # noqa: E402
from bench import decode_bench, harness  # noqa: E402
from bench.systems import WORKERS, System, fastcoll_env, parse_system, tool  # noqa: E402

REPO = harness.REPO_ROOT
PYTHON = sys.executable
DECODE_SYSTEMS = ("fastcoll", "fastcoll-graph", "ring", "ring-mlx.launch", "floor")
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # one core a rank, as the ranks share two


def bed_system(name: str) -> System:
    """A system of bench/systems.py that the bed can start; ValueError for one it cannot."""
    s = parse_system(name)
    if s.addresses > 1 or s.rdma or (s.kind == "mlx" and s.connections > 1):
        raise ValueError(f"{name}: /aN, /rdma and mlx-ring's /cN are localhost's variants, not the bed's")
    return s


class Hosts:
    """The bed's hosts and how each system's job is started across them: the collectives' (`command`)
    and decode's (`decode_command`)."""

    def __init__(self, bed: netbed.Bed, hosts: int) -> None:
        self.bed, self.port, self.trace = bed, 41000, None  # trace: decode's FASTCOLL_TRACE, less "-SYSTEM.json"
        # Beside this Python (a venv), else on PATH: where a machine that carried its packages has them.
        self.mpiexec = os.environ.get("BENCH_MPIEXEC") or tool("mpiexec") or "mpiexec"
        self.mlx_launch = tool("mlx.launch") or "mlx.launch"
        # The ranks' PYTHONPATH: the repository and the workers, then what the launcher's has
        # (a machine whose packages were carried in keeps them on PYTHONPATH, not in site-packages).
        carried = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
        self.pythonpath = os.pathsep.join([str(REPO), str(WORKERS), *carried])
        self.hosts = [bed.host(i) for i in range(1, hosts + 1)]
        self.hostfile = bed.hostfile(tuple(range(1, hosts + 1)), fmt="mpirun")
        self.mlx_hostfile = bed.hostfile(tuple(range(1, hosts + 1)), fmt="mlx")

    def fastcoll_launch(self, timeout: float, env: dict[str, str]) -> list[str]:
        """fastcoll-launch over the bed's ssh with the ranks' PYTHONPATH and `env`; a fresh port
        range for the job (MLX's ring listens on it)."""
        self.port += 10
        pairs = {"PYTHONPATH": self.pythonpath, **env}
        return [PYTHON, "-m", "fastcoll.launch", "--ssh", self.bed.ssh_command, "--hostfile", self.hostfile,
                *[f"--env={k}={v}" for k, v in pairs.items()], "--grace", "1", "--timeout", str(timeout)]

    def mlx_launch_ring(self, script: Path, args: list[str], env: dict[str, str]) -> list[str]:
        """`mlx.launch --backend ring` over the bed's ssh, as MLX's users start a job."""
        pairs = {"PYTHONPATH": self.pythonpath, **env}
        return [self.mlx_launch, "--backend", "ring", "--hostfile", self.mlx_hostfile, "--starting-port",
                str(self.port), "--python", PYTHON, "--cwd", str(REPO), *[f"--env={k}={v}" for k, v in pairs.items()],
                "--", str(script), *args]

    def command(self, system: str, args: list[str], timeout: float) -> list[str]:
        """The launcher's command line for one job of `system` (a name of bench/systems.py)
        running its worker with `args`."""
        s = bed_system(system)
        if s.kind == "fastcoll":
            env = fastcoll_env(s) | {"FASTCOLL_TIMEOUT": "120"}
            return [*self.fastcoll_launch(timeout, env), PYTHON, str(s.worker), *args, *s.extra_args]
        if s.kind == "mlx":
            return self.mlx_launch_ring(s.worker, args, {})
        return [self.mpiexec, "-launcher", "ssh", "-hosts",
                ",".join(h.name for h in self.hosts), "-n", str(len(self.hosts)), "-ppn", "1",
                "-localhost", netbed.CTL_ADDR, "-genv", "PYTHONPATH", self.pythonpath, "-genv",
                "MPIR_CVAR_CH4_NETMOD", "ofi", "-genv", "FI_PROVIDER", "tcp", "-genv", "FI_TCP_IFACE", "d0",
                "-wdir", str(REPO), PYTHON, str(s.worker), *args]

    def decode_command(self, system: str, args: list[str], timeout: float) -> list[str]:
        """The launcher's command line for one mlx-lm decode job of `system` (DECODE_SYSTEMS) running
        workers/tp_worker.py with `args`; `floor` is `ring` with the model's all-reduces left out."""
        name, _, knobs = system.partition("/")  # fastcoll/NAME=VALUE/...: with those FASTCOLL_TUNING knobs
        worker = decode_bench.WORKER
        if name in ("fastcoll", "fastcoll-graph"):
            env = THREADS | {"FASTCOLL_TIMEOUT": "60"} | ({"FASTCOLL_TUNING": knobs.replace("/", ",")} if knobs else {})
            env |= {"FASTCOLL_MLX_GRAPH": "1" if name == "fastcoll-graph" else "0"}  # "fastcoll": the eager path
            env |= {"FASTCOLL_TRACE": f"{self.trace}-{system.replace('/', '+').replace('=', '')}.json"} if self.trace else {}
            return [*self.fastcoll_launch(timeout, env), PYTHON, "-m", "fastcoll.mlx_compat", str(worker), *args]
        launch = self.fastcoll_launch(timeout, THREADS)
        ring = self.bed.root / f"ring-{self.port}.json"
        ring.write_text(json.dumps([[f"{h.data[0]}:{self.port + i}"] for i, h in enumerate(self.hosts)]))
        if system in ("ring", "floor"):
            args = [*args, "--no-exchange"] if system == "floor" else args
            inner = f"MLX_RANK=$FASTCOLL_RANK MLX_HOSTFILE={ring} exec {PYTHON} {worker} " + " ".join(args)
            return [*launch, "/bin/sh", "-c", inner]
        if system == "ring-mlx.launch":
            return self.mlx_launch_ring(worker, args, THREADS)
        raise ValueError(f"unknown system {system!r}; known: {', '.join(DECODE_SYSTEMS)}")

    def launch(self, system: str, world: int, args: list[str], timeout: float) -> harness.JobResult:
        """harness.run's launch: one job across the hosts, started from the launcher namespace."""
        return self.run(self.command(system, args, timeout), timeout)

    def run(self, cmd: list[str], timeout: float, key: str | None = "points", host: int = 0,
            **env: str) -> harness.JobResult:
        """cmd started from the launcher namespace (or on host `host`) with `env` added (the bed's
        bin/ first on PATH: its `ssh`, which mlx.launch and hydra take from there), the bed's strays
        killed after."""
        cmd = self.bed.in_host(host, cmd) if host else self.bed.in_ctl(cmd)
        try:
            return harness.run_job([(cmd, self.bed.launcher_env(**env))], timeout + 30, key=key)
        finally:
            self.bed.kill_strays()
