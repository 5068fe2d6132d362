"""FASTCOLL_TRACE writes a Chrome trace per rank with every collective's phases."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, assert_ok


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
