"""Which all-reduces take the gate: a rule every rank evaluates alike.

The rule reads only the array's shape and dtype, the op, and the byte thresholds (fixed at init;
the lower one by the gate's mode, which every rank of a job shares), so ranks that make the same
call make the same choice: no rank ever spins on a gate its peer skipped.
Batch and big reductions keep the host path, as in the seed ("row gates only").
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from fastcoll import dtypes
from fastcoll.gate.protocol.layout import OPS

# The GPU reduces in float (fastcoll/gate/device/gate.h): the float types a model's activations
# have. Other dtypes keep the host path.
GATE_DTYPES = frozenset({"float32", "float16", "bfloat16"})
# The ops whose table entry (fastcoll/dtypes.py) gives them to the gate; others keep the host path.
GATE_OPS = frozenset(OPS)


def dtype_name(dtype: Any) -> str:
    """'float32' for mx.float32 (MLX prints dtypes as 'mlx.core.float32')."""
    return str(dtype).rsplit(".", 1)[-1]


def gate_accepts(shape: Sequence[int], name: str, op: str, max_bytes: int, min_bytes: int = 1) -> bool:
    """True when an all-reduce of this shape, dtype name and op goes through the gate: its
    bytes within [min_bytes, max_bytes]."""
    if op not in GATE_OPS or name not in GATE_DTYPES:
        return False
    try:
        dtypes.check_reduction(name, op)
    except (TypeError, ValueError):
        return False  # the host path raises the caller's error
    count = math.prod(int(d) for d in shape)
    nbytes = count * dtypes.host_dtype(name).itemsize
    return max(min_bytes, 1) <= nbytes <= max_bytes
