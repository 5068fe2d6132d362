"""Where a host-mode decode token's time goes, from FASTCOLL_GATE_PROFILE's per-gate lines:
python3 gaps.py profile/profile1.txt profile/profile2.txt (bench/NOTES.md 81).

Per rank: the arrival waits (from the service thread's start on a gate to the GPU's arrival) of the
token's first gate and of the other 63, and the exchanges, summed per token over steady tokens
(gates 1000-5999: after the warm-up, inside the first timed generation)."""

import gzip
import re
import statistics
import sys

LINE = re.compile(r"\[(\d)\] fastcoll\.gate: gate (\d+): arrival wait ([\d.]+) us, exchange ([\d.]+) us")
GATES_A_TOKEN = 64

for path in sys.argv[1:]:
    ranks: dict[str, dict[int, list[tuple[int, float, float]]]] = {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:  # plain in raw.tar.xz, xz being the smaller
        for line in f:
            m = LINE.match(line)
            if m and 1000 <= int(m[2]) < 6000:
                seq = int(m[2])
                token = ranks.setdefault(m[1], {}).setdefault((seq - 1) // GATES_A_TOKEN, [])
                token.append(((seq - 1) % GATES_A_TOKEN, float(m[3]), float(m[4])))
    for rank, tokens in sorted(ranks.items()):
        whole = [t for t in tokens.values() if len(t) == GATES_A_TOKEN]
        first = [sum(w for i, w, _ in t if i == 0) / 1e3 for t in whole]
        rest = [sum(w for i, w, _ in t if i) / 1e3 for t in whole]
        exch = [sum(e for _, _, e in t) / 1e3 for t in whole]
        med = statistics.median
        print(f"{path} rank {rank}: {len(whole)} tokens; ms a token, medians: first gate's arrival wait "
              f"{med(first):.2f}, the other 63's {med(rest):.2f}, exchanges {med(exch):.2f}")
