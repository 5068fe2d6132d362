"""MLX's Metal backend as fastcoll's kernels see it: the Metal prelude (prelude.h), the
primitives that the fence gate's kernel body (fastcoll/gate/device/, shared by both GPUs) is
written in, and its LANGUAGE. Nothing here imports the gate: its defines reach the prelude as text,
put before it by the gate's device side.

NOT RUN: no Mac was available to this project; docs/gate.md says what ran on which hardware.

Metal specifics, after MLX's own fence.metal (ml-explore/mlx#1773) and the seed's gate:
- `coherent(system)` on every control-page access, in both kernels: with a plain volatile device
  pointer the GPU never observes the CPU's store (71 of 120 releases missed in the seed's A/B),
  and with coherent(device) it misses about one in a few hundred, a hang every few tokens.
- Reaching that qualifier needs `#pragma METAL internals : enable`. MLX compiles each
  mx.fast.metal_kernel into its own library from its own source, and the pragma is in these
  kernels' prelude alone, so it is scoped to just these kernels. Where it is unavailable the
  kernels fail to compile, the self-test fails, and the host path is used, as the seed does.
- MLX passes inputs of fewer than 8 elements in the `constant` address space and larger ones in
  `device`, so the gate kernel is built twice, once for each address space of x (FC_X_SPACE).
- Copies move 4-, 2- or 1-byte units by sizeof(T), which MLX's arrays of T are aligned to.
- Apple GPUs share memory with the CPU: the control page needs no advice. A Metal kernel built
  through MLX cannot reach another process's memory, so the direct mode is CUDA's only.
"""

from __future__ import annotations

from fastcoll.gpu.language import Language

LANGUAGE = Language(
    name="metal",
    title="Metal",
    package=__name__,
    prelude_file="prelude.h",
    types={"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"},  # MLX's get_type_string
    x_spaces=("device", "constant"),
)
