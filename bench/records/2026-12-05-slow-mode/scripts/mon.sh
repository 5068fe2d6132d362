#!/bin/bash
DUR=${1:-3600}; GAP=${2:-40}
. /work/venv/bin/activate; cd /tmp/s
end=$(( $(date +%s) + DUR ))
while [ $(date +%s) -lt $end ]; do
  echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  python l3.py; echo -n "bw2 x2: "; python bw2.py & python bw2.py; wait; echo
  for cfg in "2097152 1048576" "524288 262144" "262144 131072"; do set -- $cfg
    echo -n "ring=$1: "; XRING=$1 FASTCOLL_TUNING=piece_bytes=$2 E=$((16<<20)) N=10 timeout 120 fastcoll-launch -n 4 python big3.py; done
  echo -n "bw2 x2 after: "; python bw2.py & python bw2.py; wait; echo
  E=$((16<<20)) timeout 120 mpiexec -n 4 python bigmpi.py
  sleep $GAP
done
