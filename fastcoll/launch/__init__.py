"""fastcoll-launch: start a fastcoll job on this machine or across hosts, the way mpirun does.

    fastcoll-launch -n 4 python train.py --lr 3e-4
    fastcoll-launch --hostfile hosts.json python train.py
    fastcoll-launch --check --hostfile hosts.json

Modules, one job each: `api` (the launch API: LaunchConfig, launch, the restart loop), `cli`
(the options, a parser over `api`), `hostfile` (both hostfile formats),
`job` (ranks, placement, environment), `procs` (local and remote rank processes), `supervise`
(waiting, failure, signals, timeout), `output` (rank-prefixed lines, log files), `remote` (the
ssh side), `agent` (the standard-library program that runs on a remote host), `check`
(`--check`).
"""

from __future__ import annotations
