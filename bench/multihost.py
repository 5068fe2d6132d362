"""fastcoll and its peers across the hosts of the network-namespace bed (`tests/netns.py`: every
byte crosses a veth pair and a bridge, not loopback; root and Linux only; docs/multihost.md).

    python bench/multihost.py bench [--hosts 2] [--systems ...] [--sizes ...] [--links unshaped,1gbit] [--settle S]

all_reduce of float32, one rank a host, through the localhost benchmark's harness, workers and
report, each system started as across real hosts (Hosts.command): OUT/LINK/results.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import netns  # noqa: E402
from bench import harness, report  # noqa: E402

REPO = harness.REPO_ROOT
WORKERS = REPO / "bench" / "workers"
PYTHON = sys.executable
SYSTEMS = ("fastcoll-tcp", "fastcoll-zmq", "mlx-ring", "mpi")
SIZES = [4 * 16**k for k in range(7)]  # 4 B .. 64 MiB, powers of 16


class Hosts:
    """The bed's hosts and how each system's job is started across them."""

    def __init__(self, bed: netns.TestBed, hosts: int) -> None:
        self.bed, self.port = bed, 41000
        bindir = bed.root / "bin"  # an `ssh` that reaches the bed's hosts, for mlx.launch and hydra
        if not (bindir / "ssh").exists():
            bindir.mkdir(exist_ok=True)
            (bindir / "ssh").write_text(f'#!/bin/sh\nexec {bed.ssh_command} "$@"\n')
            (bindir / "ssh").chmod(0o755)
        self.path = f"{bindir}:{os.path.dirname(PYTHON)}:{os.environ.get('PATH', '')}"
        # Beside this Python (a venv), else on PATH: where a machine that carried its packages has them.
        self.mpiexec = os.environ.get("BENCH_MPIEXEC") or shutil.which("mpiexec", path=self.path) or "mpiexec"
        self.mlx_launch = shutil.which("mlx.launch", path=self.path) or "mlx.launch"
        # The ranks' PYTHONPATH: the repository and the workers, then what the launcher's has
        # (a machine whose packages were carried in keeps them on PYTHONPATH, not in site-packages).
        carried = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
        self.pythonpath = os.pathsep.join([str(REPO), str(WORKERS), *carried])
        self.hosts = [bed.host(i) for i in range(1, hosts + 1)]
        self.hostfile = bed.hostfile(tuple(range(1, hosts + 1)), fmt="mpirun")
        self.mlx_hostfile = bed.root / "mlx_hosts.json"
        self.mlx_hostfile.write_text(json.dumps([{"ssh": h.name, "ips": [h.data[0]]} for h in self.hosts]))

    def command(self, system: str, args: list[str], timeout: float) -> list[str]:
        """The launcher's command line for one job of `system` running its worker with `args`."""
        pythonpath = self.pythonpath
        launch = [PYTHON, "-m", "fastcoll.launch", "--ssh", self.bed.ssh_command, "--hostfile",
                  self.hostfile, "--env", f"PYTHONPATH={pythonpath}", "--grace", "1", "--timeout", str(timeout)]
        self.port += 10
        if system.startswith("fastcoll-"):
            transport, _, variant = system.split("-", 1)[1].partition("/")
            return [*launch, "--env", f"FASTCOLL_TRANSPORT={transport}", "--env", "FASTCOLL_TIMEOUT=120",
                    "--env", f"FASTCOLL_NATIVE={0 if variant == 'py' else 1}", "--env", f"BENCH_SYSTEM={system}",
                    PYTHON, str(WORKERS / "fastcoll_worker.py"), *args]
        if system == "mlx-ring":
            return [self.mlx_launch, "--backend", "ring", "--hostfile",
                    str(self.mlx_hostfile), "--starting-port", str(self.port), "--python", PYTHON, "--cwd",
                    str(REPO), "--env", f"PYTHONPATH={pythonpath}", "--", str(WORKERS / "mlx_worker.py"), *args]
        if system == "mpi":
            return [self.mpiexec, "-launcher", "ssh", "-hosts",
                    ",".join(h.name for h in self.hosts), "-n", str(len(self.hosts)), "-ppn", "1",
                    "-localhost", netns.CTL_ADDR, "-genv", "PYTHONPATH", pythonpath, "-genv",
                    "MPIR_CVAR_CH4_NETMOD", "ofi", "-genv", "FI_PROVIDER", "tcp", "-genv", "FI_TCP_IFACE", "d0",
                    "-wdir", str(REPO), PYTHON, str(WORKERS / "mpi_worker.py"), *args]
        raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}, fastcoll-tcp/py")

    def launch(self, system: str, world: int, args: list[str], timeout: float) -> harness.JobResult:
        """harness.run's launch: one job across the hosts, started from the launcher namespace."""
        cmd = self.bed.in_ctl(self.command(system, args, timeout))
        try:
            return harness.run_job([(cmd, self.bed.launcher_env(PATH=self.path))], timeout + 30)
        finally:
            self.bed.kill_strays()


def bench(args: argparse.Namespace) -> int:
    bed = netns.TestBed(hosts=args.hosts, data_links=1).build()
    try:
        hosts = Hosts(bed, args.hosts)
        for link in args.links:
            bed.heal()
            if link != "unshaped":
                bed.shape(link)
            config = harness.Config(systems=args.systems, ops=["all_reduce"], worlds=[args.hosts],
                                    sizes=args.sizes, rounds=args.rounds, budget_s=args.budget,
                                    settle_s=args.settle, max_iters=1000, timeout_s=args.job_timeout)
            doc = report.assemble(harness.run(config, hosts.launch, lambda m: print(f"[{link}] {m}", flush=True)))
            doc["meta"]["link"] = link
            written = report.write(doc, Path(args.out) / link, plots=False)
            print(f"[{link}] wrote {', '.join(map(str, written))}", flush=True)
    finally:
        bed.teardown()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bench", help="fastcoll beside its peers across simulated hosts")
    b.add_argument("--systems", default=",".join(SYSTEMS))
    b.add_argument("--hosts", type=int, default=2, choices=(2, 4), help="hosts, one rank each")
    b.add_argument("--sizes", default=",".join(map(str, SIZES)))
    b.add_argument("--links", default="unshaped,1gbit", help="unshaped, or a tbf rate (1gbit, 100mbit, ...)")
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--budget", type=float, default=0.25, help="seconds per point and round")
    b.add_argument("--settle", type=float, default=harness.Config.settle_s, help="untimed seconds at each job's start")
    b.add_argument("--job-timeout", type=float, default=240)
    b.add_argument("--out", default=str(REPO / "bench" / "out" / "multihost"))
    args = p.parse_args(argv)
    csv = lambda text, kind=str: [kind(s) for s in text.split(",") if s]
    args.systems, args.sizes, args.links = csv(args.systems), csv(args.sizes, int), csv(args.links)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
