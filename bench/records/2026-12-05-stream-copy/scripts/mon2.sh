#!/bin/bash
. /work/venv/bin/activate; cd /tmp/s
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ]; do
  echo "== $(date -u +%H:%M:%S)"
  ./xcore; ./xcore
  E=$((16<<20)) N=10 timeout 120 fastcoll-launch -n 4 python big3.py
  ./xcore
  E=$((16<<20)) N=10 timeout 120 fastcoll-launch -n 4 python big3.py
  ./xcore; ./xcore
  sleep 5
done
