#!/bin/bash
. /work/venv/bin/activate; cd /tmp/s
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ]; do
  for v in nt plain; do
    if [ $v = plain ]; then export FC_XNT_OFF=1; else unset FC_XNT_OFF; fi
    a=$(./xcore | cut -c1-12); r=$(E=$((16<<20)) N=8 timeout 120 fastcoll-launch -n 4 python big3.py); b=$(./xcore | cut -c1-12)
    echo "$(date -u +%H:%M:%S) $v | $a | $b | $r"
  done
done
