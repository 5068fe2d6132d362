"""The fence gate's device side, one for both GPUs (docs/gate.md): the kernel sources that Metal
and CUDA share (gate.h, fc_gate.inc, fc_mark.inc, shipped as package data), how a kernel's
source and header are put together from them and the protocol's defines (`kernels`), and the
DeviceBackend that runs them through MLX (`mlx_backend`). It imports the gate's protocol
(fastcoll/gate/protocol/) and, downward, the GPU languages: what differs between them
(fastcoll/gpu/language.py), each one's prelude and LANGUAGE (fastcoll/metal/, fastcoll/cuda/).
Nothing of the host half, and nothing of those languages imports the gate.
"""
