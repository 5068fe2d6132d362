#!/bin/bash
. /work/venv/bin/activate; cd /tmp/s
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ]; do
  for v in nt plain; do
    if [ $v = plain ]; then export PYTHONPATH=/tmp/ab-plain; else export PYTHONPATH=/work/main; fi
    a=$(./xcore | cut -c4-8)
    r1=$(E=262144 N=60 fastcoll-launch -n 4 python big5.py); r2=$(E=262144 N=60 fastcoll-launch -n 2 python big5.py)
    r3=$(E=$((1<<22)) N=20 fastcoll-launch -n 2 python big5.py); r4=$(E=$((16<<20)) N=10 fastcoll-launch -n 2 python big5.py)
    b=$(./xcore | cut -c4-8)
    echo "$(date -u +%H:%M:%S) $v | $a $b | 4r1M $r1 | 2r1M $r2 | 2r16M $r3 | 2r64M $r4"
  done
done
