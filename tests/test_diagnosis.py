"""Who stopped answering (fastcoll/diagnosis.py): the rule on its own, and the ranks of an
in-process job (threads over the in-process transport) comparing whom they wait for."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import fastcoll
from fastcoll.config import Config
from fastcoll.diagnosis import explain
from fastcoll.errors import CollectiveTimeoutError
from fastcoll.group import Group
from fastcoll.engine.python import PythonEngine
from fastcoll.transport.inproc import mesh

HOSTS = ["host1", "host2", "host3", "host4"]


def test_a_chain_of_waits_ends_at_the_silent_rank():
    # rank 2's link is cut: 3 and 1 wait for it, 0 waits for 3
    reports = {0: 3, 1: 2, 3: 2}
    for me in (0, 1, 3):
        culprit, why = explain(me, 4, reports, set(), HOSTS)
        assert culprit == 2, why
        assert "rank 2 (host host3) stopped answering" in why
    assert "rank 0 waits for rank 3, rank 3 waits for rank 2" in explain(0, 4, reports, set(), HOSTS)[1]


def test_a_rank_that_heard_from_nobody_names_its_own_link():
    culprit, why = explain(2, 4, {2: 1}, set(), HOSTS)
    assert culprit == 2 and "no rank answered rank 2 (host host3)" in why


def test_a_lost_peer_and_a_peer_that_gave_up_otherwise():
    assert explain(0, 3, {0: 1, 2: 1}, {1}, HOSTS)[0] == 1
    culprit, why = explain(0, 3, {0: 1, 1: None}, set(), HOSTS)
    assert culprit == 1 and "waits for nobody" in why


def test_a_cycle_of_waits_is_named_as_one():
    culprit, why = explain(0, 3, {0: 1, 1: 2, 2: 0}, set(), HOSTS)
    assert culprit is None and "cycle (0 -> 1 -> 2 -> 0: rank 0 (host host1), rank 1 (host host2), rank 2 (host host3))" in why


def test_of_two_ranks_that_heard_nothing_each_names_the_other():
    for me in (0, 1):
        culprit, why = explain(me, 2, {me: 1 - me}, set(), HOSTS)
        assert culprit == 1 - me and f"rank {1 - me} (host {HOSTS[1 - me]}) stopped answering" in why


def test_ranks_of_a_ring_name_the_silent_one_not_their_neighbour():
    """Four ranks, the ring forced; rank 2 never calls. Without the comparison rank 0 would
    blame rank 3 (its left neighbour, itself waiting); with it every rank names rank 2."""
    n, silent = 4, 2
    transports = mesh(n)
    groups = [Group(Config(rank=r, world_size=n, timeout=0.6, direct_max_bytes=0, direct_max_bytes_two_ranks=0,
                           doubling=False), PythonEngine(transports[r]), None, HOSTS) for r in range(n)]
    errors: dict[int, BaseException | None] = {}

    def rank(r: int) -> None:
        try:
            fastcoll.all_reduce(np.ones(4096, np.float32), group=groups[r])
            errors[r] = None
        except BaseException as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,), name="rank") for r in range(n) if r != silent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    try:
        assert not any(t.is_alive() for t in threads)
        for r in (0, 1, 3):
            e = errors[r]
            assert isinstance(e, CollectiveTimeoutError), (r, e)
            assert "rank 2 (host host3) stopped answering" in str(e), (r, e)
    finally:
        for g in groups:
            g.finalize()


@pytest.mark.parametrize("silent", [0, 1])
def test_two_ranks_name_the_one_that_is_silent(silent):
    n = 2
    transports = mesh(n)
    groups = [Group(Config(rank=r, world_size=n, timeout=0.3), PythonEngine(transports[r]), None, HOSTS) for r in range(n)]
    me = 1 - silent
    try:
        with pytest.raises(CollectiveTimeoutError, match=f"rank {silent} \\(host {HOSTS[silent]}\\) stopped answering: it stopped, or the network between it and rank {me}"):
            fastcoll.all_reduce(np.ones(4, np.float32), group=groups[me])
    finally:
        for g in groups:
            g.finalize()


def test_a_wait_that_names_no_rank_still_names_the_silent_one():
    assert explain(0, 3, {0: None, 1: 0}, set(), HOSTS)[0] == 2
    assert explain(0, 3, {0: None, 1: 0, 2: 0}, set(), HOSTS)[0] is None
    assert explain(0, 3, {0: None, 1: 0}, {2}, HOSTS)[0] == 2


def test_a_rank_told_at_once_that_the_others_waited_for_it_came_late():
    # rank 2 enters the call after the others' limit ran out: rank 3 waited for it, and rank 2
    # hears rank 3's notice while it waits for rank 3 in turn
    culprit, why = explain(2, 4, {2: 3, 3: 2, 1: 3, 0: 2}, set(), HOSTS, late=True)
    assert culprit == 2 and "rank 3 waits for rank 2 (host host3): rank 2 (host host3), this rank, came to the call only after" in why
    # the same reports from a rank that had waited its limit: a cycle, not a late rank
    assert explain(2, 4, {2: 3, 3: 2, 1: 3, 0: 2}, set(), HOSTS)[0] is None


@pytest.mark.parametrize("transport", ["tcp", "shm", "zmq"])
@pytest.mark.parametrize("order", ["", "two notices at once"])
def test_real_ranks_name_the_silent_one(launch, transport, order):
    """Four rank processes, rank 2 silent: every other names rank 2 and its host. The ranks
    that have already sent their data to a rank when they compare notices must leave that data
    unread (a TCP rank that re-read it as a header took rank 2 for gone: 'malformed frame').
    With two notices at once, rank 1 (its notice held back) gets rank 3's and then rank 0's
    before it reads either, the order of a loaded machine; with no spinning reads it takes both
    in one go. A ZeroMQ rank that kept only the last notice it had not raised then never heard
    rank 3's and named rank 3 as the silent one."""
    host = socket.gethostname()
    args, env = (["1", "2", "1", "0"], {"FASTCOLL_TUNING": "spin_reads=0"}) if order else (["1", "2"], {})
    results = launch(4, "diagnosis_worker.py", *args, transport=transport, **env).wait(timeout=60)
    for r in results:
        if r.rank == 2:
            continue
        line = r.out.strip().splitlines()[-1] if r.out.strip() else r.err[-2000:]
        assert line.startswith("CollectiveTimeoutError"), (r.rank, line)
        assert f"rank 2 (host {host}) stopped answering (it told no rank whom it waits for)" in line, (r.rank, line)


@pytest.mark.parametrize("transport", ["tcp", "shm", "zmq"])
def test_data_that_came_before_the_timeout_is_no_answer(launch, transport):
    """Three rank processes: rank 0 sends rank 2 a message, then ranks 0 and 1 fall silent; rank
    2's wait for rank 1 runs out. What rank 0 had sent before is no answer to rank 2's notice, so
    rank 2 heard from nobody and names its own network. (A host of the bed that vanished named
    its neighbour in CI: the neighbour's data from before the cut counted as an answer.)"""
    host = socket.gethostname()
    results = launch(3, "diagnosis_stale_worker.py", "1", transport=transport).wait(timeout=60)
    r = results[2]
    line = r.out.strip().splitlines()[-1] if r.out.strip() else r.err[-2000:]
    assert line.startswith("CollectiveTimeoutError"), line
    assert f"no rank answered rank 2 (host {host}): its own network (or every peer at once) failed" in line, line


def test_a_message_cut_off_midway_names_its_sender():
    """A wait that runs out inside a payload says whom it waited for, as one for a header does:
    it was reported as waiting for nobody, and the peer named this rank ('gave up for another
    reason') when a striped message's link was cut (tests/test_multihost.py)."""
    from fastcoll.transport.tcp import _Reader

    a, b = socket.socketpair()
    try:
        a.settimeout(0.02)  # the transport's slices: a slice without data comes back to check the deadline
        b.sendall(b"x" * 10)
        reader = _Reader(a, peer=3, me=0)
        with pytest.raises(CollectiveTimeoutError, match="10 of 100 bytes arrived") as e:
            reader.read_into(memoryview(bytearray(100)), deadline=time.monotonic() + 0.1)
        assert e.value.waiting_for == 3
    finally:
        a.close()
        b.close()
    # and the two ranks of such a job: a cycle between them, each named with its host
    culprit, why = explain(1, 2, {1: 0, 0: 1}, set(), HOSTS)
    assert culprit is None and "(1 -> 0 -> 1: rank 1 (host host2), rank 0 (host host1))" in why
