"""init() times recursive doubling against direct sends where the job's hosts would make doubling
cross the network twice (fastcoll/doubling_probe.py), and every rank keeps the agreed faster one.

Four local ranks each claim a host of their own (tests/progs/probe_worker.py patches the host id
the rendezvous table carries), so they talk TCP over loopback as four hosts would; the test hook
slows one algorithm's timed calls by 2 ms on every rank, so the outcome is decided on purpose,
not by the machine's noise."""

from __future__ import annotations

import time

import pytest

from conftest import assert_ok
from engines import native_missing
from fastcoll.doubling_probe import ROUNDS, _WARM

WORKER = "probe_worker.py"
TIMED = ROUNDS + _WARM  # each algorithm's probe calls, warming ones included


def chosen(results) -> list[list[str]]:
    """Each rank's printed line, as words: ['chose', ALG, 'split', ALG, 'timed', N, M]."""
    assert_ok(results)
    return [next(l for l in r.out.splitlines() if l.startswith("chose ")).split() for r in results]


@pytest.fixture
def native():
    why = native_missing()
    if why is not None:
        pytest.skip(f"no native engine: {why}")


@pytest.mark.parametrize("delayed,want", [("direct", "doubling"), ("doubling", "direct")])
def test_every_rank_keeps_the_algorithm_timed_faster(launch, native, delayed, want):
    lines = chosen(launch(4, WORKER, delayed, transport="tcp", FASTCOLL_NATIVE="1").wait(90))
    for words in lines:
        assert words[1] == want and words[3] == want, lines  # the job's group, and its split
        assert words[5:] == [str(TIMED), str(TIMED)], lines


def test_the_users_choice_is_not_timed(launch, native):
    # FASTCOLL_TUNING's doubling wins: no probe, even where one algorithm is slowed.
    for tuned, want in (("doubling=0", "direct"), ("doubling=1", "doubling")):
        lines = chosen(launch(4, WORKER, "direct", transport="tcp", FASTCOLL_NATIVE="1",
                              FASTCOLL_TUNING=tuned).wait(90))
        assert all(w[1] == want and w[3] == want and w[5:] == ["0", "0"] for w in lines), (tuned, lines)


def test_two_hosts_and_the_python_engine_are_not_timed(launch):
    # Two ranks always go direct; the pure-Python engine runs one schedule whatever the rule says.
    lines = chosen(launch(2, WORKER, "none", transport="tcp").wait(60))
    assert all(w[1] == "direct" and w[5:] == ["0", "0"] for w in lines), lines
    lines = chosen(launch(4, WORKER, "direct", transport="tcp", FASTCOLL_NATIVE="0").wait(90))
    assert all(w[5:] == ["0", "0"] for w in lines), lines


def test_a_rank_lost_while_timing_fails_init_naming_it(launch, native):
    # The last rank exits inside its first timed call: the others' init() raises within the
    # timeout, naming it, and leaves nothing running (the job's group is finalized).
    started = time.monotonic()
    results = launch(4, WORKER, "die", transport="tcp", FASTCOLL_NATIVE="1", timeout="10").wait(60)
    assert time.monotonic() - started < 30, [r.out for r in results]
    assert results[3].code == 3, results[3].err
    for r in results[:3]:
        assert r.code == 0, r.err
        line = next(l for l in r.out.splitlines() if l.startswith("init failed: "))
        assert "rank 3" in line, line
