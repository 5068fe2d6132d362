"""The cross-host set on a bed of bench/multihost.py, written as one record: for each host count a
bed; for each link, a probe (`netbed.Bed.probe_link`), the collectives (through multihost.Hosts, every
op in each job) and, where asked, mlx-lm decode (`decode`) and the GPU's gate across hosts
(`gate_hosts`). Decode's `floor` is the tensor-parallel split started as `ring` with its all-reduces
left out, so that ring's time less the floor's is what its all-reduces cost a token.
docs/multihost.md has the command, the beds, the links and what it writes.
Parts that would start after `--deadline` seconds are skipped and listed, so that a lent machine's
time limit cuts the parts that run last (the gate's, then decode) first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import netbed  # noqa: E402
from bench import decode_bench, gate_bench, h200, harness, metrics, report  # noqa: E402
from bench import multihost  # noqa: E402
from bench.multihost import PYTHON, REPO, Hosts  # noqa: E402

GATE, DECODE = REPO / "bench" / "gate_bench.py", REPO / "bench" / "decode_bench.py"


def collectives(bed: netbed.Bed, n: int, link: str, a: argparse.Namespace) -> list[dict]:
    """Every system's job on this link, rounds interleaved; its report, the run as `collectives`' one row."""
    hosts = Hosts(bed, n)
    config = harness.Config(systems=a.systems, ops=a.ops, worlds=[n], sizes=a.sizes, rounds=a.rounds,
                            budget_s=a.budget, settle_s=a.settle, max_iters=1000, timeout_s=a.job_timeout)
    doc = report.assemble(harness.run(config, hosts.launch, lambda m: print(f"[{n} hosts, {link}] {m}", flush=True)))
    doc["meta"] |= {"link": link, "bed": bed.describe()}
    report.write(doc, Path(a.out) / f"collectives-{n}hosts-{link}", plots=True)
    return [{"hosts": n, "link": link, "doc": doc}]


def floor_ms(link: str, mode: str, layers: int) -> float:
    """The link's floor for one token: a round trip for each all-reduce (tp: two a layer)."""
    delay_us = netbed.parse_link(link)[0]
    return 2 * layers * 2 * delay_us / 1e3 if delay_us and mode == "tp" else 0.0


def decode_run(hosts: Hosts, system: str, args: list[str], timeout: float) -> dict:
    """One job (`single`: one process on host 1); its RESULT document, or {"error": ...}."""
    single = system == "single"
    cmd = [PYTHON, str(decode_bench.WORKER), *args] if single else hosts.decode_command(system, args, timeout)
    got = hosts.run(cmd, timeout, "ms_per_token", host=int(single), **multihost.THREADS)
    return got.doc if got.doc is not None else {"error": got.error}


def decode_combos(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(shape, mode) to run: tp in every shape, pp (one pipeline run each way) in the first."""
    shapes, modes = a.decode_shapes, a.decode_modes
    return [(shape, "tp") for shape in shapes if "tp" in modes] + [(shapes[0], "pp")] * ("pp" in modes)


def decode(bed: netbed.Bed, n: int, link: str, a: argparse.Namespace) -> list[dict]:
    """mlx-lm decoding, one rank a host running workers/tp_worker.py: every shape and mode on this link
    of a bed of n hosts, `--decode-rounds` rounds, the systems alternating each round beside one
    process (`single`); docs/multihost.md tells what each system, shape and link is."""
    hosts, rows = Hosts(bed, n), []
    a.decode_trace = a.decode_trace and str(Path(a.decode_trace).resolve())  # the ranks' cwd is not ours
    _ = a.decode_trace and Path(a.decode_trace).mkdir(parents=True, exist_ok=True)
    for shape, mode in decode_combos(a):
        model = decode_bench.SHAPES[shape].split()
        args = ["--mode", mode, "--tokens", str(a.decode_tokens), "--repeat", str(a.decode_repeat), *model]
        single = ["--mode", "single", *args[2:]] + (["--model", "qwen2"] if mode == "pp" else [])
        hosts.trace = a.decode_trace and f"{a.decode_trace}/{n}hosts-{link}-{shape}-{mode}"  # the last round's stays
        systems = [s for s in a.decode_systems if s != "floor" or mode == "tp"]  # a pipeline has no floor without its sends
        for r in range(a.decode_rounds):
            order = ["single", *(systems if r % 2 == 0 else systems[::-1])]
            for system in order:
                doc = decode_run(hosts, system, single if system == "single" else args, a.job_timeout)
                rows.append({**doc, "hosts": len(hosts.hosts), "link": link, "shape": shape, "mode": mode,
                             "system": system, "round": r, "floor_ms": floor_ms(link, mode, int(model[3]))})
                Path(a.out).mkdir(parents=True, exist_ok=True)
                with open(Path(a.out) / "decode-rows.jsonl", "a") as f:  # kept if a time limit cuts the part
                    f.write(json.dumps(rows[-1]) + "\n")
                said = doc.get("error") or f"{doc['ms_per_token']:.2f} ms/token"
                print(f"[{len(hosts.hosts)} hosts, {link}, {shape}, {mode}, round {r}] {system}: {said}",
                      flush=True)
    return rows


def decode_table(rows: list[dict]) -> str:
    """One line per configuration and system: ms/token, tokens/s, against ring, the same tokens."""
    head = ["hosts", "link", "shape", "mode", "system", "ms/token (median)", "tokens/s", "ring / system",
            "tokens = single", "link floor, ms/token", "all-reduces' share of ring's token"]
    out = []
    for key in sorted({(r["hosts"], r["link"], r["shape"], r["mode"]) for r in rows}):
        mine = [r for r in rows if (r["hosts"], r["link"], r["shape"], r["mode"]) == key]
        runs = {s: [r for r in mine if r["system"] == s] for s in dict.fromkeys(r["system"] for r in mine)}
        ms = {s: statistics.median(r["ms_per_token"] for r in got if "ms_per_token" in r)
              for s, got in runs.items() if any("ms_per_token" in r for r in got)}
        want = next((r["tokens"] for r in runs.get("single", []) if "tokens" in r), None)
        for s, got in runs.items():
            ok = [r for r in got if "tokens" in r]
            same = ("wrong by design" if s == "floor" else "n/a" if want is None or not ok
                    else "yes" if all(r["tokens"] == want for r in ok) else "NO")
            ratio = f"{ms['ring'] / ms[s]:.2f}x" if s in ms and "ring" in ms and s not in ("single", "floor") else ""
            share = f"{(ms['ring'] - ms['floor']) / ms['ring']:.2f}" if s == "ring" and "floor" in ms else ""
            value = f"{ms[s]:.2f}" if s in ms else "failed"
            tps = f"{1e3 / ms[s]:.1f}" if s in ms else ""
            floor = f"{mine[0]['floor_ms']:.2f}" if mine[0]["floor_ms"] else ""
            out.append([*map(str, key), s, value, tps, ratio, same, floor, share])
    return "\n".join(report.md_table(head, out))


def gate_hosts(bed: netbed.Bed, n: int, link: str, a: argparse.Namespace) -> list[dict]:
    """The gate across n hosts, a rank a host on the one GPU (CUDA MPS): gate_bench's chain (host path,
    host mode, --gate-exact gates checked) and decode_bench's decode in host mode through the launcher,
    beside the same scripts on host 1 alone, as h200.py runs them (once a call)."""
    h200.mps(True, h200.gpu_name())  # the MPS daemon once, outside the namespaces, as h200.py starts it
    hosts, out, env, rows = Hosts(bed, n), Path(a.out) / f"gate-{n}hosts", h200.MPS | {"FASTCOLL_TIMEOUT": "120"}, []
    more = ["--rows", f"{gate_bench.ROW}:bfloat16", "--tokens", "20", "--exact", str(a.gate_exact)]
    decode = argparse.Namespace(shape=a.gate_shape, tokens=a.decode_tokens, repeat=a.decode_repeat)
    read = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else {}
    if not out.exists():
        hosts.run([PYTHON, str(GATE), "ranks", "--world", str(n), "--gpus", ",".join("0" * n), "--out", str(out),
                   *more], 5 * a.job_timeout, None, host=1)
        hosts.run([PYTHON, str(DECODE), "--shape", a.gate_shape, "--runs", "single,gate_host_mode", "--world", str(n),
                   "--tokens", str(a.decode_tokens), "--repeat", str(a.decode_repeat), "--out", str(out)],
                  5 * a.job_timeout, None, host=1)
        rows = [{"hosts": 1, "part": "chain", "run": run, "ranks": read(f"gate_ranks_{run}.json") or []}
                for run in gate_bench.RUNS]
        rows += [{"hosts": 1, "part": "decode", "run": run, **doc} for run, doc in read(f"decode_{a.gate_shape}.json").items()]
    for run in ("host", "gatehost"):
        got = hosts.run([*hosts.fastcoll_launch(a.job_timeout, env | gate_bench.RUNS[run]), PYTHON, str(GATE),
                         "ranks", "--rank-of", run, *more], a.job_timeout, "gate_run")
        ranks = sorted(harness.documents(got.output, "gate_run"), key=lambda d: d["rank"])
        rows.append({"hosts": n, "part": "chain", "run": run, "ranks": ranks, "error": got.error})
    launch = hosts.fastcoll_launch(3 * a.job_timeout, env | decode_bench.RUNS["gate_host_mode"])  # an 8B model to build
    got = hosts.run(decode_bench.command("gate_host_mode", decode, launch), 3 * a.job_timeout, "ms_per_token")
    rows.append({"hosts": n, "part": "decode", "run": "gate_host_mode", **(got.doc or {"error": got.error})})
    single = read(f"decode_{a.gate_shape}.json").get("single", {}).get("tokens")
    return [r | {"link": link if r["hosts"] > 1 else "one host", "problem": _problem(r, single)} for r in rows]


def _problem(row: dict, single: list[int] | None) -> str | None:
    """What fails a row of the gate part: an error or a missing result (a chain: a document from every
    rank), shared memory between hosts, a wrong gate, tokens other than one process's."""
    ranks = row.get("ranks") or []
    done = len(ranks) > 1 and all("transport" in d for d in ranks) if row["part"] == "chain" else "ms_per_token" in row
    if row.get("error") or not done:
        return f"failed: {row.get('error') or 'no result'}"
    if row["hosts"] > 1 and any("shared memory" in (d.get("transport") or "") for d in [row, *ranks]):
        return "shared memory between hosts"
    if any(d.get("exact") and (d["exact"]["wrong"] or d["exact"]["error"]) for d in ranks):
        return "wrong gates"
    return "tokens other than one process's" if row["part"] == "decode" and row.get("tokens") != single else None


def gate_table(rows: list[dict], a: argparse.Namespace) -> str:
    """The gate part through gate_bench's and decode_bench's own tables, a run a host count and link;
    then each row's transport (rank 0) and whether it passed."""
    name = lambda r: r["run"] if r["run"] == "single" else f"{r['run']}, " + (
        f"{r['hosts']} hosts, {r['link']}" if r["hosts"] > 1 else "one host")
    chains = {name(r): r["ranks"] for r in rows if r["part"] == "chain"}
    decode = argparse.Namespace(shape=a.gate_shape, tokens=a.decode_tokens, repeat=a.decode_repeat)
    checks = [f"- {name(r)}, {r['part']}: {r.get('transport') or (r.get('ranks') or [{}])[0].get('transport')}; "
              f"{r['problem'] or 'ok'}" for r in rows]
    return "\n".join([*gate_bench.table(chains, [f"bfloat16_{gate_bench.ROW}"]), "",
                      *decode_bench.report({name(r): r for r in rows if r["part"] == "decode"}, decode), "", *checks])


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
    rows = []
    for run in runs:
        pts = run["doc"]["points"]
        for op, size in _groups(run):
            cells = [_cell(pts, s, op, size) for s in systems]
            shown = [f"{_us(c['median_s'])} ({c['busbw_GBps']:.3f}){'*' if c.get('emulated') else ''}" if c
                     else "failed" for c in cells]
            mine = _cell(pts, fast, op, size) if fast else None
            ratio = [f"{c['median_s'] / mine['median_s']:.2f}x" if c and mine else "" for s, c in zip(systems, cells)
                     if s != fast]
            rows.append([str(run["hosts"]), run["link"], op, str(size), *shown, *ratio])
    return "\n".join(report.md_table(head, rows))


def _save(a: argparse.Namespace, doc: dict) -> None:
    report.save(Path(a.out), "results", doc)
    report.save(Path(a.out), "summary", summary(doc["collectives"], a.systems) + "\n\n"
                + (decode_table(doc["decode"]) if doc["decode"] else "") + "\n\n"
                + (gate_table(doc["gate"], a) if doc["gate"] else "") + "\n")


def _part(a: argparse.Namespace, doc: dict, t0: float, name: str, fn):
    """fn() unless the deadline passed (then the part is listed as skipped); saved after each."""
    if time.monotonic() - t0 > a.deadline:
        doc["skipped"].append(name)
        print(f"skipped (deadline): {name}", flush=True)
        return None
    return fn()


def _on_bed(a: argparse.Namespace, doc: dict, t0: float, n: int, links: list[str], what: str, fn) -> None:
    """Build a bed of n hosts; for each link, probe it (once a run) and run fn(bed, n, link, a)."""
    with netbed.Bed(n) as bed:
        doc["beds"].append(bed.describe())
        for link in links:
            bed.set_link(*netbed.parse_link(link))
            if not any(x["hosts"] == n and x["link"] == link for x in doc["links"]):
                probe = _part(a, doc, t0, f"probe {n} hosts {link}", bed.probe_link)
                if probe is not None:
                    doc["links"].append({"hosts": n, "link": link, **probe})
                    print(f"[{n} hosts, {link}] link: {json.dumps(probe)}", flush=True)
            doc[what] += _part(a, doc, t0, f"{what} {n} hosts {link}", lambda: fn(bed, n, link, a)) or []
            _save(a, doc)


def run_all(a: argparse.Namespace) -> dict:
    """The collectives on every host count first, then decode, then the gate: a deadline cuts the gate first."""
    t0 = time.monotonic()
    doc = {"machine": harness.machine_info(), "command": " ".join(sys.argv), "tbf": netbed.kernel_has_tbf(),
           "beds": [], "links": [], "collectives": [], "decode": [], "gate": [], "skipped": []}
    for n in a.hosts:
        _on_bed(a, doc, t0, n, a.links, "collectives", collectives)
    for n in a.decode_hosts:
        _on_bed(a, doc, t0, n, a.decode_links, "decode", decode)
    for n in a.gate_hosts:
        _on_bed(a, doc, t0, n, a.gate_links, "gate", gate_hosts)
    _save(a, doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints, names = lambda text: metrics.csv(text, int), metrics.csv
    p.add_argument("--out", required=True)
    p.add_argument("--hosts", default="2,4", type=ints, help="host counts for the collectives ('': none)")
    p.add_argument("--links", default="unshaped,1gbit+50us", type=names)
    p.add_argument("--systems", default="fastcoll-tcp,mlx-ring,mpi", type=names)
    p.add_argument("--ops", default="all_reduce,all_gather,broadcast", type=names)
    p.add_argument("--sizes", default="4,4096,67108864", type=ints)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.25, help="seconds per point and round")
    p.add_argument("--settle", type=float, default=harness.Config.settle_s)
    p.add_argument("--job-timeout", type=float, default=120)
    p.add_argument("--decode-hosts", default="", type=ints, help="host counts for mlx-lm decode (none by default)")
    p.add_argument("--decode-links", default="unshaped,1gbit+50us", type=names)
    p.add_argument("--decode-shapes", default="small", type=names, help=", ".join(decode_bench.SHAPES))
    p.add_argument("--decode-modes", default="tp", type=names,
                   help="tp (model.shard) in every shape, pp (model.model.pipeline) in the first shape")
    p.add_argument("--decode-systems", default="fastcoll-graph,ring", type=names,
                   help=", ".join(multihost.DECODE_SYSTEMS))
    p.add_argument("--decode-rounds", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens a run generates")
    p.add_argument("--decode-trace", help="where decode's fastcoll jobs write FASTCOLL_TRACE (each configuration's last round)")
    p.add_argument("--decode-repeat", type=int, default=2, help="runs a job makes; its median is its figure")
    p.add_argument("--gate-hosts", default="", type=ints,
                   help="host counts for the GPU's gate across hosts (none by default)")
    p.add_argument("--gate-links", default="unshaped,1gbit+50us", type=names)
    p.add_argument("--gate-exact", type=int, default=10048, help="gate_bench's --exact")
    p.add_argument("--gate-shape", default="8b", choices=sorted(decode_bench.SHAPES), help="decode_bench's --shape")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds after which no part starts")
    a = p.parse_args(argv)
    unknown = [s for s in a.decode_shapes if s not in decode_bench.SHAPES]
    unknown += [s for s in a.decode_systems if s.partition("/")[0] not in multihost.DECODE_SYSTEMS]
    if unknown:
        p.error(f"unknown decode shape or system: {', '.join(unknown)}")
    try:
        links = a.links * bool(a.hosts) + a.decode_links * bool(a.decode_hosts) + a.gate_links * bool(a.gate_hosts)
        for link in links:  # a link it cannot read is refused before any bed is built
            netbed.parse_link(link)
        for system in a.systems:  # a system the bed cannot start is refused before any bed is built
            multihost.bed_system(system)
    except ValueError as e:
        p.error(str(e))
    doc = run_all(a)
    print(summary(doc["collectives"], a.systems))
    if doc["decode"]:
        print(decode_table(doc["decode"]))
    if doc["gate"]:
        print(gate_table(doc["gate"], a))
    return 0 if not doc["skipped"] and not any(r["problem"] for r in doc["gate"]) else 3


if __name__ == "__main__":
    sys.exit(main())
