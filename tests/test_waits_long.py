"""The native engine's waits leave their yields out after a long one (FASTCOLL_TUNING's
long_wait_us, which graph mode sets; fastcoll/engine/csrc/fc_wait.c): a rank whose peer works
40 ms before every call yields through the first wait and sleeps through the others, where without
the knob it yields through every one (bench/NOTES.md 80)."""

from __future__ import annotations

import pytest

from conftest import assert_ok
from engines import native_missing


def _cpu_s(launch, tuning: str) -> float:
    results = launch(2, "long_wait_worker.py", FASTCOLL_NATIVE="1", FASTCOLL_TUNING=tuning).wait(timeout=120)
    assert_ok(results)
    out = results[0].out
    assert "; native engine" in out, out
    return float(next(line for line in out.splitlines() if line.startswith("CPU")).split()[1])


@pytest.mark.skipif(native_missing() is not None, reason=f"{native_missing()}")
def test_a_kind_of_call_that_waited_long_sleeps_at_once_next_time(launch):
    # Each wait yields up to 30 ms: all of rank 1's 40 ms of work but the last 10, unless the knob
    # leaves the yields out (12 calls: about 0.36 s of CPU against 0.03 s, the first wait's).
    yielding = _cpu_s(launch, "spin_us=0,yield_us=30000,long_wait_us=0")
    adapting = _cpu_s(launch, "spin_us=0,yield_us=30000,long_wait_us=5000")
    assert yielding > 0.15, f"the yields took {yielding:.3f} s of CPU: did the waits yield at all?"
    assert adapting < yielding / 3, f"{adapting:.3f} s of CPU with long_wait_us against {yielding:.3f} s without"
