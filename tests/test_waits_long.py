"""The native engine's waits leave their yields out after a long one (FASTCOLL_TUNING's
long_wait_us, which graph mode sets where ranks share CPUs; fastcoll/engine/csrc/core/fc_wait.c): a rank
whose peer works 40 ms before every call yields through the first wait and sleeps through the
others, where without the knob it yields through every one (bench/NOTES.md 80). Where a rank has
CPUs to spare, graph mode yields through such waits instead (config.for_host, NOTES 92)."""

from __future__ import annotations

import os
import socket

import pytest

from conftest import assert_ok
from engines import native_missing
from fastcoll import config


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


@pytest.mark.parametrize("env, cpus_per_rank, want", [
    ({"FASTCOLL_MLX_GRAPH": "1"}, 3, (20000, 0)),  # CPUs to spare: graph mode yields through a stage
    ({"FASTCOLL_MLX_GRAPH": "1"}, 8, (20000, 0)),
    ({"FASTCOLL_MLX_GRAPH": "1"}, 2, (2000, 1000)),  # the bed's hosts, ranks that share CPUs: the sleeps stay
    ({"FASTCOLL_MLX_GRAPH": "1"}, 2.5, (2000, 1000)),
    ({"FASTCOLL_MLX_GRAPH": "1", "FASTCOLL_TUNING": "yield_us=300"}, 16, (300, 0)),  # a knob the user set stays
    ({"FASTCOLL_MLX_GRAPH": "1", "FASTCOLL_TUNING": "long_wait_us=50"}, 16, (20000, 50)),
    ({"FASTCOLL_MLX_GRAPH": "0"}, 16, (0, 0)),  # outside graph mode an MLX program's waits sleep at once
    ({}, 16, (20000, 0)),  # graph mode is the default
    ({}, 2, (2000, 1000)),
    ({"FASTCOLL_MLX_GRAPH": "1", "FASTCOLL_FAST_SYNC": "1"}, 16, (5000, 0)),  # the gate's waits are its own
])
def test_graph_mode_yields_through_where_cpus_are_spare(env, cpus_per_rank, want):
    c = config.for_host(config.for_mlx(config.Config.from_env(env)), cpus_per_rank)
    assert (c.yield_us, c.long_wait_us) == want


def test_only_an_mlx_programs_graph_waits_change():
    """A program that sets FASTCOLL_MLX_GRAPH without fastcoll.mlx_compat keeps the default waits."""
    c = config.Config.from_env({"FASTCOLL_MLX_GRAPH": "1"})
    assert config.for_host(c, 16) == c


@pytest.mark.skipif(native_missing() is not None, reason=f"{native_missing()}")
@pytest.mark.parametrize("machine, mine, local_ranks, want", [
    (16, 16, 2, (20000, 0)),
    (2, 2, 2, (2000, 1000)),
    (16, 1, 1, (2000, 1000)),  # a rank bound to one core has none to spare for a wait
    (4, None, 1, (20000, 0)),  # no affinity mask (macOS): the machine's share
])
def test_native_engine_takes_this_hosts_waits(monkeypatch, machine, mine, local_ranks, want):
    """NativeEngine.over makes its engine with config.for_host's waits for this host's CPUs."""
    from fastcoll.engine import native
    made = []

    class Engine:  # records the waits the engine was made with, and fails at the first link
        def __init__(self, *, rank, size, channels, spin_us, yield_us, main_thread, long_wait_us):
            made.append((yield_us, long_wait_us))
            self.links = self

        def add(self, *args, **kwargs):
            raise OSError("no link in this test")

        def close(self, *args):
            pass

    class Link:
        kind, segment = "tcp", None

        def __init__(self, sock):
            self.sock = sock

        def close(self):
            self.sock.close()

    monkeypatch.setattr(native._native, "Engine", Engine)
    monkeypatch.setattr(os, "cpu_count", lambda: machine)
    if mine is None:
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(mine)))
    c = config.for_mlx(config.Config.from_env({"FASTCOLL_MLX_GRAPH": "1"}))
    a, b = socket.socketpair()
    with a, b, pytest.raises(OSError, match="no link in this test"):
        native.NativeEngine.over(c, {1: [Link(a)]}, local_ranks)
    assert made == [want]
