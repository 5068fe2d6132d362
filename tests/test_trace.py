"""FASTCOLL_TRACE writes a Chrome trace per rank with every collective's phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_ok, free_port, rank_env
from engines import engines, native_missing


# The phases within a call, as both engines write them (the native engine notes them in C).
PHASES = {"send", "wait", "receive", "reduce", "flush"}
# trace_worker.py's all_reduces of 16, 1 << 20 and 16 float32 on two ranks: each rank sends and
# receives 64 bytes of each small one and half the large one twice (a reduce_scatter and an
# all_gather), on either engine.
MOVED = 64 + 4 * (1 << 20) + 64


@pytest.mark.parametrize("engine", engines())
def test_trace_has_every_phase_per_rank(launch, tmp_path, engine):
    """Both engines write each call's phases (the native engine's noted by its C schedules),
    inside the call's span, with the peer and the bytes of every send and receive."""
    path = tmp_path / "trace.json"
    assert_ok(launch(2, "trace_worker.py", FASTCOLL_TRACE=str(path), FASTCOLL_NATIVE=engine).wait(60))
    files = [tmp_path / f"trace.rank{r}.json" for r in range(2)]
    for r, f in enumerate(files):
        events = json.loads(f.read_text())["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        names = {e["name"].split("(")[0] for e in spans}
        assert {"queue", "all_reduce"} | PHASES <= names, names
        assert all(e["pid"] == r and e["dur"] >= 0 for e in spans)
        calls = [e for e in spans if e["name"].startswith("all_reduce(")]
        assert len(calls) == 3
        inner = [e for e in spans if e["name"] in PHASES]
        assert all(any(c["ts"] <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 1 for c in calls)
                   for e in inner), "a phase outside every call"
        for name in ("send", "receive"):
            moved = [e for e in inner if e["name"] == name]
            assert {e["args"]["peer"] for e in moved} == {1 - r}, moved
            assert sum(e["args"]["bytes"] for e in moved) == MOVED, name
    merged = tmp_path / "merged.json"
    out = subprocess.run(
        [sys.executable, "-m", "fastcoll.trace", str(merged), *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    assert "wrote" in out
    assert {e["pid"] for e in json.loads(merged.read_text())["traceEvents"]} == {0, 1}


@pytest.mark.parametrize("engine", engines())
def test_a_failed_call_keeps_its_phases(launch, tmp_path, engine):
    """A call that times out is traced up to its failure: its span, and within it the send that
    went before (on the native engine its phases come back with the error)."""
    path = tmp_path / "trace.json"
    results = launch(2, "trace_worker.py", "fail", FASTCOLL_TRACE=str(path), FASTCOLL_NATIVE=engine).wait(60)
    assert_ok(results)
    assert "timed out:" in results[0].out, results[0].out
    spans = [e for e in json.loads((tmp_path / "trace.rank0.json").read_text())["traceEvents"] if e["ph"] == "X"]
    calls = [e for e in spans if e["name"].startswith("all_reduce(")]
    sends = [e for e in spans if e["name"] == "send"]
    assert len(calls) == 1 and sends and all(e["args"] == {"peer": 1, "bytes": 64} for e in sends), spans
    assert all(calls[0]["ts"] <= e["ts"] <= calls[0]["ts"] + calls[0]["dur"] for e in sends)


def test_the_native_engine_keeps_a_calls_first_phases_and_counts_the_rest(launch, tmp_path):
    """A call of more phases than its buffer holds (1 MiB by the ring in 64-byte pieces: about
    49,000) keeps the first 16,384 and says how many it dropped."""
    if native_missing():
        pytest.skip(f"the bound is the native engine's, which is not built: {native_missing()}")
    path = tmp_path / "trace.json"
    tuning = "piece_bytes=64,direct_max_bytes_two_ranks=0"
    assert_ok(launch(2, "trace_worker.py", "many", FASTCOLL_TRACE=str(path), FASTCOLL_NATIVE="1",
                     FASTCOLL_TUNING=tuning).wait(120))
    for r in range(2):
        spans = [e for e in json.loads((tmp_path / f"trace.rank{r}.json").read_text())["traceEvents"]
                 if e["ph"] == "X"]
        calls = [e for e in spans if e["name"].startswith("all_reduce(")]
        assert len(calls) == 1 and calls[0]["args"]["dropped"] > 16384, calls
        assert sum(e["name"] in PHASES for e in spans) == 16384


@pytest.mark.parametrize("traced", [0, 1])
def test_one_rank_may_trace_alone(launch, tmp_path, traced):
    """FASTCOLL_TRACE is each rank's own setting: a traced rank sends what its untraced peers
    expect (on the native engine a traced call runs natively, as its peers' do), small and
    large calls alike, on four ranks (where the native engine's small calls double)."""
    path = tmp_path / "trace.json"
    job = launch(4, "trace_worker.py", per_rank_env=lambda r: {"FASTCOLL_TRACE": str(path)} if r == traced else {})
    assert_ok(job.wait(90))
    assert (tmp_path / f"trace.rank{traced}.json").exists()
    assert not any((tmp_path / f"trace.rank{r}.json").exists() for r in range(4) if r != traced)


def _merge(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastcoll.trace", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)


def _rank_traces(folder) -> dict:
    """Two small rank traces in `folder`, as FASTCOLL_TRACE=t.json leaves them: name -> bytes."""
    made = {}
    for r in range(2):
        data = json.dumps({"traceEvents": [{"name": "x", "ph": "X", "pid": r, "tid": 1, "ts": 0, "dur": 1}]})
        (folder / f"t.rank{r}.json").write_text(data)
        made[f"t.rank{r}.json"] = data.encode()
    return made


@pytest.mark.parametrize("argv, why", [
    (["t.rank0.json", "t.rank1.json"], "is named like a rank's trace"),  # `t.rank*.json`: no output named
    (["t.rank1.json", "t.rank0.json", "t.rank1.json"], "is also an input"),
    (["./t.rank0.json", "t.rank0.json"], "is also an input"),
    (["t.rank7.json", "t.rank0.json", "t.rank1.json"], "is named like a rank's trace"),
])
def test_merge_never_overwrites_an_input(tmp_path, argv, why):
    made = _rank_traces(tmp_path)
    p = _merge(*argv, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "", p
    assert len(p.stderr.splitlines()) == 1 and why in p.stderr, p.stderr
    assert p.stderr.startswith("python -m fastcoll.trace: the output ") and "merged.json" in p.stderr
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == made  # nothing written, nothing lost


def test_merge_help_and_missing_or_bad_inputs(tmp_path):
    _rank_traces(tmp_path)
    helped = _merge("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "MERGED.json" in helped.stdout, helped
    missing = _merge("merged.json", "t.rank0.json", "nope.rank1.json", "gone.json", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr == "python -m fastcoll.trace: no such trace file: nope.rank1.json (and 1 more)\n"
    (tmp_path / "junk.json").write_text("{not json")
    bad = _merge("merged.json", "t.rank0.json", "junk.json", cwd=tmp_path)
    assert bad.returncode == 2 and not (tmp_path / "merged.json").exists()
    assert bad.stderr == ("python -m fastcoll.trace: junk.json is not a trace (JSON with traceEvents, "
                          "as FASTCOLL_TRACE writes)\n")
    ok = _merge("merged.json", "t.rank0.json", "t.rank1.json", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout == "wrote 2 events from 2 file(s) to merged.json\n", ok


@pytest.mark.parametrize("trace, why", [
    ("{tmp}/no/such/dir/t.json", "the directory {tmp}/no/such/dir does not exist"),
    ("{tmp}/t.json", "{tmp}/t.rank0.json is a directory"),
])
def test_init_checks_the_trace_path_at_once(tmp_path, trace, why):
    """A bad FASTCOLL_TRACE fails init() at once, before the rendezvous (whose peer never comes
    here), not at finalize() after the job ran."""
    (tmp_path / "t.rank0.json").mkdir()
    trace, why = trace.format(tmp=tmp_path), why.format(tmp=tmp_path)
    env = rank_env(0, 2, free_port(), timeout="30", FASTCOLL_TRACE=trace)
    code = "import fastcoll\ntry:\n    fastcoll.init()\nexcept ValueError as e:\n    print(e)\n"
    began = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - began < 15, "init() waited for the rendezvous first"
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"FASTCOLL_TRACE must be path.json in an existing directory this rank may write "
                        f"to; {why} (FASTCOLL_TRACE={trace!r})\n")


def test_the_agent_checks_a_trace_path_as_init_does(tmp_path, monkeypatch):
    """The launcher's agent (which cannot import fastcoll on a remote host) has its own copy of
    check_path's rule; both say the same of the same paths."""
    from fastcoll.launch.agent import trace_problem
    from fastcoll.trace import check_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.rank3.json").mkdir()
    for path in ["t.json", "d/t.json", "d/t", "missing/t.json", str(tmp_path / "missing" / "t.json"), "d/t.txt"]:
        try:
            check_path(path, 3)
            said = None
        except ValueError as e:
            said = str(e)
        assert trace_problem(path, "3") == said, path
    assert trace_problem("d/t", "3") is not None and trace_problem("", "0") is None
