"""Turn pooled benchmark points into ratios, a JSON file, a Markdown report and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from bench import harness
from bench.metrics import format_size

SMALL_MAX = 4096  # "small messages": 4 B to 4 KiB
LARGE = 64 << 20  # the 64 MiB all-reduce
# The targets on localhost: (peer, minimum small-message speedup, minimum 64 MiB all-reduce busbw
# ratio): small messages at least 10x faster than MLX's ring (issue 7) and at most 2x MPICH's
# time (speedup 0.5, issue 24); 64 MiB bus bandwidth 2x MLX ring's and at least MPICH's.
TARGETS = {"mlx-ring": (10.0, 2.0), "mpi": (0.5, 1.0)}


def _index(points: Iterable[dict[str, Any]]) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    return {(p["system"], p["op"], p["world"], p["size"]): p for p in points}


def ratios(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """fastcoll's speedup over each peer at every point both measured correctly: t_peer /
    t_fastcoll (medians), and busbw_fastcoll / busbw_peer (the same number at equal byte counts)."""
    idx = _index(points)
    peers = sorted({p["system"] for p in points if not p["system"].startswith("fastcoll")})
    out = []
    for (system, op, world, size), p in sorted(idx.items()):
        for peer in peers if system.startswith("fastcoll") and p["status"] == "ok" else ():
            q = idx.get((peer, op, world, size))
            if q is None or q["status"] != "ok":
                continue
            rec = {"fastcoll": system, "peer": peer, "op": op, "world": world, "size": size,
                   "speedup": q["median_s"] / p["median_s"],
                   "busbw_ratio": p["busbw_GBps"] / q["busbw_GBps"]}
            if q.get("emulated"):
                rec["peer_emulated"] = q["emulated"]
            out.append(rec)
    return out


def targets(ratio_recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The speed targets (TARGETS) per world size, fastcoll system and peer, with pass/fail (set
    for two ranks; at other world sizes they show whether fastcoll keeps its lead)."""
    out = []
    for world, fast, peer in sorted({(r["world"], r["fastcoll"], r["peer"]) for r in ratio_recs if r["peer"] in TARGETS}):
        small_min, large_min = TARGETS[peer]
        mine = [r for r in ratio_recs if r["fastcoll"] == fast and r["peer"] == peer and r["world"] == world]
        small = [r for r in mine if r["size"] <= SMALL_MAX]
        large = [r for r in mine if r["op"] == "all_reduce" and r["size"] == LARGE]
        rec: dict[str, Any] = {"fastcoll": fast, "peer": peer, "world": world}
        if small:
            worst = min(small, key=lambda r: r["speedup"])
            rec |= {"small_min_speedup": worst["speedup"], "small_worst_at": f"{worst['op']} {format_size(worst['size'])}",
                    "small_target": small_min, "small_pass": worst["speedup"] >= small_min}
        if large:
            rec |= {"large_busbw_ratio": large[0]["busbw_ratio"], "large_target": large_min,
                    "large_pass": large[0]["busbw_ratio"] >= large_min}
        out.append(rec)
    return out


def assemble(raw: dict[str, Any]) -> dict[str, Any]:
    """The results document of harness.run's raw results: metadata, points, ratios, targets,
    failures, versions and jobs."""
    jobs = raw["jobs"]
    points = harness.points_table(jobs)
    ratio_recs = ratios(points)
    versions = {j.system: ", ".join(f"{k} {v}" for k, v in j.doc.get("meta", {}).items())
                for j in reversed(jobs) if j.doc}
    return {"meta": raw["meta"], "skipped": raw["skipped"],
            "failures": [{"system": j.system, "world": j.world, "round": j.round, "error": j.error}
                         for j in jobs if j.error],
            "versions": versions, "points": points, "ratios": ratio_recs, "targets": targets(ratio_recs),
            "jobs": [{"system": j.system, "world": j.world, "round": j.round, "wall_s": round(j.wall_s, 2),
                      "error": j.error, "incomplete": bool(j.doc and j.doc.get("incomplete"))} for j in jobs]}


def save(out: Path, name: str, doc: Any) -> Path:
    """NAME.md of a report's text, else NAME.json of `doc`, in `out`: how every entry point writes."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.{'md' if isinstance(doc, str) else 'json'}"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1, default=str) + "\n")
    return path


def write(doc: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """results.json, results.md and (with matplotlib) latency.png and busbw.png in `out`."""
    written = [save(out, "results", doc), save(out, "results", markdown(doc))]
    if plots:
        try:
            written += plot(doc, out)
        except ImportError:
            print("plots skipped: matplotlib not installed (pip install matplotlib)")
    return written


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 100 else f"{us:,.0f}"


def _cell(p: dict[str, Any] | None, what: str) -> str:
    if p is None:
        return ""
    if p["status"] != "ok":
        return {"n/a": "n/a", "check failed": "WRONG", "error": "error"}.get(p["status"], "?")
    mark = "*" if p.get("emulated") else ""
    if what == "time":
        return f"{_us(p['median_s'])} ({_us(p['p90_s'])}){mark}"
    if what == "cpu":
        return _us(p["cpu_s"]) if "cpu_s" in p else "-"
    return f"{p['busbw_GBps']:.3g}{mark}"


def _header(doc: dict[str, Any]) -> list[str]:
    """The run's command, machine, settings, versions, skipped systems, failures and notes."""
    meta, points, cfg = doc["meta"], doc["points"], doc["meta"]["config"]
    how = (f"{cfg['iters']} iterations" if cfg["iters"] > 0
           else f"a {cfg['budget_s']} s budget ({cfg['min_iters']}-{cfg['max_iters']} iterations)")
    settled = f" after {cfg['settle_s']} s of untimed calls once at each job's start" if cfg["settle_s"] else ""
    lines = ["# fastcoll benchmark", "", f"- command: `{' '.join(meta.get('argv', []))}`",
             f"- machine: {meta.get('cpu', '?')}, {meta.get('cpus')} CPUs, {meta.get('platform')}, "
             f"Python {meta.get('python')}",
             f"- when: {meta.get('time')}; load average at start {meta.get('loadavg_start')}, "
             f"at end {meta.get('loadavg_end')}",
             f"- {cfg['rounds']} interleaved round(s), {how} per point and round, {cfg['warmup']} warm-up "
             f"iterations{settled}; float32; the time of an iteration is that of its slowest rank"]
    if doc.get("versions"):
        lines.append("- versions: " + "; ".join(f"{k}: {v}" for k, v in doc["versions"].items()))
    lines += [f"- **{name} skipped**: {reason}" for name, reason in doc.get("skipped", {}).items()]
    lines += [f"- **{f['system']} (world {f['world']}, round {f['round'] + 1}) failed**: {f['error'][:300]}"
              for f in doc.get("failures", [])]
    notes = sorted({f"{p['system']} {p['op']}: {p['emulated']}" for p in points if p.get("emulated")})
    notes += sorted({f"{p['system']} {p['op']}: {p['reason']}" for p in points
                     if p["status"] != "ok" and p.get("reason")})
    if notes:
        lines += ["", "Notes (* marks an emulated collective):", "", *[f"- {n}" for n in notes]]
    return lines


def targets_table(doc: dict[str, Any]) -> list[str]:
    """The report's targets and whether each is met (compare.py prints it when it ends)."""
    if not doc.get("targets"):
        return []
    head = ["ranks", "fastcoll", "peer", "small (4 B-4 KiB) min speedup", "target", "64 MiB all-reduce busbw ratio",
            "target"]
    rows = []
    for t in doc["targets"]:
        small = (f"{t['small_min_speedup']:.2f}x ({t['small_worst_at']}) {'PASS' if t['small_pass'] else 'FAIL'}"
                 if "small_min_speedup" in t else "-")
        large = (f"{t['large_busbw_ratio']:.2f}x {'PASS' if t['large_pass'] else 'FAIL'}"
                 if "large_busbw_ratio" in t else "-")
        rows.append([str(t["world"]), t["fastcoll"], t["peer"], small, f">= {TARGETS[t['peer']][0]:g}x", large,
                     f">= {TARGETS[t['peer']][1]:g}x"])
    return ["", "## Targets (report.TARGETS: issue 7 against MLX ring, issue 24 against MPICH)", "",
            *md_table(head, rows)]


def _op_tables(doc: dict[str, Any], op: str, world: int, present: list[str]) -> list[str]:
    """Time, bus bandwidth, CPU per call and fastcoll's speedups for one (op, world)."""
    idx = _index(doc["points"])
    sizes = sorted({p["size"] for p in doc["points"] if p["op"] == op and p["world"] == world})
    if not sizes:
        return []
    lines = ["", f"## {op}, {world} ranks"]
    for title, what in (("Median (p90) time per collective in µs:", "time"),
                        ("Bus bandwidth in GB/s (from the median):", "busbw"),
                        ("CPU time per collective and rank (all its threads), median in µs:", "cpu")):
        lines += ["", title, ""] + md_table(["size"] + present, [
            [format_size(s)] + [_cell(idx.get((sy, op, world, s)), what) for sy in present] for s in sizes])
    pairs = [(f, q) for f in present if f.startswith("fastcoll") for q in present if not q.startswith("fastcoll")]
    if pairs:
        rindex = {(r["fastcoll"], r["peer"], r["size"]): r for r in doc["ratios"]
                  if r["op"] == op and r["world"] == world}
        lines += ["", "Speedup of fastcoll (peer time / fastcoll time; > 1: fastcoll faster):", ""]
        lines += md_table(["size"] + [f"{f} / {q}" for f, q in pairs], [
            [format_size(s)] + [f"{rindex[(f, q, s)]['speedup']:.2f}x" if (f, q, s) in rindex else ""
                                for f, q in pairs] for s in sizes])
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """The report: setup, skipped peers, targets, and per (op, world) tables."""
    cfg = doc["meta"]["config"]
    present = [s for s in dict.fromkeys(cfg["systems"]) if any(p["system"] == s for p in doc["points"])]
    lines = _header(doc) + targets_table(doc)
    for op in cfg["ops"]:
        for world in cfg["worlds"]:
            lines += _op_tables(doc, op, world, present)
    return "\n".join(lines) + "\n"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _panel(ax, points: list[dict[str, Any]], systems: list[str], key: str, scale: float, title: str) -> None:
    """One (op, world)'s lines, one a system, against the size; dashed where emulated."""
    for k, system in enumerate(systems):
        mine = sorted((p for p in points if p["system"] == system), key=lambda p: p["size"])
        emulated = any(p.get("emulated") for p in mine)
        if mine:
            ax.plot([p["size"] for p in mine], [p[key] * scale for p in mine], marker="o", markersize=3,
                    linestyle="--" if emulated else "-", color=f"C{k}",
                    label=system + (" (emulated)" if emulated else ""))
    ax.set(yscale="log", title=title, xlabel="size (bytes)")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)


def plot(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """latency.png and busbw.png: one panel per (op, world), one line per system, vs size.
    Raises ImportError when matplotlib is absent (the caller reports it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops, worlds = doc["meta"]["config"]["ops"], doc["meta"]["config"]["worlds"]
    points = [p for p in doc["points"] if p["status"] == "ok"]
    systems = [s for s in dict.fromkeys(doc["meta"]["config"]["systems"]) if any(p["system"] == s for p in points)]
    written = []
    for name, key, scale, label in (("latency.png", "median_s", 1e6, "median time (µs)"),
                                    ("busbw.png", "busbw_GBps", 1.0, "bus bandwidth (GB/s)")):
        fig, axes = plt.subplots(len(ops), len(worlds), squeeze=False, figsize=(5.5 * len(worlds), 3.6 * len(ops)))
        for i, op in enumerate(ops):
            for j, world in enumerate(worlds):
                mine = [p for p in points if p["op"] == op and p["world"] == world]
                _panel(axes[i][j], mine, systems, key, scale, f"{op}, {world} ranks")
                axes[i][j].set_ylabel(label)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(out_dir / name)
    return written
