#!/bin/bash
# pin.sh MODE script: MODE halves (0,1 | 2,3), parity (0,2 | 1,3), none
r=${FASTCOLL_RANK:-0}
case $1 in
 halves) c=$(( r / 2 ));;
 parity) c=$(( r % 2 ));;
 *) exec python "$2";;
esac
exec taskset -c $c python "$2"
