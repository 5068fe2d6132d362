"""Reads the runs' decode-rows.jsonl and graph mode's pipelined traces (in raw.tar.xz) and writes
rounds.md (each configuration's rounds), timeline.md (where a pipelined token's time goes) and
plot.png. From this folder: tar xJf raw.tar.xz && python3 analyse.py"""
import collections
import glob
import json
import statistics as st
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402 (matplotlib's own dependency)

RUNS = ["tp4d50", "tp4u200", "pp2u", "pp2d200"]
SYSTEMS = ["single", "fastcoll", "fastcoll-graph", "ring", "ring-mlx.launch", "floor"]
rows = [json.loads(line) for run in RUNS for line in open(Path("raw") / run / "decode-rows.jsonl")]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["hosts"], r["link"], r["shape"], r["mode"], r["round"])][r["system"]] = r["ms_per_token"]
configs = list(dict.fromkeys((r["hosts"], r["link"], r["shape"], r["mode"]) for r in rows))
out = ["| hosts | link | mode | system | ms/token median (min-max) | ring / system: median of the rounds' "
       "ratios (min-max) | rounds below 1 |", "| --- | --- | --- | --- | --- | --- | --- |"]
for c in configs:
    rounds = [by[c + (i,)] for i in range(100) if c + (i,) in by]
    for s in SYSTEMS:
        ms = [r[s] for r in rounds if s in r]
        if not ms:
            continue
        q = [r["ring"] / r[s] for r in rounds if s not in ("single", "ring", "floor")]
        ratio = f"{st.median(q):.2f} ({min(q):.2f}-{max(q):.2f})" if q else ""
        below = f"{sum(x < 1 for x in q)} of {len(q)}" if q else ""
        out.append(f"| {c[0]} | {c[1]} | {c[3]} | {s} | {st.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) "
                   f"| {ratio} | {below} |")
Path("rounds.md").write_text("\n".join(out) + "\n")


def calls(path):
    """The graph's calls of one rank's trace: [(name, start, end)] in time order (us)."""
    ev = json.load(open(path))["traceEvents"]
    return sorted((e["name"].split("/")[1], e["ts"], e["ts"] + e["dur"]) for e in ev
                  if e.get("ph") == "X" and "/" in e["name"])


def token_parts(prefix):
    """Per token of the traced run: the stages' compute, the hops' and the all_gather's time on the
    token's path (the pipeline runs from the last rank to rank 0, then all_gather gives every rank
    the output), medians over the steady tokens, in ms."""
    ranks = [calls(p) for p in sorted(glob.glob(prefix + ".rank*.json"))]
    n = len(ranks)
    ag = [[c for c in r if c[0].startswith("all_gather")] for r in ranks]
    parts = collections.defaultdict(list)
    for k in range(4, min(map(len, ag)) - 1):  # the first tokens warm up; a run's last has no next
        t0 = ready = ag[n - 1][k - 1][2]  # the first stage has the previous token's output
        for i in range(n - 1, 0, -1):  # each stage's send after its input came, its peer's receive ending after it
            send = next(c for c in ranks[i] if c[0].startswith("send") and c[1] >= ready)
            recv = next(c for c in ranks[i - 1] if c[0].startswith("recv") and c[2] >= send[1])
            parts[f"stage on rank {i}"].append(send[1] - ready)
            parts[f"hop {i} -> {i - 1}"].append(recv[2] - send[1])
            ready = recv[2]
        gather = next(c for c in ag[0] if c[1] >= ready)
        parts["stage on rank 0"].append(gather[1] - ready)
        parts["all_gather: rank 0's call to the first stage's result"].append(ag[n - 1][k][2] - gather[1])
        parts["token"].append(ag[n - 1][k][2] - t0)
    return {p: st.median(v) / 1e3 for p, v in parts.items()}, len(parts["token"])


lines = []
for prefix in sorted({p.rsplit(".rank", 1)[0] for p in glob.glob("raw/*/traces/*pp-fastcoll-graph.rank*.json")}):
    parts, tokens = token_parts(prefix)
    lines += [f"### {Path(prefix).name} ({tokens} tokens, medians, ms)", "", "| part | ms |", "| --- | --- |"]
    lines += [f"| {p} | {v:.3f} |" for p, v in parts.items()] + [""]
Path("timeline.md").write_text("\n".join(lines))
fig, axes = plt.subplots(1, len(configs), figsize=(1.9 * len(configs), 3.6))
for ax, c in zip(axes, configs):
    for i, s in enumerate(SYSTEMS):
        ms = [by[c + (k,)][s] for k in range(100) if c + (k,) in by and s in by[c + (k,)]]
        if ms:
            ax.scatter([i] * len(ms), ms, s=5, color=f"C{i}")
            ax.hlines(st.median(ms), i - 0.3, i + 0.3, color="k")
    ax.set_xticks(range(len(SYSTEMS)), ["one", "eager", "graph", "ring", "mlx.launch", "floor"], rotation=60,
                  fontsize=7)
    ax.set_title(f"{c[0]} hosts {c[1]}\n{c[3]}", fontsize=7)
    ax.tick_params(labelsize=7)
axes[0].set_ylabel("ms a token (each round; bar: median)", fontsize=7)
fig.tight_layout()
fig.savefig("plot.png", dpi=72)
# 64 colours, no dither: the same picture in a quarter of the bytes (records stay a few MB)
Image.open("plot.png").convert("RGB").quantize(colors=64, dither=Image.Dither.NONE).save("plot.png", optimize=True)
