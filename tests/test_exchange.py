"""all_to_all(_v), gather, scatter, reduce, all_gather_v, the object collectives, new_group,
isend/irecv and monitored_barrier x dtype x world size 1-4 x transport against a numpy
reference (real processes, tests/progs/exchange_worker.py)."""

from __future__ import annotations

import pytest

from conftest import assert_ok


@pytest.mark.parametrize("transport", ["shm", "tcp", "zmq"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_new_collective_and_dtype(launch, transport, world):
    results = launch(world, "exchange_worker.py", transport=transport).wait(timeout=120)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}:" in r.out and "checks passed" in r.out


@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_all_to_all_against_all_gather_is_a_mismatch_naming_both(launch, transport):
    results = launch(2, "exchange_worker.py", "mismatch", transport=transport).wait(timeout=60)
    assert_ok(results)
    for r in results:
        assert "MismatchError" in r.out and "all_to_all(float32,(4,))" in r.out and "all_gather(float32,(2,))" in r.out, r.out


@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(launch, transport):
    results = launch(3, "exchange_worker.py", "monitor", transport=transport, timeout="10").wait(timeout=60)
    assert_ok(results)
    for r in results[:2]:
        assert "rank(s) [2] did not arrive" in r.out, r.out + r.err
        seconds = float(r.out.split("after ")[1].split("s:")[0])
        assert seconds < 3, r.out
