"""Reads raw/ (`tar -xJf raw.tar.xz`) and writes collectives.md, rounds.md, timeline.md and plot.png
(matplotlib)."""
import collections
import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
RAW = HERE / "raw"


def collectives() -> tuple[str, dict]:
    rows = ["| hosts | link | op | size | system | median (us) | p90 (us) | samples |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    plot = collections.defaultdict(dict)  # (hosts, op, size) -> {(system, link): median us}
    for name in ("c2s", "c4s"):
        for run in json.loads((RAW / name / "results.json").read_text())["collectives"]:
            for p in sorted(run["doc"]["points"], key=lambda p: (p["op"], p["size"], p["system"])):
                us = p["median_s"] * 1e6
                rows.append(f"| {run['hosts']} | {run['link']} | {p['op']} | {p['size']} | {p['system']} | {us:.1f} "
                            f"| {p['p90_s'] * 1e6:.1f} | {p['samples']} |")
                plot[(run["hosts"], p["op"], p["size"])][(p["system"], run["link"])] = us
    return "\n".join(rows) + "\n", plot


def rounds() -> str:
    """Each system's ms a token (median and range over the rounds) and ring / system (the median of
    the rounds' ratios, each round its own), for decode's two runs."""
    out = ["| link | mode | system | ms/token median (range) | ring / system (range) | rounds below 1 | tokens = single |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("d4", "p4"):
        rows = [json.loads(line) for line in (RAW / name / "decode-rows.jsonl").read_text().splitlines()]
        by = collections.defaultdict(dict)
        for r in rows:
            by[(r["link"], r["mode"], r["round"])][r["system"]] = r
        for link, mode in sorted({k[:2] for k in by}):
            rnds = [by[k] for k in sorted(by) if k[:2] == (link, mode)]
            for system in [s for s in rnds[0] if s != "single"]:
                ms = [d[system]["ms_per_token"] for d in rnds if system in d]
                same = all(d[system]["tokens"] == d["single"]["tokens"] for d in rnds if system in d)
                ratio = [d["ring"]["ms_per_token"] / d[system]["ms_per_token"] for d in rnds if system in d and "ring" in d]
                timed = system.startswith("fastcoll")  # floor leaves the all-reduces out: other tokens, no ratio
                cell = f"{st.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})" if timed else ""
                below = sum(x < 1 for x in ratio) if timed else ""
                same = "n/a" if system == "floor" else "yes" if same else "NO"
                out.append(f"| {link} | {mode} | {system} | {st.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) | {cell} | {below} | {same} |")
    return "\n".join(out) + "\n"


def timeline() -> str:
    """Where a pipelined token's time goes in p4's last round (graph mode's traces, a file a rank):
    the pipeline runs from the last rank to rank 0, whose all_gather hands every rank the token.
    Medians over the steady tokens, ms; the reading of bench/records/2026-12-07-pinned-bed-4hosts/."""
    out = []
    for prefix in sorted({p.name.rsplit(".rank", 1)[0] for p in (RAW / "p4" / "traces").glob("*.rank*.json")}):
        ranks = [sorted((e["name"].split("/")[1], e["ts"], e["ts"] + e["dur"]) for e in json.loads(p.read_text())["traceEvents"]
                        if e.get("ph") == "X" and "/" in e["name"]) for p in sorted((RAW / "p4" / "traces").glob(prefix + ".rank*.json"))]
        n, parts = len(ranks), collections.defaultdict(list)
        gathers = [[c for c in r if c[0].startswith("all_gather")] for r in ranks]
        for k in range(4, min(map(len, gathers)) - 1):
            t0 = ready = gathers[n - 1][k - 1][2]
            for i in range(n - 1, 0, -1):
                send = next(c for c in ranks[i] if c[0].startswith("send") and c[1] >= ready)
                ready = next(c for c in ranks[i - 1] if c[0].startswith("recv") and c[2] >= send[1])[2]
                parts[f"stage on rank {i}"].append(send[1] - (t0 if i == n - 1 else parts["_ready"][-1]))
                parts[f"hop {i} -> {i - 1}"].append(ready - send[1])
                parts["_ready"].append(ready)
            gather = next(c for c in gathers[0] if c[1] >= ready)
            parts["stage on rank 0"].append(gather[1] - ready)
            parts["all_gather: rank 0's call to the first stage's result"].append(gathers[n - 1][k][2] - gather[1])
            parts["token"].append(gathers[n - 1][k][2] - t0)
        out += [f"### {prefix} ({len(parts['token'])} tokens, medians, ms)", "", "| part | ms |", "| --- | --- |"]
        out += [f"| {p} | {st.median(v) / 1e3:.3f} |" for p, v in parts.items() if p != "_ready"] + [""]
    return "\n".join(out)


def draw(plot: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    links = ["unshaped", "1gbit+50us", "1gbit+200us"]
    keys = [(h, op, 4) for h in (2, 4) for op in ("all_reduce", "all_gather")]
    fig, axes = plt.subplots(1, len(keys), figsize=(14, 3.6), sharey=True)
    for ax, key in zip(axes, keys):
        systems = sorted({s for k in plot.values() for s, _ in k})  # one colour a system in every panel
        for i, s in enumerate(systems):
            ax.bar([x + i * 0.8 / len(systems) for x in range(len(links))], [plot[key].get((s, link), 0) for link in links],
                   0.8 / len(systems), label=s, color=f"C{i}")
        ax.set_xticks([x + 0.3 for x in range(len(links))], links, fontsize=8)
        ax.set_title(f"{key[0]} hosts, {key[1]} 4 B", fontsize=9)
        ax.set_yscale("log")
    axes[0].set_ylabel("median us (slowest rank)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "plot.png", dpi=80)


if __name__ == "__main__":
    table, plot = collectives()
    (HERE / "collectives.md").write_text(table)
    (HERE / "rounds.md").write_text(rounds())
    (HERE / "timeline.md").write_text(timeline())
    draw(plot)
