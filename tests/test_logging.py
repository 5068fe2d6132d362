"""FASTCOLL_LOG turns fastcoll's logging on without code, and a timeout's message says how long it
waited and which setting to change."""

from __future__ import annotations

import re

import pytest

from conftest import assert_ok
from fastcoll.config import Config


def test_fastcoll_log_info_shows_records_on_stderr(launch):
    results = launch(2, "logging_worker.py", "log", FASTCOLL_LOG="info").wait(timeout=60)
    assert_ok(results)
    for r in results:
        assert re.search(r"fastcoll\S* INFO: rank \d: \d+ of \d+ connections through shared memory", r.err), r.err


def test_without_fastcoll_log_nothing_is_printed(launch):
    results = launch(2, "logging_worker.py", "log").wait(timeout=60)
    assert_ok(results)
    assert all("INFO" not in r.err for r in results)


def test_fastcoll_log_is_checked():
    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}
    assert Config.from_env({**base, "FASTCOLL_LOG": "DEBUG"}).log == "debug"
    with pytest.raises(ValueError, match="FASTCOLL_LOG must be one of warning, info, debug, not 'loud'"):
        Config.from_env({**base, "FASTCOLL_LOG": "loud"})


@pytest.mark.parametrize("limit, setting", [("0.5", "timeout=0.5"), (None, "FASTCOLL_TIMEOUT=1")])
def test_a_timeout_says_how_long_it_waited_and_which_setting_to_change(launch, limit, setting):
    args = ["timeout"] + ([limit] if limit else [])
    results = launch(2, "logging_worker.py", *args, timeout="1").wait(timeout=60)
    line = results[0].out.strip().splitlines()[-1]
    waited = float(limit or 1)
    assert f"it waited {waited:g} s, the call's limit: {setting}; raise it to wait longer" in line, line
    assert "rank 0 timed out waiting for rank 1" in line, line
    took = float(re.match(r"after ([\d.]+) s", line).group(1))
    assert waited - 0.05 < took < waited + 2, line


def test_init_timeout_names_the_setting():
    """Rank 0 of a job whose rank 1 never starts: init() says how long it waited and what to raise."""
    import os
    import subprocess
    import sys

    from conftest import PROGS, free_port, rank_env

    p = subprocess.run([sys.executable, os.path.join(PROGS, "logging_worker.py"), "log"],
                       env=rank_env(0, 2, free_port(), timeout="1"), capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "CollectiveTimeoutError" in p.stderr and "ranks [1] did not connect" in p.stderr, p.stderr
    assert "init() waited 1 s for the job to form: FASTCOLL_TIMEOUT=1; raise it if ranks start further apart" in p.stderr
