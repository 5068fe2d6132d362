"""An mlx-lm command, as it is, that also says on each rank how many of the model's parameters
mlx-lm loaded there: `python -m fastcoll.mlx_compat lm_probe.py COMMAND ARGS` runs
`python -m mlx_lm COMMAND ARGS` (tests/test_real_clients.py: that the command really sharded it).
"""

from __future__ import annotations

import runpy
import sys

import mlx.core as mx
import mlx_lm.utils
from mlx.utils import tree_flatten


def counted(load):
    def wrapper(*args, **kwargs):
        got = load(*args, **kwargs)
        n = sum(v.size for _, v in tree_flatten(got[0].parameters()))
        rank = mx.distributed.init().rank()
        print(f"probe: rank {rank}: {load.__name__} gave a model of {n} parameters", flush=True)
        return got

    return wrapper


# Before mlx-lm's commands import them (`from .utils import load, sharded_load`).
mlx_lm.utils.load = counted(mlx_lm.utils.load)
mlx_lm.utils.sharded_load = counted(mlx_lm.utils.sharded_load)
sys.argv = ["mlx_lm", *sys.argv[1:]]
runpy.run_module("mlx_lm", run_name="__main__", alter_sys=True)
