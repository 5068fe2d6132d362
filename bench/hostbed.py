"""The cross-host set on the bed whose hosts have cores of their own (`tests/netbed.py`: the lent
GPU machine's 16 CPUs, 4 a host at 2 hosts, 3 at 4), written as one record.

    python bench/hostbed.py --out bench/records/DATE-WHAT [--hosts 2,4] [--links unshaped,1gbit+50us]
        [--systems fastcoll-tcp,mlx-ring,mpi] [--ops all_reduce,all_gather,broadcast]
        [--sizes 4,4096,67108864] [--rounds 3]
        [--decode-hosts 2] [--decode-links unshaped,1gbit+50us] [--decode-systems fastcoll-graph,ring]
        [--deadline SECONDS]

For each host count: build the bed; for each link (`unshaped`: veths into a bridge; `RATE+DELAY`,
e.g. `1gbit+50us` or `0+50us` for a delay alone: bench/bedlink.c) probe it (bench/linkprobe.py:
round trips and one stream, host1 -> host2, and bedlink's lateness), then run the collectives
(`--ops`, every op in each job) through `bench/multihost.Hosts` (each system started as across
real hosts) and, where asked, mlx-lm decode through `bench/tp_hosts.measure`. Writes
OUT/results.json (everything), OUT/summary.md, OUT/plot.svg, and each collectives run's report
in OUT/collectives-<N>hosts-<link>/. Parts that would start after `--deadline` seconds are
skipped and listed as such.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import netbed  # noqa: E402
from bench import harness, report, tp_hosts  # noqa: E402
from bench.multihost import PYTHON, REPO, Hosts  # noqa: E402

PROBE = REPO / "bench" / "linkprobe.py"
UNITS = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3}


def parse_link(text: str) -> tuple[float | None, int | None]:
    """(one-way delay in us, rate in bit/s) of `unshaped`, `1gbit+50us`, `0+200us` or `1gbit`."""
    if text == "unshaped":
        return None, None
    rate, _, delay = text.partition("+")
    bps = 0
    if rate not in ("", "0"):
        unit = next((u for u in UNITS if rate.endswith(u)), None)
        if unit is None:
            raise ValueError(f"link {text!r}: the rate must end in gbit, mbit or kbit (or be 0)")
        bps = int(float(rate.removesuffix(unit)) * UNITS[unit])
    if delay and not delay.endswith("us"):
        raise ValueError(f"link {text!r}: the delay must end in us")
    return float(delay.removesuffix("us") or 0), bps


def probe_link(bed: netbed.Bed) -> dict:
    """host1 -> host2 over d0: round trips, one stream, and bedlink's lateness meanwhile."""
    port = 47000
    server = subprocess.Popen(bed.in_host(2, [PYTHON, str(PROBE), "serve", str(port), "60"]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        server.stdout.readline()  # "listening"
        bed.relay_stats()  # bedlink counts lateness from here
        done = subprocess.run(bed.in_host(1, [PYTHON, str(PROBE), "probe", bed.host(2).data[0], str(port), "500",
                                              "64"]), capture_output=True, text=True, timeout=120)
        got = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}
        got["bedlink"] = bed.relay_stats()
        return got
    finally:
        server.kill()
        server.wait()
        bed.kill_strays()


def collectives(bed: netbed.Bed, n: int, link: str, a: argparse.Namespace) -> dict:
    hosts = Hosts(bed, n)
    config = harness.Config(systems=a.systems, ops=a.ops, worlds=[n], sizes=a.sizes, rounds=a.rounds,
                            budget_s=a.budget, settle_s=a.settle, max_iters=1000, timeout_s=a.job_timeout)
    doc = report.assemble(harness.run(config, hosts.launch, lambda m: print(f"[{n} hosts, {link}] {m}", flush=True)))
    doc["meta"] |= {"link": link, "bed": bed.describe()}
    report.write(doc, Path(a.out) / f"collectives-{n}hosts-{link}", plots=True)
    return doc


def decode(bed: netbed.Bed, n: int, link: str, a: argparse.Namespace) -> list[dict]:
    ns = argparse.Namespace(shapes=a.decode_shapes, modes=a.decode_modes, systems=a.decode_systems,
                            rounds=a.decode_rounds, tokens=a.decode_tokens, repeat=2, job_timeout=a.job_timeout)
    return tp_hosts.measure(Hosts(bed, n), ns, link)


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f} us" if us < 1000 else f"{us / 1000:.2f} ms"


def _cell(points: list[dict], system: str, op: str, size: int) -> dict | None:
    return next((p for p in points if p["system"] == system and p.get("op", "all_reduce") == op
                 and p["size"] == size and p["status"] == "ok"), None)


def _groups(run: dict) -> list[tuple[str, int]]:
    """A run's (op, size) pairs, ops in the order the record's --ops named them, sizes rising."""
    ops = list(dict.fromkeys(p.get("op", "all_reduce") for p in run["doc"]["points"]))
    return [(op, size) for op in ops
            for size in sorted({p["size"] for p in run["doc"]["points"] if p.get("op", "all_reduce") == op})]


def summary(runs: list[dict], systems: list[str]) -> str:
    """One line per (hosts, link, op, size): each system's median time and bus bandwidth (`*`: the
    op emulated, as MLX's broadcast is by all_sum), and fastcoll's time against each peer's."""
    fast = next((s for s in systems if s.startswith("fastcoll")), None)
    head = ["hosts", "link", "op", "size", *[f"{s} median (busbw GB/s)" for s in systems],
            *[f"{s} / {fast}" for s in systems if s != fast]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for run in runs:
        pts = run["doc"]["points"]
        for op, size in _groups(run):
            cells = [_cell(pts, s, op, size) for s in systems]
            shown = [f"{_us(c['median_s'])} ({c['busbw_GBps']:.3f}){'*' if c.get('emulated') else ''}" if c
                     else "failed" for c in cells]
            mine = _cell(pts, fast, op, size) if fast else None
            ratio = [f"{c['median_s'] / mine['median_s']:.2f}x" if c and mine else "" for s, c in zip(systems, cells)
                     if s != fast]
            lines.append(f"| {run['hosts']} | {run['link']} | {op} | {size} | " + " | ".join(shown + ratio) + " |")
    return "\n".join(lines)


def svg(runs: list[dict], systems: list[str]) -> str:
    """Bars of each system's median time (log scale), a group per (hosts, link, op, size)."""
    groups = [(r, op, size) for r in runs for op, size in _groups(r)]
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    bar, gap, top, height = 14, 18, 30, 300
    width = 60 + len(groups) * (len(systems) * bar + gap)
    lo, hi = 1e-6, 10.0  # 1 us .. 10 s
    y = lambda s: top + height * (1 - (math.log10(s) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}" font-size="10" '
           'font-family="sans-serif">', f'<text x="5" y="15">median time (log scale, 1 us to 10 s)</text>']
    for exp in range(-6, 2):
        out.append(f'<line x1="50" x2="{width}" y1="{y(10**exp):.1f}" y2="{y(10**exp):.1f}" stroke="#ddd"/>'
                   f'<text x="2" y="{y(10**exp) + 3:.1f}">1e{exp} s</text>')
    for g, (run, op, size) in enumerate(groups):
        x0 = 60 + g * (len(systems) * bar + gap)
        for k, system in enumerate(systems):
            c = _cell(run["doc"]["points"], system, op, size)
            if c:
                yy = y(max(c["median_s"], lo))
                out.append(f'<rect x="{x0 + k * bar}" y="{yy:.1f}" width="{bar - 2}" height="{top + height - yy:.1f}" '
                           f'fill="{colors[k % len(colors)]}"/>')
        out.append(f'<text x="{x0}" y="{top + height + 12}">{run["hosts"]}h {size}B</text>'
                   f'<text x="{x0}" y="{top + height + 24}">{op.replace("all_", "")}</text>'
                   f'<text x="{x0}" y="{top + height + 36}">{run["link"]}</text>')
    for k, system in enumerate(systems):
        out.append(f'<rect x="{60 + k * 110}" y="{top + height + 52}" width="10" height="10" '
                   f'fill="{colors[k % len(colors)]}"/><text x="{74 + k * 110}" y="{top + height + 61}">{system}</text>')
    return "\n".join(out + ["</svg>"])


def _save(a: argparse.Namespace, doc: dict) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary(doc["collectives"], a.systems) + "\n\n"
                                    + (tp_hosts.table(doc["decode"]) if doc["decode"] else "") + "\n")
    (out / "plot.svg").write_text(svg(doc["collectives"], a.systems))


def _part(a: argparse.Namespace, doc: dict, t0: float, name: str, fn):
    """fn() unless the deadline passed (then the part is listed as skipped); saved after each."""
    if time.monotonic() - t0 > a.deadline:
        doc["skipped"].append(name)
        print(f"skipped (deadline): {name}", flush=True)
        return None
    return fn()


def _on_bed(a: argparse.Namespace, doc: dict, t0: float, n: int, links: list[str], what: str, fn) -> None:
    """Build a bed of n hosts; for each link, probe it (once a run) and run fn(bed, n, link, a)."""
    bed = netbed.Bed(n).build()
    doc["beds"].append(bed.describe())
    try:
        for link in links:
            bed.set_link(*parse_link(link))
            if not any(x["hosts"] == n and x["link"] == link for x in doc["links"]):
                probe = _part(a, doc, t0, f"probe {n} hosts {link}", lambda: probe_link(bed))
                if probe is not None:
                    doc["links"].append({"hosts": n, "link": link, **probe})
                    print(f"[{n} hosts, {link}] link: {json.dumps(probe)}", flush=True)
            got = _part(a, doc, t0, f"{what} {n} hosts {link}", lambda: fn(bed, n, link, a))
            if what == "collectives" and got is not None:
                doc["collectives"].append({"hosts": n, "link": link, "doc": got})
            elif got is not None:
                doc["decode"] += got
            _save(a, doc)
    finally:
        bed.teardown()


def run_all(a: argparse.Namespace) -> dict:
    """The collectives on every host count first, then decode: a deadline cuts decode first."""
    t0 = time.monotonic()
    doc = {"machine": harness.machine_info(), "command": " ".join(sys.argv), "tbf": netbed.kernel_has_tbf(),
           "beds": [], "links": [], "collectives": [], "decode": [], "skipped": []}
    for n in a.hosts:
        _on_bed(a, doc, t0, n, a.links, "collectives", collectives)
    for n in a.decode_hosts:
        _on_bed(a, doc, t0, n, a.decode_links, "decode", decode)
    _save(a, doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--links", default="unshaped,1gbit+50us")
    p.add_argument("--systems", default="fastcoll-tcp,mlx-ring,mpi")
    p.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    p.add_argument("--sizes", default="4,4096,67108864")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.25, help="seconds per point and round")
    p.add_argument("--settle", type=float, default=harness.Config.settle_s)
    p.add_argument("--job-timeout", type=float, default=120)
    p.add_argument("--decode-hosts", default="", help="host counts for mlx-lm decode (none by default)")
    p.add_argument("--decode-links", default="unshaped,1gbit+50us")
    p.add_argument("--decode-shapes", default="small")
    p.add_argument("--decode-modes", default="tp")
    p.add_argument("--decode-systems", default="fastcoll-graph,ring")
    p.add_argument("--decode-rounds", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--deadline", type=float, default=1e9, help="seconds after which no part starts")
    a = p.parse_args(argv)
    csv = lambda text, kind=str: [kind(s) for s in text.split(",") if s]
    a.hosts, a.decode_hosts, a.sizes = csv(a.hosts, int), csv(a.decode_hosts, int), csv(a.sizes, int)
    for name in ("links", "systems", "ops", "decode_links", "decode_shapes", "decode_modes", "decode_systems"):
        setattr(a, name, csv(getattr(a, name)))
    for link in a.links + a.decode_links:
        parse_link(link)
    doc = run_all(a)
    print(summary(doc["collectives"], a.systems))
    if doc["decode"]:
        print(tp_hosts.table(doc["decode"]))
    return 0 if not doc["skipped"] else 3


if __name__ == "__main__":
    sys.exit(main())
