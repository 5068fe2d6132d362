"""Tables of the chain A/B from gate_ranks_*.json files: us per gate (serial median / 64)."""
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1]); runs = sys.argv[2].split(",")
rows = ["bfloat16_4096", "bfloat16_8192", "float32_16"]
label = {"bfloat16_4096": "8 KiB bf16 (bfloat16_4096)", "bfloat16_8192": "16 KiB bf16 (bfloat16_8192)", "float32_16": "64 B f32 (float32_16)"}
kinds = {"gatehost": "host mode", "gate": "direct"}
for row in rows:
    print(f"\n### {label[row]}\n")
    print("| # | run | host mode us/gate (r0 / r1) | direct us/gate (r0 / r1) |")
    print("| --- | --- | --- | --- |")
    per = {}
    for i, run in enumerate(runs, 1):
        cells = []
        for k in kinds:
            docs = json.loads((root / run / f"gate_ranks_{k}.json").read_text())
            docs = sorted(docs, key=lambda d: d["rank"])
            us = [d[row]["serial"]["median"] * 1000 / 64 for d in docs]
            per.setdefault((Path(run).name.split("-")[0], k), []).extend(us)
            cells.append(" / ".join(f"{u:.1f}" for u in us))
        print(f"| {i} | {run} | {cells[0]} | {cells[1]} |")
    print("\n| kind | old median | new median | new / old |\n| --- | --- | --- | --- |")
    for k, name in kinds.items():
        o, n = statistics.median(per[("old", k)]), statistics.median(per[("new", k)])
        print(f"| {name} | {o:.1f} us | {n:.1f} us | {n / o:.3f} |")
