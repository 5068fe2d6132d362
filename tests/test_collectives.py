"""Every collective x dtype x world size 1-4 x transport against a numpy reference (real processes)."""

from __future__ import annotations

import pytest

from conftest import assert_ok

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
@pytest.mark.parametrize("world", WORLDS)
def test_every_collective_and_dtype(launch, transport, world):
    job = launch(world, "collectives_worker.py", transport=transport)
    results = job.wait(timeout=120)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}:" in r.out and "checks passed" in r.out
