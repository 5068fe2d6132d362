"""The benchmark (bench/): its arithmetic, its runner, a --quick run of the systems present, and
the GPU benchmarks run on the CPU (where the gate is off and every run takes the host path)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness, metrics, report  # noqa: E402
from bench.systems import parse_system  # noqa: E402
from bench.workers import timing  # noqa: E402


def test_busbw_follows_nccl_tests() -> None:
    # S = 1 GB in 0.5 s: algbw 2 GB/s.
    assert metrics.algbw(10**9, 0.5) == pytest.approx(2e9)
    assert metrics.busbw("all_reduce", 4, 10**9, 0.5) == pytest.approx(2e9 * 2 * 3 / 4)
    assert metrics.busbw("all_gather", 4, 10**9, 0.5) == pytest.approx(2e9 * 3 / 4)
    assert metrics.busbw("reduce_scatter", 2, 10**9, 0.5) == pytest.approx(2e9 / 2)
    assert metrics.busbw("broadcast", 8, 10**9, 0.5) == pytest.approx(2e9)
    assert metrics.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        metrics.bus_factor("alltoall", 2)


def test_sizes_and_stats() -> None:
    sizes = metrics.sizes_pow4(4, metrics.parse_size("64MiB"))
    assert sizes[0] == 4 and sizes[-1] == 64 << 20 and len(sizes) == 13
    assert metrics.parse_size("4KiB") == 4096 and metrics.format_size(4096) == "4 KiB"
    s = metrics.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median_s"] == 3.0 and s["min_s"] == 1.0
    assert s["p90_s"] == pytest.approx(np.percentile([1, 2, 3, 4, 100], 90))


def test_points_pool_the_rounds_and_keep_each_rounds_median() -> None:
    """A point's statistics pool every round's samples; its round_medians_s say how far the rounds
    stood apart (a record quotes the spread from them)."""
    def job(rnd: int, times: list[float]) -> harness.Job:
        doc = {"points": [{"op": "all_reduce", "size": 4, "bytes": 4, "status": "ok", "times": times}]}
        return harness.Job("s", 2, rnd, 1.0, None, doc)
    (point,) = harness.points_table([job(0, [1.0, 2.0, 3.0]), job(1, [10.0, 20.0, 30.0])])
    assert point["rounds"] == 2 and point["samples"] == 6 and point["median_s"] == 6.5
    assert point["round_medians_s"] == [2.0, 20.0]


def test_layout_and_check() -> None:
    # all-gather and reduce-scatter: S is the total; tiny sizes round up to one element a rank.
    assert timing.layout("all_gather", 4, 2) == timing.Layout(1, 2, 8)
    assert timing.layout("reduce_scatter", 4096, 4) == timing.Layout(1024, 256, 4096)
    assert timing.layout("all_reduce", 4, 4) == timing.Layout(1, 1, 4)
    for op in timing.OPS:
        lay = timing.layout(op, 64, 4)
        for rank in range(4):
            good = timing.expected(op, lay, rank, 4)
            assert timing.verify(op, lay, rank, 4, good) is None
            assert timing.verify(op, lay, rank, 4, good + 1) is not None
    # the expected all-reduce of the check inputs really is their sum
    lay = timing.layout("all_reduce", 64, 3)
    total = sum(timing.check_input("all_reduce", lay, r) for r in range(3))
    assert timing.verify("all_reduce", lay, 0, 3, total) is None


def test_settle_runs_the_first_point_untimed_until_every_rank_has_had_its_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's start ran slow on the bed (bench/NOTES.md 86): the worker runs its first point that
    the system has untimed for --settle seconds, stopping when the rank that has run least has."""
    calls: list[str] = []
    clock = [0.0]

    def prepare(op: str, inp: np.ndarray, out_elems: int) -> timing.Collective:
        if op == "gather":
            raise timing.NotSupported("no gather here")
        calls.append(f"prepare {op} {inp.size}")
        return lambda: calls.append("call")

    def gather(v: np.ndarray) -> np.ndarray:  # a second rank that has run 0.125 s less
        clock[0] += 0.0625
        return np.stack([v, v - 0.125])

    backend = timing.Backend("fake", 0, 2, lambda: None, gather, prepare)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    ran = timing.settle(backend, [("gather", 64), ("all_reduce", 64), ("all_reduce", 4)], 0.25)
    assert calls[0] == "prepare all_reduce 16" and ran["op"] == "all_reduce" and ran["size"] == 64
    # the timed first call's agreement, then one before each batch: this rank reports 0, 0.0625,
    # ... 0.375 s, the other 0.125 s less, whose 0.25 at the seventh ends it after six batches
    assert calls.count("call") == 1 + 6 * 20 == ran["calls"]
    assert timing.settle(backend, [("gather", 4)], 0.25) is None


def test_the_harness_settles_every_job_and_a_worker_by_hand_does_not() -> None:
    cfg = harness.Config(systems=["x"], ops=["all_reduce"], worlds=[2], sizes=[4])
    assert timing.worker_args(cfg.worker_args()).settle == 0.5
    assert timing.worker_args([]).settle == 0.0


def test_a_slow_first_point_settles_in_fewer_calls_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB point of 0.8 s a call must not be run 20 times before the ranks agree to stop."""
    clock = [0.0]
    n = [0]

    def call() -> None:
        n[0] += 1
        clock[0] += 0.8

    backend = timing.Backend("fake", 0, 2, lambda: None, lambda v: np.stack([v, v]), lambda *a: call)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    assert timing.settle(backend, [("all_reduce", 64 << 20)], 0.5)["calls"] == n[0] == 2


def test_ratio_arithmetic() -> None:
    def point(system: str, t: float) -> dict:
        return {"system": system, "op": "all_reduce", "world": 2, "size": 4096, "bytes": 4096,
                "status": "ok", "median_s": t,
                "busbw_GBps": metrics.busbw("all_reduce", 2, 4096, t) / metrics.GB}

    recs = report.ratios([point("fastcoll-tcp", 1e-4), point("mlx-ring", 2e-3), point("mpi", 5e-4)])
    by_peer = {r["peer"]: r for r in recs}
    assert by_peer["mlx-ring"]["speedup"] == pytest.approx(20.0)
    assert by_peer["mlx-ring"]["busbw_ratio"] == pytest.approx(20.0)
    assert by_peer["mpi"]["speedup"] == pytest.approx(5.0)
    t = {x["peer"]: x for x in report.targets(recs)}
    assert t["mlx-ring"]["small_pass"] and t["mpi"]["small_pass"]


def test_two_trees_keeps_each_world_size_apart() -> None:
    from bench import two_trees

    def point(world: int, t: float, status: str = "ok") -> dict:
        return {"system": "fastcoll-tcp", "op": "all_reduce", "world": world, "size": 4096, "status": status,
                "median_s": t}

    got = two_trees.medians([point(2, 1e-5), point(4, 3e-5), point(8, 1.0, "failed")])
    assert got == {("fastcoll-tcp", "all_reduce", 2, 4096): 1e-5, ("fastcoll-tcp", "all_reduce", 4, 4096): 3e-5}



def test_two_trees_runs_a_carried_tree_in_place_with_the_carried_packages(tmp_path, monkeypatch) -> None:
    """A folder given as BEFORE/AFTER (a tree carried to a machine without git) is run where it
    is, and its compare.py still sees what PYTHONPATH held before (the machine's carried wheels)."""
    from bench import two_trees

    tree, site = tmp_path / "before", tmp_path / "site"
    (tree / "bench").mkdir(parents=True)
    site.mkdir()
    (site / "carried_pkg.py").write_text("SECONDS = 2e-5\n")
    (tree / "bench" / "compare.py").write_text(
        "import json, os, sys, carried_pkg\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "os.makedirs(out)\n"
        "point = {'system': 'fastcoll-tcp', 'op': 'all_reduce', 'world': 2, 'size': 4, 'status': 'ok',\n"
        "         'median_s': carried_pkg.SECONDS if os.getcwd() == sys.argv[1] else 1.0}\n"
        "json.dump({'points': [point]}, open(os.path.join(out, 'results.json'), 'w'))\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    path = two_trees.checkout(str(tree), str(tmp_path / "unused"), "before")
    assert path == str(tree) and not (tmp_path / "unused").exists()
    got = two_trees.run(path, [path], str(tmp_path / "out"))
    assert got == {("fastcoll-tcp", "all_reduce", 2, 4): 2e-5}


def test_two_trees_refuses_a_folder_with_no_tree(tmp_path) -> None:
    from bench import two_trees

    with pytest.raises(SystemExit, match="no tree of fastcoll"):
        two_trees.checkout(str(tmp_path), str(tmp_path / "x"), "after")

def test_names_rotation_and_parsing() -> None:
    assert parse_system("fastcoll-tcp/c4").connections == 4
    assert parse_system("fastcoll-tcp/a2").addresses == 2
    with pytest.raises(ValueError, match="/aN"):
        parse_system("mpi/a2")
    assert parse_system("mlx-ring").kind == "mlx"
    with pytest.raises(ValueError):
        parse_system("nccl")
    assert parse_system("fastcoll-tcp/rdma").rdma and not parse_system("fastcoll-tcp").rdma
    with pytest.raises(ValueError, match="/rdma"):
        parse_system("fastcoll-zmq/rdma")
    tuned = parse_system("fastcoll-tcp/py/doubling=0/yield_reads=0")
    assert tuned.python_engine and tuned.tuning == ("doubling=0", "yield_reads=0")
    with pytest.raises(ValueError, match="KEY=VALUE for fastcoll"):
        parse_system("mpi/doubling=0")
    assert harness.rotated([1, 2, 3], 1) == [2, 3, 1]
    text = 'noise\n[1] {"points": [], "system": "x"}\n{"other": 1}\n{"points": [2]} trailing\n'
    assert harness.documents(text, "points") == [{"points": [], "system": "x"}, {"points": [2]}]
    assert harness.documents("no json here {", "points") == []


def test_run_job_collects_documents_failures_and_timeouts() -> None:
    """The runner every entry point uses: rank 0's document, a failed rank's exit and output,
    and a job past its timeout ended (with what its rank 0 had printed before)."""
    py = sys.executable
    ok = harness.run_job([([py, "-c", 'print("[0] {\\"points\\": [1]}")'], {}),
                          ([py, "-c", "pass"], {})], timeout=30)
    assert ok.error is None and ok.doc == {"points": [1]}
    bad = harness.run_job([([py, "-c", "import sys; print('boom'); sys.exit(3)"], {})], timeout=30)
    assert bad.doc is None and bad.error.startswith("process 0 exited with 3") and "boom" in bad.error
    t0 = __import__("time").monotonic()
    slow = harness.run_job([([py, "-c", 'import time; print("{\\"points\\": []}", flush=True); '
                                        'time.sleep(60)'], {})], timeout=2)
    assert slow.error.startswith("timed out after 2 s") and slow.doc == {"points": []}
    assert __import__("time").monotonic() - t0 < 20


def test_quick_run(tmp_path: Path) -> None:
    """A real --quick run: every system present measures, the outputs agree with the formulas."""
    out = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--quick", "--ops",
           "all_reduce,all_gather,broadcast", "--sizes", "4,4096", "--iters", "3",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=ROOT)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "results.json").read_text())
    for name, reason in doc["skipped"].items():
        print(f"skipped {name}: {reason}")
    for f in doc["failures"]:
        print(f"failed {f['system']}: {f['error']}")
    ran = {p["system"] for p in doc["points"]}
    assert ran, "no system ran"
    assert not [p for p in doc["points"] if p["status"] == "check failed"]
    for p in doc["points"]:
        if p["status"] != "ok":
            continue
        assert 0 < p["min_s"] <= p["median_s"] <= p["p90_s"] < 10
        want = metrics.busbw(p["op"], 2, p["bytes"], p["median_s"]) / metrics.GB
        assert p["busbw_GBps"] == pytest.approx(want)
        assert p["algbw_GBps"] == pytest.approx(p["bytes"] / p["median_s"] / metrics.GB)
        assert p["cpu_s"] > 0  # each rank's CPU time per call
    ok = {(p["system"], p["op"], p["size"]): p for p in doc["points"] if p["status"] == "ok"}
    for rec in doc["ratios"]:
        f = ok[(rec["fastcoll"], rec["op"], rec["size"])]
        q = ok[(rec["peer"], rec["op"], rec["size"])]
        assert rec["speedup"] == pytest.approx(q["median_s"] / f["median_s"])
    md = (out / "results.md").read_text()
    assert "## all_reduce, 2 ranks" in md and "| 4 KiB |" in md and "CPU time per collective" in md
    for name in doc["skipped"]:
        assert f"**{name} skipped**" in md
    if "plots skipped" not in r.stdout:
        assert (out / "latency.png").stat().st_size > 0 and (out / "busbw.png").stat().st_size > 0


def test_gate_profile_summary_is_read_from_the_log() -> None:
    """gate_bench reads FASTCOLL_GATE_PROFILE's summary from the `fastcoll` logger, as a user
    would: the line the gate's profile logs is the line it keeps."""
    import logging

    from bench.gate_bench import ProfileLines
    from fastcoll.gate.host.profile import GateProfile, GateTiming

    lines, log = ProfileLines(), logging.getLogger("fastcoll.gate")
    level = log.level
    log.setLevel(logging.INFO)  # as the gate does when FASTCOLL_GATE_PROFILE=1
    try:
        profile = GateProfile(warmup=0, logger=log)
        profile.record(GateTiming(1, 2.0, 3.0, 4.0, 5.0, 6, "ok"))
        profile.log_summary()
    finally:
        logging.getLogger("fastcoll").removeHandler(lines)
        log.setLevel(level)
    assert len(lines.lines) == 1 and "arrival wait 2.0 us" in lines.lines[0], lines.lines


def _run(args: list[str], timeout: float) -> str:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_gate_bench_on_the_cpu(tmp_path: Path) -> None:
    """gate_bench's ranks and kill parts, run where the gate is off: every run's chain gives the
    right tokens on both ranks, the exact gates are all right, and a rank killed mid-token makes
    its peer raise PeerLostError within the timeout, its device still running."""
    pytest.importorskip("mlx.core")
    _run(["bench/gate_bench.py", "ranks", "--tokens", "2", "--ops", "3", "--rows", "16:float32,512:bfloat16",
          "--exact", "64", "--timeout", "30", "--out", str(tmp_path)], 240)
    for run in ("host", "gate", "gatehost"):
        docs = json.loads((tmp_path / f"gate_ranks_{run}.json").read_text())
        assert [d["rank"] for d in docs] == [0, 1], docs
        assert all(d["float32_16"]["serial"]["median"] > 0 and d["bfloat16_512"]["serial"]["n"] == 2 for d in docs)
        assert ("pipelined" in docs[0]["float32_16"]) == (run != "host")
    gatehost = json.loads((tmp_path / "gate_ranks_gatehost.json").read_text())
    assert all(d["exact"] == {"gates": 64, "wrong": 0, "error": None} for d in gatehost)
    assert "| bfloat16_512 |" in (tmp_path / "gate_ranks_results.md").read_text()
    _run(["bench/gate_bench.py", "kill", "--timeout", "20", "--out", str(tmp_path)], 240)
    for run in ("kill_direct", "kill_hostmode"):
        res = json.loads((tmp_path / f"{run}.json").read_text())
        assert res["error"].startswith("PeerLostError") and res["seconds_to_error"] < 20, res
        assert res["device_runs_after"] is True


def test_decode_bench_on_the_cpu(tmp_path: Path) -> None:
    """decode_bench's tiny llama through mlx-lm on the CPU: one process, two ranks on the host
    path and two 'gate' ranks (the host path here) make the same tokens; the floor's two ranks,
    their all-reduces left out, do not, and the table marks it."""
    pytest.importorskip("mlx_lm")
    out = _run(["bench/decode_bench.py", "--shape", "tiny", "--tokens", "12", "--runs", "single,host,gate,floor",
                "--out", str(tmp_path)], 400)
    results = json.loads((tmp_path / "decode_tiny.json").read_text())
    assert [results[r]["world"] for r in ("single", "host", "gate", "floor")] == [1, 2, 2, 2], results
    assert results["gate"]["tokens"] == results["host"]["tokens"] and len(results["host"]["tokens"]) == 12
    assert results["floor"]["tokens"] != results["host"]["tokens"]
    assert all(doc["ms_per_token"] > 0 for doc in results.values())
    assert "| gate |" in out and out.count("| True |") >= 2 and "| False (a floor) |" in out, out


def _tokens(stdout: str) -> list[int]:
    line = next(line for line in stdout.splitlines() if "RESULT " in line)
    return json.loads(line.split("RESULT ", 1)[1])["tokens"]


def test_tp_worker_floor_leaves_the_all_reduces_out() -> None:
    """tp_worker's --no-exchange (bench/hostbed.py's decode floor): two ranks run the split model
    without its all-reduces, so their tokens are not the whole model's, which the same split with
    its all-reduces makes; a pipeline has no such floor and is refused."""
    pytest.importorskip("mlx_lm")
    worker = ["bench/workers/tp_worker.py", "--tokens", "8", "--repeat", "1"]
    ranks = ["-m", "fastcoll.launch", "-n", "2", "--timeout", "200", sys.executable, "-m", "fastcoll.mlx_compat"]
    single = _tokens(_run([*worker, "--mode", "single"], 200))
    assert _tokens(_run([*ranks, *worker, "--mode", "tp"], 240)) == single
    assert _tokens(_run([*ranks, *worker, "--mode", "tp", "--no-exchange"], 240)) != single
    r = subprocess.run([sys.executable, *worker, "--mode", "pp", "--no-exchange"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--no-exchange is for --mode tp" in r.stderr, r.stderr
