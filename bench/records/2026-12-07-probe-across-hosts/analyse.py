"""Reads raw/ (`tar -xJf raw.tar.xz`) and writes collectives.md, rounds.md and plot.png (matplotlib):
each point's median and p90 and each round's median, the per-round ratios of MPICH to fastcoll, and
decode's ms a token and ring / fastcoll per round."""
import collections
import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
RAW = HERE / "raw"
RUNS = ("c4p", "big")


def points():
    """(run, hosts, link, op, size, system) -> the harness's point, with the small choice per system."""
    out, chose = {}, {}
    for name in RUNS:
        for run in json.loads((RAW / name / "results.json").read_text())["collectives"]:
            for system, text in run["doc"]["versions"].items():
                if "small " in text:
                    chose[(run["hosts"], run["link"], system)] = text.split("small ")[1].split(",")[0]
            for p in run["doc"]["points"]:
                out[(name, run["hosts"], run["link"], p["op"], p["size"], p["system"])] = p
    return out, chose


def table(pts, chose) -> str:
    rows = ["| hosts | link | op | size | system (small calls' algorithm) | median | p90 | round medians | samples |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (name, hosts, link, op, size, system), p in sorted(pts.items(), key=lambda kv: kv[0][1:]):
        unit, k = ("ms", 1e3) if size >= 1 << 20 else ("us", 1e6)
        rounds = " ".join(f"{x * k:.1f}" for x in p["round_medians_s"])
        alg = f" ({chose[(hosts, link, system)]})" if (hosts, link, system) in chose else ""
        rows.append(f"| {hosts} | {link} | {op} | {size} | {system}{alg} | {p['median_s'] * k:.1f} {unit} "
                    f"| {p['p90_s'] * k:.1f} | {rounds} | {p['samples']} |")
    rows += ["", "MPICH / fastcoll-tcp, each round's medians (median and range of the rounds' ratios):", "",
             "| hosts | link | op | size | ratio median (range) | rounds below 1 |", "| --- | --- | --- | --- | --- | --- |"]
    for (name, hosts, link, op, size, system), p in sorted(pts.items(), key=lambda kv: kv[0][1:]):
        if system != "fastcoll-tcp":
            continue
        m = pts[(name, hosts, link, op, size, "mpi")]["round_medians_s"]
        r = [b / a for a, b in zip(p["round_medians_s"], m)]
        rows.append(f"| {hosts} | {link} | {op} | {size} | {st.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) | {sum(x < 1 for x in r)} |")
    return "\n".join(rows) + "\n"


def rounds() -> str:
    """d4m: each system's ms a token (median, range over the rounds) and ring / system per round."""
    out = ["| link | mode | system | ms/token median (range) | ring / system median (range) | rounds below 1 | tokens = single |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    by = collections.defaultdict(dict)
    for line in (RAW / "d4m" / "decode-rows.jsonl").read_text().splitlines():
        r = json.loads(line)
        by[(r["link"], r["mode"], r["round"])][r["system"]] = r
    for link, mode in sorted({k[:2] for k in by}, reverse=True):
        rnds = [by[k] for k in sorted(by) if k[:2] == (link, mode)]
        for system in ("fastcoll-graph", "ring", "single"):
            ms = [d[system]["ms_per_token"] for d in rnds]
            ratio = [d["ring"]["ms_per_token"] / d[system]["ms_per_token"] for d in rnds]
            same = "yes" if all(d[system]["tokens"] == d["single"]["tokens"] for d in rnds) else "NO"
            cell = f"{st.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})" if system == "fastcoll-graph" else ""
            below = sum(x < 1 for x in ratio) if system == "fastcoll-graph" else ""
            out.append(f"| {link} | {mode} | {system} | {st.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) | {cell} | {below} | {same} |")
    return "\n".join(out) + "\n"


def plot(pts) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    systems = ["fastcoll-tcp", "fastcoll-tcp/doubling=1", "fastcoll-tcp/doubling=0", "mpi"]
    for i, link in enumerate(("unshaped", "1gbit+50us")):
        for j, s in enumerate(systems):
            us = pts[("c4p", 4, link, "all_reduce", 4, s)]["median_s"] * 1e6
            a.bar(i * 5 + j, us, color=f"C{j}", label=s if i == 0 else None)
    a.set_xticks([1.5, 6.5], ["unshaped", "1 Gbit/s + 50 us"])
    a.set_ylabel("us (median)")
    a.set_title("4 hosts, 4 B all_reduce")
    a.legend(fontsize=7)
    ops = ["all_reduce", "all_gather", "broadcast"]
    for i, (hosts, op) in enumerate((h, o) for h in (2, 4) for o in ops):
        for j, s in enumerate(("fastcoll-tcp", "mpi", "mlx-ring")):
            bw = pts[("big", hosts, "unshaped", op, 67108864, s)]["busbw_GBps"]
            b.bar(i * 4 + j, bw, color=f"C{(0, 3, 4)[j]}", label=s if i == 0 else None)
    b.set_xticks([i * 4 + 1 for i in range(6)], [f"{h}h {o}" for h in (2, 4) for o in ops], fontsize=7, rotation=20)
    b.set_ylabel("bus bandwidth GB/s (median)")
    b.set_title("64 MiB, unshaped veths")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "plot.png", dpi=80)


if __name__ == "__main__":
    pts, chose = points()
    (HERE / "collectives.md").write_text(table(pts, chose))
    (HERE / "rounds.md").write_text(rounds())
    plot(pts)
