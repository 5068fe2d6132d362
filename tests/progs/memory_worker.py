"""One rank of tests/test_memory.py: the resident size of a long run of collectives of mixed,
varying sizes, and what finalize() gives back.

    memory_worker.py CALLS SEED

Every rank draws the same calls from SEED: all_reduce, all_gather, broadcast and reduce_scatter
of float32 arrays whose sizes vary at random over 4 KiB .. 24 MiB (log-uniform, so that most
calls are small and many are large: the allocator's thresholds see every size), each result
checked. The resident size is read as the kernel reports it (VmRSS), with nothing trimmed,
after the first 1,000 calls and every 500 after, with what the engine's result cache keeps;
then finalize() runs and it is read again. Prints

    RSS <kib after 1000, 1500, 2000, ... calls, comma-separated>
    KEPT <bytes the result cache kept at each of those points, comma-separated>
    END <kib before finalize> <bytes kept then> <kib after finalize> <bytes kept after>
                                       (after a last 16 MiB result let go, which the cache keeps)
    OK <calls>

(KEPT and the bytes kept are -1 on the Python engine, which keeps no results.)
"""

from __future__ import annotations

import faulthandler
import gc
import sys

import numpy as np

import fastcoll

CALLS, SEED = int(sys.argv[1]), int(sys.argv[2])
faulthandler.dump_traceback_later(900, exit=True)
KINDS = ("all_reduce", "all_reduce", "all_gather", "broadcast", "reduce_scatter")


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def one(kind: str, count: int, r: int, n: int) -> None:
    x = np.full(count, r + 1, np.float32)
    if kind == "all_reduce":
        y = fastcoll.all_reduce(x)
        want = n * (n + 1) / 2
    elif kind == "all_gather":
        k = max(1, count // n)
        y = fastcoll.all_gather(x[:k]).reshape(n, k)
        want = None
        assert all(y[p][0] == p + 1 and y[p][-1] == p + 1 for p in range(n)), f"all_gather of {k}"
    elif kind == "broadcast":
        y = fastcoll.broadcast(x, root=0)
        want = 1.0
    else:
        y = fastcoll.reduce_scatter(x[: count - count % n])
        want = n * (n + 1) / 2
    if want is not None:
        assert y.size == 0 or (y[0] == want and y[-1] == want), f"{kind} of {count}: {y[0]} != {want}"


def main() -> None:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    rng = np.random.default_rng(SEED)
    counts = np.exp(rng.uniform(np.log(1024), np.log(6 << 20), CALLS)).astype(np.int64) + n
    kinds = rng.integers(0, len(KINDS), CALLS)
    cache = getattr(g._job.engine, "_results", None)

    def kept() -> int:
        return -1 if cache is None else cache.kept

    samples, held = [], []
    for i in range(CALLS):
        one(KINDS[kinds[i]], int(counts[i]), r, n)
        if i + 1 >= 1000 and (i + 1) % 500 == 0:
            gc.collect()
            samples.append(rss_kib())
            held.append(kept())
    # A last large result let go: the engine keeps its memory for the next call (native engine)
    # until finalize(), which must give it back.
    y = fastcoll.all_reduce(np.ones(4 << 20, np.float32))
    assert y[0] == n, "the last all_reduce"
    del y
    gc.collect()
    before, kept_before = rss_kib(), kept()
    fastcoll.finalize()
    gc.collect()
    print("RSS", ",".join(map(str, samples)), flush=True)
    print("KEPT", ",".join(map(str, held)), flush=True)
    print("END", before, kept_before, rss_kib(), kept(), flush=True)
    print("OK", CALLS, flush=True)


main()
