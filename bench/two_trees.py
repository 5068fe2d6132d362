"""Two versions of fastcoll on the same benchmark, alternating: is a change slower?

    python bench/two_trees.py BEFORE AFTER [--rounds 5] [--raw FILE] [-- COMPARE.PY ARGS...]

BEFORE and AFTER are git revisions ("." the working tree) or folders that hold a tree already (a
`git archive` carried to a machine without git: its native engine is built there, in place); each
round runs each one's own `bench/compare.py` (a revision from 2026-12-03 on), alternating so
that a drifting machine moves both. Prints, per system, op and size, the median of the rounds'
medians and AFTER/BEFORE; `--raw` writes every round's medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["--ops", "all_reduce,all_gather,reduce_scatter,broadcast", "--world", "2", "--sizes", "4,4KiB",
           "--systems", "fastcoll-tcp,fastcoll-tcp/noshm,fastcoll-zmq", "--rounds", "1", "--no-plots"]


def checkout(rev: str, into: str, role: str) -> str:
    """A copy of revision `rev` ("." : the working tree) in folder `role` under `into` (one per
    role, so that a revision can be compared with itself), or `rev` itself where it is a folder
    that holds a tree (bench/compare.py in it), built in place."""
    if rev == ".":
        return ROOT
    if os.path.isdir(rev):
        if not os.path.exists(os.path.join(rev, "bench", "compare.py")):
            raise SystemExit(f"{rev}: a folder, but no tree of fastcoll in it (no bench/compare.py)")
        path = os.path.abspath(rev)
    else:
        path = os.path.join(into, role)
        os.makedirs(path)
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", path], input=archive, check=True)
    if os.path.exists(os.path.join(path, "setup.py")):  # its native engine, as pip would build it
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def run(tree: str, args: list[str], out: str) -> dict[tuple, float]:
    """One run of `tree`'s own benchmark: (system, op, ranks, bytes) -> median seconds."""
    # The tree first; then what was already there (a machine's carried packages live on PYTHONPATH).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, os.path.join(tree, "bench", "compare.py"), *args, "--out", out],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "results.json")) as f:
        return medians(json.load(f)["points"])


def medians(points: list[dict]) -> dict[tuple, float]:
    """results.json's points as (system, op, ranks, bytes) -> median seconds: the ranks are part
    of the key, so that a run of several --world sizes keeps each one's point."""
    return {(p["system"], p["op"], p.get("world", 0), p["size"]): p["median_s"] for p in points if p["status"] == "ok"}


def write_raw(path: str, a: argparse.Namespace, args: list[str], seen: dict[tuple, dict[str, list[float]]]) -> None:
    """Every round's medians so far (us), per (system, op, ranks, bytes) and tree, as JSON."""
    with open(path, "w") as f:
        json.dump({"before": a.before, "after": a.after, "rounds": a.rounds, "args": args,
                   "points": [{"key": list(k), **v} for k, v in sorted(seen.items())]}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--raw", help="write every round's medians (us) here, as JSON")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    args = argv[cut + 1:] or DEFAULT
    seen: dict[tuple, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {role: checkout(rev, tmp, role) for role, rev in (("before", a.before), ("after", a.after))}
        for i in range(a.rounds):
            for name, tree in trees.items():
                for key, s in run(tree, args, os.path.join(tmp, f"{name}{i}")).items():
                    seen.setdefault(key, {}).setdefault(name, []).append(s * 1e6)
                if a.raw:  # after every run, so that a run cut off by its time limit keeps its rounds
                    write_raw(a.raw, a, args, seen)
    print(f"before: {a.before}, after: {a.after}, {a.rounds} rounds alternating; bench/compare.py {' '.join(args)}")
    print("| system | op | ranks | bytes | before us | after us | after/before |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(seen):
        v = seen[key]
        if "before" in v and "after" in v:
            b, f = statistics.median(v["before"]), statistics.median(v["after"])
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {b:.1f} | {f:.1f} | {f / b:.2f} |")


if __name__ == "__main__":
    main()
