"""FASTCOLL_TRACE writes a Chrome trace per rank with every collective's phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_ok, free_port, rank_env


def test_trace_has_every_phase_per_rank(launch, tmp_path):
    path = tmp_path / "trace.json"
    assert_ok(launch(2, "trace_worker.py", FASTCOLL_TRACE=str(path)).wait(60))
    files = [tmp_path / f"trace.rank{r}.json" for r in range(2)]
    for r, f in enumerate(files):
        events = json.loads(f.read_text())["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        names = {e["name"].split("(")[0] for e in spans}
        assert {"queue", "all_reduce", "send", "wait", "receive", "reduce", "flush"} <= names, names
        assert all(e["pid"] == r and e["dur"] >= 0 for e in spans)
        assert sum(e["name"].startswith("all_reduce(") for e in spans) == 3
    merged = tmp_path / "merged.json"
    out = subprocess.run(
        [sys.executable, "-m", "fastcoll.trace", str(merged), *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    assert "wrote" in out
    assert {e["pid"] for e in json.loads(merged.read_text())["traceEvents"]} == {0, 1}


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
