"""Every collective x dtype x world size 1-4 x transport against a numpy reference (real processes)."""

from __future__ import annotations

import pytest

from conftest import assert_ok
from engines import engines, native_missing

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("transport", ["shm", "tcp", "zmq"])
@pytest.mark.parametrize("world", WORLDS)
def test_every_collective_and_dtype(launch, transport, world):
    job = launch(world, "collectives_worker.py", transport=transport)
    results = job.wait(timeout=120)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}:" in r.out and "checks passed" in r.out


def test_eight_ranks(launch):
    """Recursive doubling over three steps (and the ring past the crossover), 8 processes."""
    results = launch(8, "collectives_worker.py").wait(timeout=240)
    assert_ok(results)
    assert all("checks passed" in r.out for r in results)


def test_several_connections_per_peer(launch):
    """FASTCOLL_CONNECTIONS=3 stripes pieces over three sockets per peer; results stay exact."""
    assert_ok(launch(3, "collectives_worker.py", FASTCOLL_CONNECTIONS="3").wait(timeout=120))


def test_ranks_must_agree_on_connections(launch):
    job = launch(2, "collectives_worker.py", per_rank_env=lambda r: {"FASTCOLL_CONNECTIONS": str(r + 1)})
    results = job.wait(timeout=60)
    assert all(r.code != 0 for r in results)
    assert any("FASTCOLL_CONNECTIONS" in r.err for r in results)


def test_several_addresses_per_host(launch):
    """FASTCOLL_INTERFACE=a,b: a listener on each address and, by default, a connection per
    address to every peer (channel ch goes to the peer's address ch), as MLX's ring uses a
    hostfile's several "ips" (one per Thunderbolt cable). Loopback here: 127.0.0.1 and .2, with
    shared memory off (it would replace connections between ranks of one host)."""
    import json

    results = launch(
        3, "addresses_worker.py", FASTCOLL_INTERFACE="127.0.0.1,127.0.0.2", FASTCOLL_SHM="0"
    ).wait(timeout=120)
    assert_ok(results)
    for r in results:
        doc = json.loads(r.out.strip().splitlines()[-1])
        assert doc["connections"] == 2, doc
        # The ends on this rank's side of the links it accepted, or the peer's side of those it made.
        assert doc["ends"] == ["127.0.0.1", "127.0.0.2"], doc


def test_empty_address_in_a_list_is_refused(launch):
    results = launch(2, "addresses_worker.py", FASTCOLL_INTERFACE="127.0.0.1,,127.0.0.2").wait(timeout=60)
    assert all(r.code != 0 for r in results)
    assert all("FASTCOLL_INTERFACE must be addresses separated by commas" in r.err for r in results), results


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world,piece", [(3, "262144"), (4, "262144"), (4, "65536")])
def test_ring_calls_that_send_more_than_a_link_holds_before_receiving(launch, world, piece, transport, engine):
    """Ring reduce_scatter and all_reduce with 16 or 64 pieces a block: what a rank sends before
    it receives (a block, then the partial sums it forwards) outnumbers what a link holds (shared
    memory: 2 MiB). Two ways this once hung every rank until the timeout: reduce_scatter waited
    for its forwarded pieces to leave before going on, and the Python engine wrote a piece of at
    most 64 KiB on the caller's thread until it all went, not receiving meanwhile."""
    job = launch(world, "ring_backlog_worker.py", transport=transport, FASTCOLL_NATIVE=engine,
                 FASTCOLL_TUNING=f"piece_bytes={piece}", FASTCOLL_TIMEOUT="30")
    results = job.wait(timeout=90)
    assert_ok(results)
    assert all("exact" in r.out for r in results)


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("world", [2, 3])
def test_repeated_calls(launch, world, engine):
    """The same small calls many times (planned after the first on the native engine), between
    calls that take the ordinary way; every result exact (tests/progs/plans_worker.py)."""
    results = launch(world, "plans_worker.py", FASTCOLL_NATIVE=engine).wait(timeout=120)
    assert_ok(results)
    assert all("OK" in r.out for r in results)


def test_zmq_carries_large_calls_whatever_the_rule_names(launch):
    """ZeroMQ bounds a message (wire.MAX_PIECE_BYTES): the Python engine cuts every buffer into
    pieces whatever algorithm the rule names. A direct exchange raised over the bound by
    FASTCOLL_TUNING once sent 8 MiB as one message, which the receiver's ZeroMQ dropped with
    the connection (a PeerLostError on every rank)."""
    job = launch(2, "ring_backlog_worker.py", transport="zmq", FASTCOLL_TIMEOUT="30",
                 FASTCOLL_TUNING="direct_max_bytes_two_ranks=1073741824")
    results = job.wait(timeout=90)
    assert_ok(results)
    assert all("exact" in r.out for r in results)


@pytest.mark.parametrize("tuning", ["direct_max_bytes=0,direct_max_bytes_two_ranks=0",
                                    "direct_max_bytes=1073741824,direct_max_bytes_two_ranks=1073741824"],
                         ids=["large", "small"])
@pytest.mark.parametrize("world", [3, 4])
def test_native_algorithms_at_every_size(launch, world, tuning):
    """The native engine's tuned algorithms are its alone (the Python engine runs one schedule a
    collective): each runs here at every size, empty and one-element buffers too, the large ones
    (ring, pairwise, chain) where the rule gives the small ones and the small ones (direct,
    doubling at 4 ranks) where it gives the large, against numpy."""
    why = native_missing()
    if why is not None:
        pytest.skip(f"no native engine: {why}")
    job = launch(world, "collectives_worker.py", FASTCOLL_NATIVE="1", FASTCOLL_TUNING=tuning)
    results = job.wait(timeout=180)
    assert_ok(results)
    assert all("checks passed" in r.out for r in results)
