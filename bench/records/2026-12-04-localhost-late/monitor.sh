#!/bin/bash
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
end=$(( $(date +%s) + ${1:-600} ))
while [ $(date +%s) -lt $end ]; do
  t=$(date -u +%T)
  j=$(fastcoll-launch -n 4 python "$HERE/ar6.py" 2>&1 | grep -o "r0 [0-9]*ms" | head -1)
  m=$(python "$HERE/mc.py")
  k=$(mpiexec -n 4 python bench/workers/mpi_worker.py --ops all_reduce --sizes 67108864 --iters 6 2>/dev/null | python3 -c "
import json,sys
for line in sys.stdin:
    if line.startswith('{'):
        d=json.loads(line); ts=sorted(d['points'][0]['times']); print('mpi %.0fms' % (ts[len(ts)//2]*1e3))")
  echo "$t fastcoll $j | $k | $m"
  sleep 5
done
