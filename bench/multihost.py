"""fastcoll and its peers across simulated hosts, and the stall a data-link outage costs.

Both build the multi-host test bed of `tests/netns.py` (hosts in network namespaces, each with
its own hostname, sshd and data link, reached over ssh from a launcher namespace), so every byte
crosses a veth pair and a bridge, not loopback. Root and Linux only.

    python bench/multihost.py bench [--systems ...] [--sizes ...] [--links unshaped,1gbit]
    python bench/multihost.py outage [--seconds 1,2,3,5,8]

`bench`: all_reduce of float32, `--hosts` hosts (2 or 4), one rank each, at each link setting:
`unshaped` (the veth's own speed) and `1gbit` (a tbf qdisc, rate 1gbit, on every host's data
device). Systems:

    fastcoll-tcp, fastcoll-zmq  fastcoll-launch --hostfile (ips = the data addresses); the
                                native engine over TCP, pyzmq's over ZeroMQ; fastcoll-tcp/py:
                                the pure-Python engine (FASTCOLL_NATIVE=0)
    mlx-ring                    mlx.launch --backend ring --hostfile (MLX JSON, same ips)
    gloo                        torch.distributed, started by fastcoll-launch (it only starts
                                processes: RANK from FASTCOLL_RANK, MASTER_ADDR the first host's
                                data address, GLOO_SOCKET_IFNAME the data device)
    mpi                         mpi4py on the mpich wheel's mpiexec (hydra, ssh launcher)

Every worker is bench/workers/*_worker.py, the ones the localhost benchmark runs; the times are
those of the slowest rank; `--rounds` rounds, systems in a rotated order each round, samples
pooled. Writes results.json and results.md into --out (default bench/out/multihost, ignored).

`outage`: a 2-host fastcoll job all-reduces 4 KiB every 10 ms (FASTCOLL_TIMEOUT=60); for T
seconds the switch drops every packet between the hosts, both ways (`--fault drop`, the links
stay up: `TestBed.blackhole`), or host2's data cable is pulled at the switch (`--fault cut`); the longest all-reduce is
the stall. TCP's retransmission backoff (200 ms, doubling) decides when the first packet after the
cut goes out again, so the stall is T rounded up to the next retransmission: up to about 2T.

Delay is not simulated: this kernel has no netem (CONFIG_NET_SCH_NETEM off, no modules).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))
import netns  # noqa: E402
from metrics import busbw, summarize  # noqa: E402

SYSTEMS = ("fastcoll-tcp", "fastcoll-zmq", "mlx-ring", "gloo", "mpi")
SIZES = [4 * 16**k for k in range(7)]  # 4 B .. 64 MiB, powers of 16
PYTHON = sys.executable


def _size(n: int) -> str:
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n // m} {unit}"
    return f"{n} B"


class Bench:
    def __init__(self, bed: netns.TestBed, args: argparse.Namespace) -> None:
        self.bed = bed
        self.args = args
        assert bed.root is not None and bed.ssh_config is not None
        self.root = bed.root
        # A `ssh` first on PATH that reads the bed's config, for launchers without an --ssh
        # option (mlx.launch, hydra's ssh launcher).
        bindir = self.root / "bin"
        bindir.mkdir()
        wrapper = bindir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(_which("ssh"))} -F '
                           f'{shlex.quote(str(bed.ssh_config))} "$@"\n')
        wrapper.chmod(0o755)
        self.path = f"{bindir}:{os.path.dirname(PYTHON)}:{os.environ.get('PATH', '')}"
        self.hosts = [bed.host(i) for i in range(1, args.hosts + 1)]
        self.hostfile = bed.hostfile(tuple(range(1, args.hosts + 1)), fmt="mpirun")
        mlx_hosts = [{"ssh": h.name, "ips": [h.data[0]]} for h in self.hosts]
        self.mlx_hostfile = self.root / "mlx_hosts.json"
        self.mlx_hostfile.write_text(json.dumps(mlx_hosts))
        self.port = 41000

    def worker_args(self) -> list[str]:
        a = self.args
        return ["--ops", "all_reduce", "--sizes", ",".join(map(str, a.sizes)),
                "--warmup", "3", "--budget", str(a.budget), "--min-iters", "5",
                "--max-iters", "1000"]

    def command(self, system: str) -> list[str]:
        workers = REPO / "bench" / "workers"
        pythonpath = f"{REPO}:{workers}"
        launch = [PYTHON, "-m", "fastcoll.launch", "--ssh", f"ssh -F {self.bed.ssh_config}",
                  "--hostfile", self.hostfile, "--env", f"PYTHONPATH={pythonpath}",
                  "--grace", "1", "--timeout", str(self.args.job_timeout)]
        if system.startswith("fastcoll-"):
            transport, _, variant = system.split("-", 1)[1].partition("/")
            native = "0" if variant == "py" else "1"
            return [*launch, "--env", f"FASTCOLL_TRANSPORT={transport}", "--env", f"FASTCOLL_NATIVE={native}",
                    "--env", "FASTCOLL_TIMEOUT=120", PYTHON, str(workers / "fastcoll_worker.py"),
                    *self.worker_args()]
        if system == "gloo":
            self.port += 1
            inner = (f"RANK=$FASTCOLL_RANK WORLD_SIZE=$FASTCOLL_WORLD_SIZE exec {PYTHON} "
                     f"{workers / 'gloo_worker.py'} {' '.join(self.worker_args())}")
            return [*launch, "--env", f"MASTER_ADDR={self.hosts[0].data[0]}", "--env",
                    f"MASTER_PORT={self.port}", "--env", "GLOO_SOCKET_IFNAME=d0",
                    "/bin/sh", "-c", inner]
        if system == "mlx-ring":
            self.port += 10
            return [os.path.join(os.path.dirname(PYTHON), "mlx.launch"), "--backend", "ring",
                    "--hostfile", str(self.mlx_hostfile), "--starting-port", str(self.port),
                    "--python", PYTHON, "--cwd", str(REPO), "--env",
                    f"PYTHONPATH={pythonpath}", "--", str(workers / "mlx_worker.py"),
                    *self.worker_args()]
        if system == "mpi":
            mpiexec = os.path.join(os.path.dirname(PYTHON), "mpiexec")
            return [mpiexec, "-launcher", "ssh", "-hosts",
                    ",".join(h.name for h in self.hosts), "-n", str(len(self.hosts)), "-ppn", "1",
                    "-localhost", netns.CTL_ADDR,
                    "-genv", "PYTHONPATH", pythonpath, "-genv", "MPIR_CVAR_CH4_NETMOD", "ofi",
                    "-genv", "FI_PROVIDER", "tcp", "-genv", "FI_TCP_IFACE", "d0",
                    "-wdir", str(REPO), PYTHON, str(workers / "mpi_worker.py"),
                    *self.worker_args()]
        raise ValueError(system)

    def run(self, system: str) -> dict:
        argv = self.bed.in_ctl(self.command(system))
        env = self.bed.launcher_env(PATH=self.path)
        t = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env,
                                  timeout=self.args.job_timeout + 30, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            self.bed.kill_strays()
            return {"error": f"no result within {self.args.job_timeout + 30} s",
                    "stderr": str(e.stderr)[-2000:]}
        finally:
            self.bed.kill_strays()
        for line in reversed(done.stdout.splitlines()):
            at = line.find('{"system"')
            if at >= 0:
                doc = json.loads(line[at:])
                doc["wall_s"] = time.monotonic() - t
                return doc
        return {"error": f"exit {done.returncode}, no JSON",
                "stderr": (done.stderr + done.stdout)[-3000:]}


def _which(tool: str) -> str:
    import shutil

    found = shutil.which(tool)
    if not found:
        raise SystemExit(f"{tool} not found")
    return found


def bench(args: argparse.Namespace) -> int:
    bed = netns.TestBed(hosts=args.hosts, data_links=1).build()
    results: dict = {"machine": _machine(), "command": " ".join(sys.argv), "sizes": args.sizes, "hosts": args.hosts,
                     "versions": _versions(), "load_start": os.getloadavg(),
                     "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "links": {}}
    try:
        b = Bench(bed, args)
        for link in args.links:
            bed.heal()
            if link != "unshaped":
                bed.shape(link)
            samples: dict[str, dict[int, list[float]]] = {s: {} for s in args.systems}
            errors: dict[str, list[str]] = {s: [] for s in args.systems}
            for rnd in range(args.rounds):
                order = args.systems[rnd % len(args.systems):] + args.systems[:rnd % len(args.systems)]
                for system in order:
                    doc = b.run(system)
                    if "error" in doc:
                        errors[system].append(doc["error"] + ": " + doc.get("stderr", "")[-600:])
                        print(f"[{link} round {rnd}] {system}: {doc['error']}\n"
                              f"{doc.get('stderr', '')[-1500:]}", flush=True)
                        continue
                    for p in doc["points"]:
                        if p.get("status") == "ok":
                            samples[system].setdefault(p["size"], []).extend(p["times"])
                        else:
                            errors[system].append(f"{p['size']}: {p.get('status')} "
                                                  f"{p.get('reason', '')}")
                    print(f"[{link} round {rnd}] {system}: {len(doc['points'])} points in "
                          f"{doc['wall_s']:.1f} s", flush=True)
            results["links"][link] = {
                s: {"points": {str(n): summarize(v) | {"samples": len(v)}
                               for n, v in sorted(samples[s].items())},
                    "errors": errors[s]}
                for s in args.systems}
    finally:
        bed.teardown()
    results["load_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = report(results)
    (out / "results.md").write_text(text)
    print(text)
    return 0


def report(results: dict) -> str:
    load = [f"{x:.2f}" for x in results.get("load_start", ())]
    load_end = [f"{x:.2f}" for x in results.get("load_end", ())]
    lines = [f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
             f"When: {results.get('when')}; load average at start {', '.join(load)}, at end "
             f"{', '.join(load_end)}  ",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()),
             ""]
    hosts = results.get("hosts", 2)
    for link, by_system in results["links"].items():
        systems = list(by_system)
        lines.append(f"**all_reduce, {hosts} hosts, link {link}**: median time (bus bandwidth, "
                     "GB/s); fastcoll's time against MPICH's in brackets after it")
        lines.append("")
        lines.append("| size | " + " | ".join(systems) + " |")
        lines.append("| --- |" + " --- |" * len(systems))
        for n in results["sizes"]:
            cells = []
            for s in systems:
                p = by_system[s]["points"].get(str(n))
                if p is None:
                    cells.append("-")
                    continue
                t = p["median_s"]
                shown = f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"
                cell = f"{shown} ({busbw('all_reduce', hosts, n, t) / 1e9:.3f})"
                mpi = by_system.get("mpi", {}).get("points", {}).get(str(n))
                if s.startswith("fastcoll") and mpi:
                    cell += f" [{t / mpi['median_s']:.2f}x MPICH]"
                cells.append(cell)
            lines.append(f"| {_size(n)} | " + " | ".join(cells) + " |")
        lines.append("")
        for s in systems:
            for e in by_system[s]["errors"][:2]:
                lines.append(f"- {s}: {e.splitlines()[0][:300] if e else ''}")
        lines.append("")
    return "\n".join(lines)


def outage(args: argparse.Namespace) -> int:
    bed = netns.TestBed(hosts=2, data_links=1).build()
    rows = []
    try:
        hostfile = bed.hostfile((1, 2))
        for seconds in args.seconds:
            for trial in range(args.trials):
                out = bed.root / f"stall-{seconds}-{trial}.json"
                run = bed.start_launcher(
                    ["--hostfile", hostfile, "--env", f"PYTHONPATH={REPO}", "--timeout", "120",
                     PYTHON, str(HERE / "workers" / "stall_worker.py"), str(out),
                     str(seconds + args.after + 2.0)],
                    env=bed.launcher_env(FASTCOLL_TIMEOUT="60"), cwd=str(REPO))
                if not run.wait_for("ready", 2, timeout=30):
                    raise SystemExit(f"job did not start:\n{run.out}\n{run.err}")
                time.sleep(1.0)
                t_cut = time.time()
                if args.fault == "drop":
                    bed.blackhole(1)
                    bed.blackhole(2)
                else:
                    bed.cut(2)
                time.sleep(seconds)
                bed.heal()
                t_heal = time.time()
                code = run.wait(seconds + args.after + 60)
                doc = json.loads(out.read_text()) if out.exists() else {}
                if not doc:
                    raise SystemExit(f"no result (exit {code}):\n{run.out[-2000:]}\n"
                                     f"{run.err[-3000:]}")
                stall = doc.get("longest_s")
                at = doc.get("longest_at", t_cut) - t_cut
                rows.append({"fault": args.fault, "outage_s": seconds, "trial": trial, "stall_s": stall,
                             "started_after_cut_s": at, "exit": code,
                             "healed_after_s": t_heal - t_cut})
                print(f"outage {seconds} s (trial {trial}): longest all_reduce {stall:.2f} s, "
                      f"began {at:+.2f} s after the cut; exit {code}", flush=True)
                bed.kill_strays()
    finally:
        bed.teardown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": _machine(), "command": " ".join(sys.argv), "rows": rows}
    (out / "outage.json").write_text(json.dumps(doc, indent=1))
    print("\n| outage T | longest all_reduce (stall), each trial | stall / T |")
    print("| --- | --- | --- |")
    for seconds in args.seconds:
        got = [r["stall_s"] for r in rows if r["outage_s"] == seconds and r["stall_s"]]
        print(f"| {seconds:g} s | {', '.join(f'{s:.2f} s' for s in got)} | "
              f"{max(got) / seconds:.2f} |")
    return 0


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("mlx", "torch", "mpich", "mpi4py", "pyzmq"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    try:
        out["fastcoll commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        out["fastcoll commit"] = "?"
    return out


def _machine() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{platform.system()} {platform.release()}, {os.cpu_count()} cores ({cpu}), "
            f"Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bench", help="fastcoll beside its peers across 2 simulated hosts")
    b.add_argument("--systems", default=",".join(SYSTEMS))
    b.add_argument("--hosts", type=int, default=2, choices=(2, 4), help="hosts, one rank each")
    b.add_argument("--sizes", default=",".join(map(str, SIZES)))
    b.add_argument("--links", default="unshaped,1gbit",
                   help="unshaped, or a tbf rate (1gbit, 100mbit, ...)")
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--budget", type=float, default=0.25, help="seconds per point and round")
    b.add_argument("--job-timeout", type=float, default=240)
    b.add_argument("--out", default=str(HERE / "out" / "multihost"))
    o = sub.add_parser("outage", help="the stall a data-link outage of T seconds costs")
    o.add_argument("--seconds", default="1,2,3,5,8")
    o.add_argument("--trials", type=int, default=2)
    o.add_argument("--fault", choices=("drop", "cut"), default="drop",
                   help="drop: the switch loses every packet between the hosts, both ways, "
                   "links up (a failing switch, a radio dropout); cut: host2's cable pulled at the switch "
                   "(host2 sees no carrier and holds its packets until it is back)")
    o.add_argument("--after", type=float, default=3.0, help="seconds the job runs after healing")
    o.add_argument("--out", default=str(HERE / "out" / "multihost"))
    args = p.parse_args(argv)
    if args.what == "bench":
        args.systems = [s for s in args.systems.split(",") if s]
        args.sizes = [int(s) for s in args.sizes.split(",") if s]
        args.links = [s for s in args.links.split(",") if s]
        return bench(args)
    args.seconds = [float(s) for s in args.seconds.split(",") if s]
    return outage(args)


if __name__ == "__main__":
    sys.exit(main())
