"""One rank of an RDMA job (tests/test_rdma.py).

    rdma_worker.py info            init, say the transport, one checked all_reduce, finalize
    rdma_worker.py stream N SIZE   N all_reduces of SIZE float32, each checked exactly

Lines the test reads:

    INFO <transport_info()>
    ERROR <class> <seconds since the call began>   a fastcoll error (init() counts as a call)
    MESSAGE <its message>
    OK <calls>

Exit status: 0 after OK, 3 after a fastcoll error, 4 after a wrong result.
"""

from __future__ import annotations

import faulthandler
import sys
import time

import numpy as np

import fastcoll

faulthandler.dump_traceback_later(120, exit=True)  # a hang shows its stack


def say(*parts) -> None:
    print(*parts, flush=True)


def run(mode: str, args: list[str]) -> int:
    g = fastcoll.init()
    r, n = g.rank(), g.size()
    say("INFO", g.transport_info())
    calls, size = (int(args[0]), int(args[1])) if mode == "stream" else (1, 1024)
    want = np.full(size, n * (n + 1) / 2, np.float32)
    for i in range(calls):
        x = np.full(size, r + 1, np.float32)
        y = fastcoll.all_reduce(x)
        if not np.array_equal(y, want):
            say(f"WRONG call {i}: {y[:4]} want {want[:4]}")
            return 4
    fastcoll.finalize()
    say("OK", calls)
    return 0


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    start = time.monotonic()
    try:
        return run(mode, args)
    except fastcoll.FastcollError as e:
        say("ERROR", type(e).__name__, f"{time.monotonic() - start:.3f}")
        say("MESSAGE", " | ".join(str(e).splitlines()))
        return 3


if __name__ == "__main__":
    sys.exit(main())
