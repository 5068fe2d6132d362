"""Every argument the ranks must share is checked before a collective returns anything: ranks
that disagree on a root (broadcast, scatter, reduce, gather: the rooted collectives, in which
some ranks only send), on an all_to_all_v pair's counts or on all_gather_v's sizes raise a
MismatchError naming both calls, on both engines, at 2 and 3 ranks (tests/progs/agreement_worker.py).
A broadcast whose ranks each passed their own rank as the root used to return every rank's own
array; all_to_all_v whose receiver expected one piece of two returned it cut short."""

from __future__ import annotations

import re

import pytest

from conftest import Result
from engines import engines

WORKER = "agreement_worker.py"
KINDS = ["broadcast", "scatter", "reduce", "gather"]


def last_lines(results: list[Result]) -> list[str]:
    """Each rank's last line, once every rank exited 0 and printed one."""
    lines = []
    for r in results:
        assert r.code == 0 and r.out.strip(), f"rank {r.rank} exited {r.code}\n{r.out}\n{r.err[-3000:]}"
        lines.append(r.out.strip().splitlines()[-1])
    return lines


def signatures(line: str, kind: str) -> set[str]:
    """The signatures of `kind` that a MismatchError line names."""
    return set(re.findall(rf"called ({kind}\([^ ]*\))", line))


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", [f"root-{k}" for k in KINDS] + [f"odd-root-{k}" for k in KINDS]
                         + ["root-broadcast-large", "root-reduce-large"])
def test_ranks_that_disagree_on_the_root_all_raise(launch, case, world, engine):
    kind = case.removeprefix("odd-").removeprefix("root-").removesuffix("-large")
    results = launch(world, WORKER, case, FASTCOLL_NATIVE=engine, timeout="20").wait(timeout=90)
    for r, line in enumerate(last_lines(results)):
        assert "AGREED" in results[r].out, results[r].out
        assert line.startswith("ERROR MismatchError "), f"rank {r}: {line}"
        assert len(signatures(line, kind)) == 2, f"rank {r}: both roots named: {line}"


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_all_to_all_v_pair_that_disagrees_on_its_counts_raises_on_both_ends(launch, world, transport, engine):
    # Rank 1 expects 16384 elements (one piece) from rank 0, which sends 32768 (two pieces): the
    # first piece matched what rank 1 expected, and rank 1 returned it without the second.
    results = launch(world, WORKER, "counts", transport=transport, FASTCOLL_NATIVE=engine,
                     FASTCOLL_TUNING="piece_bytes=65536", timeout="20").wait(timeout=90)
    lines = last_lines(results)
    for r in (0, 1):  # the pair; a third rank's own exchanges all agree, and its result stands
        assert lines[r].startswith("ERROR MismatchError "), f"rank {r}: {lines[r]}"
        assert "[elements rank 0 -> rank 1: 32768, rank 1 -> rank 0: 1]" in lines[r], lines[r]
        assert "[elements rank 0 -> rank 1: 16384, rank 1 -> rank 0: 1]" in lines[r], lines[r]
    for line in lines[2:]:
        assert line.startswith(("RESULT all_to_all_v", "ERROR MismatchError ")), line


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_given_different_all_gather_v_sizes_raise_naming_both(launch, world, engine):
    results = launch(world, WORKER, "sizes", FASTCOLL_NATIVE=engine, timeout="20").wait(timeout=90)
    mine = list(range(1, world + 1))
    theirs = mine[:-1] + [world + 1]
    for r, line in enumerate(last_lines(results)):
        assert line.startswith("ERROR MismatchError "), f"rank {r}: {line}"
        assert f"sizes={mine}" in line and f"sizes={theirs}" in line, f"rank {r}: {line}"


def test_the_engines_word_a_pairs_disagreement_alike():
    # The native engine reports what this rank expected as numbers (fc_agree.c): native.py
    # must rebuild the very signature the Python engine compared.
    from fastcoll import wire
    from fastcoll.engine.native import error_from

    sig = "all_to_all_v(float32,(1,))"
    theirs = wire.pair_signature(sig, 0, 1, 32768, 1)
    info = (10, 0, -1, 0, 3, 1 + 16384, 1 + 1, 0, theirs.encode())  # mismatch_call from rank 0
    err = error_from(info, 1, 3, sig)
    assert str(err) == (f"rank 1 called {wire.pair_signature(sig, 1, 0, 1, 16384)} as collective #3 "
                        f"but rank 0 called {theirs} as collective #3"), str(err)
    assert wire.pair_signature(sig, 1, 0, 1, 16384) == wire.pair_signature(sig, 0, 1, 16384, 1)
