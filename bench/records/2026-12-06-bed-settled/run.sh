#!/bin/sh
# The record's runs, in order (from the repository's root): the windows, then the bed set with
# each job's first 0.5 s untimed (bench/multihost.py's default now) and, once, without (--settle 0).
D=bench/records/2026-12-06-bed-settled
S="--systems fastcoll-tcp,mpi --sizes 4,64,1024,4096 --links unshaped,1gbit --rounds 5"
date -u; uptime
python $D/windows.py.txt 6 $D/windows.txt
python bench/multihost.py bench --hosts 4 $S --out $D/hosts4-a
python bench/multihost.py bench --hosts 4 $S --settle 0 --out $D/hosts4-unsettled
python bench/multihost.py bench --hosts 4 $S --out $D/hosts4-b
python bench/multihost.py bench --hosts 2 $S --out $D/hosts2
date -u; uptime
