"""Soak: thousands of collectives of random op, dtype, size and input type on 3 ranks, every
result checked exactly, and the resident size and the live Python objects watched for growth.

CI runs a short version (600 operations per transport); the full one is

    FASTCOLL_TEST_SOAK_OPS=10000 python -m pytest tests/test_soak.py -m soak -s

Memory is sampled at every tenth of the run after a garbage collection, emptying MLX's buffer
cache and trimming glibc's free lists, so the samples show live memory, not allocator caches.
The first tenth warms up (the largest random sizes come by then); from there on the resident
size may not grow by more than RSS_GROWTH_KIB, and the object count by more than a handful.
"""

from __future__ import annotations

import os

import pytest

from conftest import assert_ok

OPS = int(os.environ.get("FASTCOLL_TEST_SOAK_OPS", "600"))
SEED = int(os.environ.get("FASTCOLL_TEST_SOAK_SEED", "20240611"))
# Measured: +2-5 MiB over 10,000 ops, flat after ~10,000 (25,000 run, TCP). glibc's heap has
# transient peaks that are not leaks: this seed, 600 ops, rank 0, one sample of the ten peaks at
# +5.5 MiB over TCP and +10-12 MiB with shared memory, then falls back; over 6,000 ops the peaks
# are +7 (shm) and +11 MiB (TCP), with no upward trend. A leak of a buffer per call (tens of MiB
# here) or a growing object count still fails.
RSS_GROWTH_KIB = 16 * 1024
OBJECT_GROWTH = 50
# Under AddressSanitizer (.ci/sanitizers sets this) freed memory waits in its quarantine, so the
# resident size grows by design: the results and the object count are still checked.
SANITIZED = os.environ.get("FASTCOLL_TEST_SANITIZED") == "1"


@pytest.mark.soak
@pytest.mark.parametrize("transport", ["shm", "tcp", "zmq"])
def test_soak_random_collectives(launch, transport):
    job = launch(3, "soak_worker.py", str(OPS), str(SEED), transport=transport, timeout="30")
    results = job.wait(timeout=60 + OPS * 0.05)
    assert_ok(results)
    for r in results:
        line = next(x for x in r.out.splitlines() if x.startswith("SOAK"))
        _, rank, ops, seconds, rss, objects = line.split()
        assert int(ops) == OPS
        rss = [int(v) for v in rss.split(",")]
        objects = [int(v) for v in objects.split(",")]
        warm_rss = rss[1]  # after the first tenth
        print(
            f"\n{transport} rank {rank}: {OPS} ops in {float(seconds):.1f}s; RSS KiB {rss}; "
            f"objects {objects}"
        )
        if SANITIZED:
            print("RSS not checked: AddressSanitizer's quarantine holds freed memory")
        else:
            assert max(rss[1:]) - warm_rss < RSS_GROWTH_KIB, f"rank {rank}: RSS grew: {rss}"
            assert rss[-1] - warm_rss < RSS_GROWTH_KIB, f"rank {rank}: RSS grew: {rss}"
        # A leak grows with the calls; a module imported or a cache filled once (the first call of a
        # rare kind) does not: the second half of the run must not add objects.
        half = objects[len(objects) // 2]
        assert max(objects[len(objects) // 2:]) - half < OBJECT_GROWTH, f"rank {rank}: objects grew: {objects}"
        assert "OK" in r.out
