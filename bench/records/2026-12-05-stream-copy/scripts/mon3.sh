#!/bin/bash
. /work/venv/bin/activate; cd /tmp/s
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ]; do
  for cfg in "2097152 1048576" "8388608 1048576" "16777216 1048576" "8388608 4194304"; do set -- $cfg
    a=$(./xcore | cut -c1-12); r=$(XRING=$1 FASTCOLL_TUNING=piece_bytes=$2 E=$((16<<20)) N=8 timeout 120 fastcoll-launch -n 4 python big3.py); b=$(./xcore | cut -c1-12)
    echo "$(date -u +%H:%M:%S) ring=$1 piece=$2 | $a | $b | $r"
  done
done
