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


def test_several_connections_per_peer(launch):
    """FASTCOLL_CONNECTIONS=3 stripes pieces over three sockets per peer; results stay exact."""
    assert_ok(launch(3, "collectives_worker.py", FASTCOLL_CONNECTIONS="3").wait(timeout=120))


def test_ranks_must_agree_on_connections(launch):
    job = launch(2, "collectives_worker.py", per_rank_env=lambda r: {"FASTCOLL_CONNECTIONS": str(r + 1)})
    results = job.wait(timeout=60)
    assert all(r.code != 0 for r in results)
    assert any("FASTCOLL_CONNECTIONS" in r.err for r in results)
