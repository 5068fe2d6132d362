"""The fence gate's device side, one for both GPUs (docs/gate.md): the kernel sources that Metal
and CUDA share (gate.h, fc_gate.inc, fc_mark.inc, shipped as package data), how a kernel's
source and header are put together from them (`kernels`), what differs between the two
languages (`language`; each language's prelude and its LANGUAGE are in `metal` and `cuda`
below), and the DeviceBackend that runs them through MLX (`mlx_backend`). It imports the gate's
protocol (fastcoll/gate/protocol/) and nothing of its host half.
"""
