"""A program written for mx.distributed alone (it never imports fastcoll).

Run as `python -m fastcoll.mlx_compat compat_plain.py ARGS` it must run on fastcoll."""

import sys

import mlx.core as mx

g = mx.distributed.init()
total = mx.distributed.all_sum(mx.array([g.rank() + 1.0]))
print(f"plain rank {g.rank()} of {g.size()}: sum {total.item():g} via {type(g).__module__} argv {sys.argv[1:]}", flush=True)
