"""Tensor-parallel (and pipeline-parallel) decoding across the bed's hosts: fastcoll beside MLX's
ring backend, tokens per second and the tokens themselves (docs/multihost.md tells what each
system, shape and link is).

    python bench/tp_hosts.py [--hosts 2,4] [--links unshaped,1gbit+50us] [--shapes small,large]
                             [--modes tp,pp] [--systems fastcoll,fastcoll-graph,ring] [--out DIR]

One rank a host of `tests/netns.py`'s bed runs `bench/workers/tp_worker.py` (mlx-lm's
`generate_step`, random weights, MLX's CPU backend), the systems alternating each round beside one
process (`single`); `fastcoll-graph` is fastcoll with FASTCOLL_MLX_GRAPH=1 (MLX's graph runs
the collectives); `fastcoll/KEY=VALUE` adds FASTCOLL_TUNING; `floor` is the tensor-parallel
split started as `ring` with its all-reduces left out (`tp_worker.py --no-exchange`), so that
ring's time less the floor's is what its all-reduces cost a token. A link's delay is
bench/netdelay.c (NFQUEUE in user space; this kernel has no netem). Writes OUT/results.json and
OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness  # noqa: E402
from bench.multihost import PYTHON, REPO, Hosts, netns  # noqa: E402

WORKER = REPO / "bench" / "workers" / "tp_worker.py"
SHAPES = {
    "small": ["--hidden", "256", "--layers", "4", "--heads", "8", "--kv-heads", "8", "--intermediate", "688",
              "--vocab", "4096"],
    "smaller": ["--hidden", "128", "--layers", "4", "--heads", "4", "--kv-heads", "4", "--intermediate", "344",
               "--vocab", "1024"],
    "large": ["--hidden", "512", "--layers", "8", "--heads", "8", "--kv-heads", "8", "--intermediate", "1408",
              "--vocab", "8192"],
}
SYSTEMS = ("fastcoll", "fastcoll-graph", "ring", "ring-mlx.launch", "floor")
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # one core a rank, as the ranks share two


def build_netdelay(root: Path) -> Path:
    """bench/netdelay.c, compiled into `root`."""
    exe = root / "netdelay"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(REPO / "bench" / "netdelay.c"), "-lnetfilter_queue"],
                   check=True)
    return exe


def set_link(hosts: Hosts, link: str, delays: list[subprocess.Popen], netdelay: Path) -> None:
    """Every data link as `link` says: unshaped, a rate (1gbit), or a rate and a one-way delay
    (1gbit+50us); what the previous setting added is undone first."""
    bed = hosts.bed
    stop(delays)
    bed.heal()
    rate, _, delay = link.partition("+")
    if rate != "unshaped":
        bed.shape(rate)
    for h in hosts.hosts:
        subprocess.run(["ip", "netns", "exec", h.ns, "iptables-legacy", "-F", "OUTPUT"], check=True)
        if delay:
            subprocess.run(["ip", "netns", "exec", h.ns, "iptables-legacy", "-A", "OUTPUT", "-o", "d0", "-j",
                            "NFQUEUE", "--queue-num", "0", "--queue-bypass"], check=True)
            delays.append(subprocess.Popen(["ip", "netns", "exec", h.ns, str(netdelay),
                                            str(int(delay.removesuffix("us")))]))


def stop(delays: list[subprocess.Popen]) -> None:
    """End the netdelay processes (their iptables rules let packets by without them)."""
    for proc in delays:
        proc.kill()
        proc.wait()
    delays.clear()


def floor_ms(link: str, mode: str, layers: int) -> float:
    """The link's floor for one token: a round trip for each all-reduce (tp: two a layer)."""
    delay = link.partition("+")[2]
    if not delay or mode != "tp":
        return 0.0
    return 2 * layers * 2 * int(delay.removesuffix("us")) / 1e3


def command(hosts: Hosts, system: str, args: list[str], timeout: float) -> list[str]:
    """The launcher's command line for one decode job of `system` across the bed's hosts."""
    env = [f"--env={k}={v}" for k, v in {"PYTHONPATH": hosts.pythonpath, **THREADS}.items()]
    launch = [PYTHON, "-m", "fastcoll.launch", "--ssh", hosts.bed.ssh_command, "--hostfile",
              hosts.hostfile, *env, "--grace", "1", "--timeout", str(timeout)]
    hosts.port += 10
    name, _, knobs = system.partition("/")  # fastcoll/NAME=VALUE/...: with those FASTCOLL_TUNING knobs
    if name in ("fastcoll", "fastcoll-graph"):
        tuning = ["--env", "FASTCOLL_TUNING=" + knobs.replace("/", ",")] if knobs else []
        tuning += ["--env", "FASTCOLL_MLX_GRAPH=1"] if name == "fastcoll-graph" else []
        return [*launch, "--env", "FASTCOLL_TIMEOUT=60", *tuning, PYTHON, "-m", "fastcoll.mlx_compat", str(WORKER),
                *args]
    ring = hosts.bed.root / f"ring-{hosts.port}.json"
    ring.write_text(json.dumps([[f"{h.data[0]}:{hosts.port + i}"] for i, h in enumerate(hosts.hosts)]))
    if system in ("ring", "floor"):
        args = [*args, "--no-exchange"] if system == "floor" else args
        inner = f"MLX_RANK=$FASTCOLL_RANK MLX_HOSTFILE={ring} exec {PYTHON} {WORKER} " + " ".join(args)
        return [*launch, "/bin/sh", "-c", inner]
    if system == "ring-mlx.launch":
        return [hosts.mlx_launch, "--backend", "ring", "--hostfile",
                str(hosts.mlx_hostfile), "--starting-port", str(hosts.port), "--python", PYTHON, "--cwd",
                str(REPO), *env,
                "--", str(WORKER), *args]
    raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def run(hosts: Hosts, system: str, args: list[str], timeout: float) -> dict:
    """One job; its RESULT document, or {"error": ...}."""
    if system == "single":
        cmd = hosts.bed.in_host(1, [PYTHON, str(WORKER), *args])
        env = hosts.bed.launcher_env(**THREADS)
    else:
        cmd = hosts.bed.in_ctl(command(hosts, system, args, timeout))
        env = hosts.bed.launcher_env(PATH=hosts.path, **THREADS)
    try:
        got = harness.run_job([(cmd, env)], timeout + 30, key="ms_per_token")
    finally:
        hosts.bed.kill_strays()
    return got.doc if got.doc is not None else {"error": got.error}


def combos(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(shape, mode) to run: tp in every shape, pp (one pipeline run each way) in the first."""
    return [(shape, "tp") for shape in a.shapes if "tp" in a.modes] + [(a.shapes[0], "pp")] * ("pp" in a.modes)


def measure(hosts: Hosts, a: argparse.Namespace, link: str) -> list[dict]:
    """Every shape and mode on this link, `a.rounds` rounds, the systems alternating."""
    rows = []
    for shape, mode in combos(a):
        args = ["--mode", mode, "--tokens", str(a.tokens), "--repeat", str(a.repeat), *SHAPES[shape]]
        single = ["--mode", "single", *args[2:]] + (["--model", "qwen2"] if mode == "pp" else [])
        systems = [s for s in a.systems if s != "floor" or mode == "tp"]  # a pipeline has no floor without its sends
        for r in range(a.rounds):
            order = ["single", *(systems if r % 2 == 0 else systems[::-1])]
            for system in order:
                doc = run(hosts, system, single if system == "single" else args, a.job_timeout)
                rows.append({**doc, "hosts": len(hosts.hosts), "link": link, "shape": shape, "mode": mode,
                             "system": system, "round": r, "floor_ms": floor_ms(link, mode, int(SHAPES[shape][3]))})
                said = doc.get("error") or f"{doc['ms_per_token']:.2f} ms/token"
                print(f"[{len(hosts.hosts)} hosts, {link}, {shape}, {mode}, round {r}] {system}: {said}",
                      flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """One line per configuration and system: ms/token, tokens/s, against ring, the same tokens."""
    out = ["| hosts | link | shape | mode | system | ms/token (median) | tokens/s | ring / system | "
           "tokens = single | link floor, ms/token | all-reduces' share of ring's token |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keys = sorted({(r["hosts"], r["link"], r["shape"], r["mode"]) for r in rows})
    for key in keys:
        mine = [r for r in rows if (r["hosts"], r["link"], r["shape"], r["mode"]) == key]
        ms = {s: statistics.median(r["ms_per_token"] for r in mine if r["system"] == s and "ms_per_token" in r)
              for s in dict.fromkeys(r["system"] for r in mine)
              if any(r["system"] == s and "ms_per_token" in r for r in mine)}
        want = next((r["tokens"] for r in mine if r["system"] == "single" and "tokens" in r), None)
        for s in dict.fromkeys(r["system"] for r in mine):
            ok = [r for r in mine if r["system"] == s and "tokens" in r]
            same = ("wrong by design" if s == "floor" else "n/a" if want is None or not ok
                    else "yes" if all(r["tokens"] == want for r in ok) else "NO")
            ratio = f"{ms['ring'] / ms[s]:.2f}x" if s in ms and "ring" in ms and s not in ("single", "floor") else ""
            share = f"{(ms['ring'] - ms['floor']) / ms['ring']:.2f}" if s == "ring" and "floor" in ms else ""
            value = f"{ms[s]:.2f}" if s in ms else "failed"
            tps = f"{1e3 / ms[s]:.1f}" if s in ms else ""
            floor = f"{mine[0]['floor_ms']:.2f}" if mine[0]["floor_ms"] else ""
            out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {s} | {value} | {tps} | {ratio} | {same} "
                       f"| {floor} | {share} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="2,4", help="hosts (one rank each): 2, 4 or both")
    p.add_argument("--links", default="unshaped,1gbit+50us,1gbit+200us",
                   help="unshaped, a tbf rate (1gbit), or a rate and a one-way delay (1gbit+50us)")
    p.add_argument("--shapes", default="small,large", help=", ".join(SHAPES))
    p.add_argument("--modes", default="tp,pp",
                   help="tp (model.shard) in every shape, pp (model.model.pipeline) in the first shape")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="tokens a run generates")
    p.add_argument("--repeat", type=int, default=3, help="runs a job makes; its median is its figure")
    p.add_argument("--job-timeout", type=float, default=300)
    p.add_argument("--out", default=str(REPO / "bench" / "out" / "tp_hosts"))
    a = p.parse_args(argv)
    csv = lambda text: [s for s in text.split(",") if s]
    a.links, a.shapes, a.modes, a.systems = csv(a.links), csv(a.shapes), csv(a.modes), csv(a.systems)
    unknown = [s for s in a.shapes if s not in SHAPES] + [s for s in a.systems if s.partition("/")[0] not in SYSTEMS]
    if unknown:
        p.error(f"unknown shape or system: {', '.join(unknown)}")
    rows: list[dict] = []
    for n in [int(h) for h in csv(a.hosts)]:
        bed = netns.TestBed(hosts=n, data_links=1).build()
        delays: list[subprocess.Popen] = []
        try:
            hosts, netdelay = Hosts(bed, n), build_netdelay(bed.root)
            for link in a.links:
                set_link(hosts, link, delays, netdelay)
                rows += measure(hosts, a, link)
        finally:
            stop(delays)
            bed.teardown()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": harness.machine_info(), "command": " ".join(sys.argv), "rows": rows}
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    text = table(rows)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0 if all("ms_per_token" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
