"""Reads the three runs' decode-rows.jsonl (in raw.tar.xz) and writes rounds.md (each configuration's
per-round ratios) and plot.png. From this folder: tar xJf raw.tar.xz && python3 analyse.py"""
import collections
import json
import statistics as st
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402 (matplotlib's own dependency)

RUNS = ["tp2u", "tp2d50", "tp2d200"]
rows = [json.loads(line) for run in RUNS for line in open(Path("raw") / run / "decode-rows.jsonl")]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["link"], r["shape"], r["mode"], r["round"])][r["system"]] = r["ms_per_token"]
configs = list(dict.fromkeys((r["link"], r["shape"], r["mode"]) for r in rows))
out = ["| link | shape | mode | system | ms/token median (min-max) | ring / system: median of the rounds' ratios (min-max) "
       "| rounds below 1 | eager / graph, median |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
for c in configs:
    rounds = [by[c + (i,)] for i in range(100) if c + (i,) in by]
    for s in ("single", "fastcoll", "fastcoll-graph", "ring", "floor"):
        ms = [r[s] for r in rounds if s in r]
        if not ms:
            continue
        q = [r["ring"] / r[s] for r in rounds if s in ("fastcoll", "fastcoll-graph")]
        ratio = f"{st.median(q):.2f} ({min(q):.2f}-{max(q):.2f})" if q else ""
        below = str(sum(x < 1 for x in q)) + f" of {len(q)}" if q else ""
        ge = f"{st.median(r['fastcoll'] / r['fastcoll-graph'] for r in rounds):.2f}" if s == "fastcoll-graph" else ""
        out.append(f"| {c[0]} | {c[1]} | {c[2]} | {s} | {st.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) "
                   f"| {ratio} | {below} | {ge} |")
Path("rounds.md").write_text("\n".join(out) + "\n")
fig, axes = plt.subplots(1, len(configs), figsize=(2.1 * len(configs), 3.6), sharey=False)
systems = ["single", "fastcoll", "fastcoll-graph", "ring", "floor"]
for ax, c in zip(axes, configs):
    for i, s in enumerate(systems):
        ms = [by[c + (k,)][s] for k in range(100) if c + (k,) in by and s in by[c + (k,)]]
        if ms:
            ax.scatter([i] * len(ms), ms, s=5)
            ax.hlines(st.median(ms), i - 0.3, i + 0.3, color="k")
    ax.set_xticks(range(len(systems)), ["one", "eager", "graph", "ring", "floor"], rotation=60, fontsize=7)
    ax.set_title(f"{c[0]}\n{c[1]} {c[2]}", fontsize=7)
    ax.tick_params(labelsize=7)
axes[0].set_ylabel("ms a token (each round; bar: median)", fontsize=7)
fig.tight_layout()
fig.savefig("plot.png", dpi=72)
# 64 colours, no dither: the same picture in a quarter of the bytes (records stay a few MB)
Image.open("plot.png").convert("RGB").quantize(colors=64, dither=Image.Dither.NONE).save("plot.png", optimize=True)
