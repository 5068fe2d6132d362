"""fastcoll.average_gradients: bucketed (fused) averaging equals averaging each array alone.

progs/compat_gradients.py builds a nested tree (dicts, lists, tuples, a namedtuple, None and
int leaves) of random float32, bfloat16, float16, complex64 arrays (MLX) and float64/float32
arrays (numpy), different on every rank, with one array over the bucket size, and checks for
several bucket sizes that every result is bit-identical to fastcoll.all_reduce(x, op="mean")
on that array alone (close, for buckets over the direct path on 3 ranks), that the structure
is kept, that fusion really reduces the number of collectives, and that integer gradients are
refused before anything is sent.
"""

from __future__ import annotations

import pytest

from conftest import assert_ok

pytest.importorskip("mlx.core")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_bucketed_average_equals_per_array_average(launch, world):
    results = launch(world, "compat_gradients.py").wait(timeout=90)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}:" in r.out and "checks passed" in r.out, r.out
