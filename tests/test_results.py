"""Large numpy results over memory the native engine keeps between calls
(fastcoll/engine/csrc/binding/py_results.c, Group.empty): the cache on its own, and collectives across
real processes on both engines, whose results stay each its own while they live."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_ok
from engines import engines, native_missing

MiB = 1 << 20


def address(block) -> int:
    return np.frombuffer(block, np.uint8).__array_interface__["data"][0]


@pytest.fixture
def cache_type():
    why = native_missing()
    if why is not None:
        pytest.skip(f"no native engine: {why}")
    from fastcoll.engine import _native

    return _native.ResultCache


def test_a_block_let_go_serves_the_next_result_of_its_size(cache_type):
    c = cache_type(64 * MiB)
    a = c.take(4 * MiB)
    view = np.frombuffer(a, np.float32)
    view[:] = 7
    where = address(a)
    other = c.take(4 * MiB)  # while `a` lives it is never handed out again
    assert address(other) != where and c.kept == 0
    del view, a
    assert c.kept >= 4 * MiB
    b = c.take(3 * MiB)  # within half of the block's size: reused
    assert address(b) == where and len(memoryview(b)) == 3 * MiB and not memoryview(b).readonly
    assert c.kept == 0


def test_a_block_much_larger_than_asked_is_not_used(cache_type):
    c = cache_type(64 * MiB)
    big = c.take(8 * MiB)
    where = address(big)
    del big
    small = c.take(1 * MiB)
    assert address(small) != where and c.kept >= 8 * MiB


def test_the_limit_and_the_count_bound_what_is_kept(cache_type):
    c = cache_type(10 * MiB)
    too_big = c.take(11 * MiB)
    del too_big
    assert c.kept == 0
    blocks = [c.take(2 * MiB + i * 64) for i in range(6)]
    del blocks
    assert 0 < c.kept <= 4 * (2 * MiB + 512)  # four blocks at most
    assert cache_type(0).kept == 0
    none = cache_type(0)
    x = none.take(MiB)
    del x
    assert none.kept == 0


def test_close_frees_what_is_kept_and_keeps_nothing_after(cache_type):
    c = cache_type(64 * MiB)
    a, b = c.take(MiB), c.take(MiB)
    del a
    assert c.kept > 0
    c.close()
    assert c.kept == 0
    del b
    assert c.kept == 0
    assert len(memoryview(c.take(MiB))) == MiB  # still serves, from fresh memory


def test_a_block_outlives_its_cache(cache_type):
    c = cache_type(64 * MiB)
    a = c.take(MiB)
    del c
    np.frombuffer(a, np.uint8)[:] = 1  # the block holds its cache: nothing is freed under it
    del a


def test_bad_sizes_are_refused(cache_type):
    c = cache_type(MiB)
    for n in (0, -1):
        with pytest.raises(ValueError, match="at least 1 byte"):
            c.take(n)
    with pytest.raises(ValueError, match="limit is a number of bytes"):
        cache_type(-1)


def test_the_cache_size_is_a_tuning_knob():
    from fastcoll.config import DEFAULT_RESULT_CACHE_MB, Config

    base = {"FASTCOLL_RANK": "0", "FASTCOLL_WORLD_SIZE": "1"}
    assert Config.from_env(base).result_cache_mb == DEFAULT_RESULT_CACHE_MB
    assert Config.from_env({**base, "FASTCOLL_TUNING": "result_cache_mb=0"}).result_cache_mb == 0
    with pytest.raises(ValueError, match="result_cache_mb must be at least 0"):
        Config.from_env({**base, "FASTCOLL_TUNING": "result_cache_mb=-1"})


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("world", [2, 3])
def test_large_results_stay_each_its_own(launch, world, engine):
    results = launch(world, "results_worker.py", FASTCOLL_NATIVE=engine).wait(timeout=120)
    assert_ok(results)
    for r in results:
        if engine == "1":
            assert "owner=ResultBlock REUSED" in r.out, r.out
        else:
            assert "owner=ndarray" in r.out, r.out


def test_result_cache_mb_0_keeps_nothing(launch):
    why = native_missing()
    if why is not None:
        pytest.skip(f"no native engine: {why}")
    results = launch(2, "results_worker.py", FASTCOLL_NATIVE="1", FASTCOLL_TUNING="result_cache_mb=0").wait(timeout=120)
    assert_ok(results)
    assert all("owner=ndarray" in r.out and "native engine" in r.out for r in results), [r.out for r in results]
