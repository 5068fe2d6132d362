"""One rank of a job given several listening addresses (FASTCOLL_INTERFACE=a,b): prints which
of this rank's addresses its peers' connections arrived on or left from, then checks a striped
all-reduce. Exits non-zero on a wrong result."""

from __future__ import annotations

import json

import numpy as np

import fastcoll

g = fastcoll.init()
# (peer, channel, kind, this end's address, the peer's) of every connection
ends = sorted({(mine if p > g.rank() else theirs)[0] for p, ch, kind, mine, theirs in g._job.engine.transport.connections()})
x = np.arange(3_000_000, dtype=np.float32) * (g.rank() + 1)  # 12 MB: the ring, in pieces
y = fastcoll.all_reduce(x)
want = np.arange(3_000_000, dtype=np.float32) * sum(range(1, g.size() + 1))
assert np.array_equal(y, want), "wrong all_reduce result"
print(json.dumps({"rank": g.rank(), "connections": g.config.connections, "ends": ends}), flush=True)
fastcoll.finalize()
