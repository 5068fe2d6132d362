"""fastcoll and its peers across simulated hosts, and the stall a data-link outage costs.

Both build the multi-host test bed of `tests/netns.py` (hosts in network namespaces, each with
its own hostname, sshd and data link, reached over ssh from a launcher namespace), so every byte
crosses a veth pair and a bridge, not loopback. Root and Linux only.

    python bench/multihost.py bench [--systems ...] [--sizes ...] [--links unshaped,1gbit]
    python bench/multihost.py outage [--seconds 1,2,3,5,8] [--fault drop|cut]

`bench`: all_reduce of float32, `--hosts` hosts (2 or 4), one rank each, at each link setting
(`unshaped`, the veth's own speed, or a tbf rate such as `1gbit` on every host's data device),
through the localhost benchmark's harness, workers and report: OUT/LINK/results.md and .json.
Each system starts as it would across real hosts: fastcoll-tcp(/py), fastcoll-zmq by
`fastcoll-launch --hostfile` (ips = the data addresses), mlx-ring by `mlx.launch --hostfile`,
gloo by fastcoll-launch as a process starter (MASTER_ADDR the first host's data address,
GLOO_SOCKET_IFNAME the data device), mpi by the mpich wheel's `mpiexec -launcher ssh`.

`outage`: a 2-host fastcoll job all-reduces 4 KiB every 10 ms (FASTCOLL_TIMEOUT=60); for T
seconds the switch drops every packet between the hosts (`drop`: links up), or host2's data
cable is pulled (`cut`); the longest all-reduce is the stall (up to about 2T: TCP's
retransmission backoff decides when the first packet after the outage goes out).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import netns  # noqa: E402
from bench import harness, report  # noqa: E402

REPO = harness.REPO_ROOT
WORKERS = REPO / "bench" / "workers"
PYTHON = sys.executable
SYSTEMS = ("fastcoll-tcp", "fastcoll-zmq", "mlx-ring", "gloo", "mpi")
SIZES = [4 * 16**k for k in range(7)]  # 4 B .. 64 MiB, powers of 16


class Hosts:
    """The bed's hosts and how each system's job is started across them."""

    def __init__(self, bed: netns.TestBed, hosts: int) -> None:
        self.bed, self.port = bed, 41000
        bindir = bed.root / "bin"  # an `ssh` that reads the bed's config, for mlx.launch and hydra
        bindir.mkdir()
        (bindir / "ssh").write_text(f'#!/bin/sh\nexec {shlex.quote(shutil.which("ssh") or "ssh")} -F '
                                    f'{shlex.quote(str(bed.ssh_config))} "$@"\n')
        (bindir / "ssh").chmod(0o755)
        self.path = f"{bindir}:{os.path.dirname(PYTHON)}:{os.environ.get('PATH', '')}"
        self.hosts = [bed.host(i) for i in range(1, hosts + 1)]
        self.hostfile = bed.hostfile(tuple(range(1, hosts + 1)), fmt="mpirun")
        self.mlx_hostfile = bed.root / "mlx_hosts.json"
        self.mlx_hostfile.write_text(json.dumps([{"ssh": h.name, "ips": [h.data[0]]} for h in self.hosts]))

    def command(self, system: str, args: list[str], timeout: float) -> list[str]:
        """The launcher's command line for one job of `system` running its worker with `args`."""
        pythonpath = f"{REPO}:{WORKERS}"
        launch = [PYTHON, "-m", "fastcoll.launch", "--ssh", f"ssh -F {self.bed.ssh_config}", "--hostfile",
                  self.hostfile, "--env", f"PYTHONPATH={pythonpath}", "--grace", "1", "--timeout", str(timeout)]
        self.port += 10
        if system.startswith("fastcoll-"):
            transport, _, variant = system.split("-", 1)[1].partition("/")
            return [*launch, "--env", f"FASTCOLL_TRANSPORT={transport}", "--env", "FASTCOLL_TIMEOUT=120",
                    "--env", f"FASTCOLL_NATIVE={0 if variant == 'py' else 1}", "--env", f"BENCH_SYSTEM={system}",
                    PYTHON, str(WORKERS / "fastcoll_worker.py"), *args]
        if system == "gloo":
            inner = f"RANK=$FASTCOLL_RANK WORLD_SIZE=$FASTCOLL_WORLD_SIZE exec {PYTHON} {WORKERS / 'gloo_worker.py'}"
            return [*launch, "--env", f"MASTER_ADDR={self.hosts[0].data[0]}", "--env", f"MASTER_PORT={self.port}",
                    "--env", "GLOO_SOCKET_IFNAME=d0", "/bin/sh", "-c", " ".join([inner, *args])]
        if system == "mlx-ring":
            return [os.path.join(os.path.dirname(PYTHON), "mlx.launch"), "--backend", "ring", "--hostfile",
                    str(self.mlx_hostfile), "--starting-port", str(self.port), "--python", PYTHON, "--cwd",
                    str(REPO), "--env", f"PYTHONPATH={pythonpath}", "--", str(WORKERS / "mlx_worker.py"), *args]
        if system == "mpi":
            return [os.path.join(os.path.dirname(PYTHON), "mpiexec"), "-launcher", "ssh", "-hosts",
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
                                    max_iters=1000, timeout_s=args.job_timeout)
            doc = report.assemble(harness.run(config, hosts.launch, lambda m: print(f"[{link}] {m}", flush=True)))
            doc["meta"]["link"] = link
            written = report.write(doc, Path(args.out) / link, plots=False)
            print(f"[{link}] wrote {', '.join(map(str, written))}", flush=True)
    finally:
        bed.teardown()
    return 0


def _one_outage(bed: netns.TestBed, args: argparse.Namespace, seconds: float, out: Path) -> dict:
    """One job through one outage of `seconds`: its longest all-reduce and when it began."""
    run = bed.start_launcher(["--hostfile", bed.hostfile((1, 2)), "--env", f"PYTHONPATH={REPO}", "--timeout", "120",
                              PYTHON, str(WORKERS / "stall_worker.py"), str(out), str(seconds + args.after + 2.0)],
                             env=bed.launcher_env(FASTCOLL_TIMEOUT="60"), cwd=str(REPO))
    if not run.wait_for("ready", 2, timeout=30):
        raise SystemExit(f"job did not start:\n{run.out}\n{run.err}")
    time.sleep(1.0)
    t_cut = time.time()
    for host in ((1, 2) if args.fault == "drop" else ()):
        bed.blackhole(host)
    if args.fault == "cut":
        bed.cut(2)
    time.sleep(seconds)
    bed.heal()
    t_heal = time.time()
    code = run.wait(seconds + args.after + 60)
    if not out.exists():
        raise SystemExit(f"no result (exit {code}):\n{run.out[-2000:]}\n{run.err[-3000:]}")
    doc = json.loads(out.read_text())
    bed.kill_strays()
    return {"fault": args.fault, "outage_s": seconds, "stall_s": doc["longest_s"], "exit": code,
            "started_after_cut_s": doc["longest_at"] - t_cut, "healed_after_s": t_heal - t_cut}


def outage(args: argparse.Namespace) -> int:
    bed = netns.TestBed(hosts=2, data_links=1).build()
    rows = []
    try:
        for seconds in args.seconds:
            for trial in range(args.trials):
                row = _one_outage(bed, args, seconds, bed.root / f"stall-{seconds}-{trial}.json")
                rows.append(row | {"trial": trial})
                print(f"outage {seconds} s (trial {trial}): longest all_reduce {row['stall_s']:.2f} s, began "
                      f"{row['started_after_cut_s']:+.2f} s after the cut; exit {row['exit']}", flush=True)
    finally:
        bed.teardown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": harness.machine_info(), "command": " ".join(sys.argv), "rows": rows}
    (out / "outage.json").write_text(json.dumps(doc, indent=1))
    print("\n| outage T | longest all_reduce (stall), each trial | stall / T |\n| --- | --- | --- |")
    for seconds in args.seconds:
        got = [r["stall_s"] for r in rows if r["outage_s"] == seconds]
        print(f"| {seconds:g} s | {', '.join(f'{s:.2f} s' for s in got)} | {max(got) / seconds:.2f} |")
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
    b.add_argument("--job-timeout", type=float, default=240)
    b.add_argument("--out", default=str(REPO / "bench" / "out" / "multihost"))
    o = sub.add_parser("outage", help="the stall a data-link outage of T seconds costs")
    o.add_argument("--seconds", default="1,2,3,5,8")
    o.add_argument("--trials", type=int, default=2)
    o.add_argument("--fault", choices=("drop", "cut"), default="drop",
                   help="drop: the switch loses every packet between the hosts, links up; "
                        "cut: host2's cable pulled at the switch (host2 sees no carrier)")
    o.add_argument("--after", type=float, default=3.0, help="seconds the job runs after healing")
    o.add_argument("--out", default=str(REPO / "bench" / "out" / "multihost"))
    args = p.parse_args(argv)
    csv = lambda text, kind=str: [kind(s) for s in text.split(",") if s]
    if args.what == "bench":
        args.systems, args.sizes, args.links = csv(args.systems), csv(args.sizes, int), csv(args.links)
        return bench(args)
    args.seconds = csv(args.seconds, float)
    return outage(args)


if __name__ == "__main__":
    sys.exit(main())
