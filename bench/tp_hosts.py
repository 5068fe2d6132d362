"""mlx-lm decoding across a bed's hosts, bench/hostbed.py's decode part (`--decode-hosts`): one rank a
host runs `bench/workers/tp_worker.py`, the systems alternating each round beside one process
(`single`); docs/multihost.md tells what each system, shape and link is. `floor` is the
tensor-parallel split started as `ring` with its all-reduces left out, so that ring's time less
the floor's is what its all-reduces cost a token.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.multihost import PYTHON, REPO, Hosts
from bench.report import md_table

WORKER = REPO / "bench" / "workers" / "tp_worker.py"
SHAPES = {  # tp_worker's model arguments
    "small": "--hidden 256 --layers 4 --heads 8 --kv-heads 8 --intermediate 688 --vocab 4096".split(),
    "smaller": "--hidden 128 --layers 4 --heads 4 --kv-heads 4 --intermediate 344 --vocab 1024".split(),
    "large": "--hidden 512 --layers 8 --heads 8 --kv-heads 8 --intermediate 1408 --vocab 8192".split(),
}
SYSTEMS = ("fastcoll", "fastcoll-graph", "ring", "ring-mlx.launch", "floor")
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # one core a rank, as the ranks share two


def floor_ms(link: str, mode: str, layers: int) -> float:
    """The link's floor for one token: a round trip for each all-reduce (tp: two a layer)."""
    delay = link.partition("+")[2]
    if not delay or mode != "tp":
        return 0.0
    return 2 * layers * 2 * int(delay.removesuffix("us")) / 1e3


def command(hosts: Hosts, system: str, args: list[str], timeout: float) -> list[str]:
    """The launcher's command line for one decode job of `system` across the bed's hosts."""
    name, _, knobs = system.partition("/")  # fastcoll/NAME=VALUE/...: with those FASTCOLL_TUNING knobs
    if name in ("fastcoll", "fastcoll-graph"):
        env = THREADS | {"FASTCOLL_TIMEOUT": "60"} | ({"FASTCOLL_TUNING": knobs.replace("/", ",")} if knobs else {})
        env |= {"FASTCOLL_MLX_GRAPH": "1" if name == "fastcoll-graph" else "0"}  # "fastcoll": the eager path
        return [*hosts.fastcoll_launch(timeout, env), PYTHON, "-m", "fastcoll.mlx_compat", str(WORKER), *args]
    launch = hosts.fastcoll_launch(timeout, THREADS)
    ring = hosts.bed.root / f"ring-{hosts.port}.json"
    ring.write_text(json.dumps([[f"{h.data[0]}:{hosts.port + i}"] for i, h in enumerate(hosts.hosts)]))
    if system in ("ring", "floor"):
        args = [*args, "--no-exchange"] if system == "floor" else args
        inner = f"MLX_RANK=$FASTCOLL_RANK MLX_HOSTFILE={ring} exec {PYTHON} {WORKER} " + " ".join(args)
        return [*launch, "/bin/sh", "-c", inner]
    if system == "ring-mlx.launch":
        return hosts.mlx_launch_ring(WORKER, args, THREADS)
    raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def run(hosts: Hosts, system: str, args: list[str], timeout: float) -> dict:
    """One job (`single`: one process on host 1); its RESULT document, or {"error": ...}."""
    single = system == "single"
    cmd = [PYTHON, str(WORKER), *args] if single else command(hosts, system, args, timeout)
    got = hosts.run(cmd, timeout, "ms_per_token", host=int(single), **THREADS)
    return got.doc if got.doc is not None else {"error": got.error}


def combos(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(shape, mode) to run: tp in every shape, pp (one pipeline run each way) in the first."""
    shapes, modes = a.decode_shapes, a.decode_modes
    return [(shape, "tp") for shape in shapes if "tp" in modes] + [(shapes[0], "pp")] * ("pp" in modes)


def measure(bed, n: int, link: str, a: argparse.Namespace) -> list[dict]:
    """Every shape and mode on this link of a bed of n hosts, hostbed's `--decode-rounds` rounds, the
    systems alternating."""
    hosts, rows = Hosts(bed, n), []
    for shape, mode in combos(a):
        args = ["--mode", mode, "--tokens", str(a.decode_tokens), "--repeat", str(a.decode_repeat), *SHAPES[shape]]
        single = ["--mode", "single", *args[2:]] + (["--model", "qwen2"] if mode == "pp" else [])
        systems = [s for s in a.decode_systems if s != "floor" or mode == "tp"]  # a pipeline has no floor without its sends
        for r in range(a.decode_rounds):
            order = ["single", *(systems if r % 2 == 0 else systems[::-1])]
            for system in order:
                doc = run(hosts, system, single if system == "single" else args, a.job_timeout)
                rows.append({**doc, "hosts": len(hosts.hosts), "link": link, "shape": shape, "mode": mode,
                             "system": system, "round": r, "floor_ms": floor_ms(link, mode, int(SHAPES[shape][3]))})
                Path(a.out).mkdir(parents=True, exist_ok=True)
                with open(Path(a.out) / "decode-rows.jsonl", "a") as f:  # kept if a time limit cuts the part
                    f.write(json.dumps(rows[-1]) + "\n")
                said = doc.get("error") or f"{doc['ms_per_token']:.2f} ms/token"
                print(f"[{len(hosts.hosts)} hosts, {link}, {shape}, {mode}, round {r}] {system}: {said}",
                      flush=True)
    return rows


def table(rows: list[dict]) -> str:
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
    return "\n".join(md_table(head, out))
