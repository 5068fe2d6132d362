"""The fence gate: small all-reduces that do not stop the GPU (docs/gate.md).

Each gate is one kernel (fc_gate): the GPU publishes "arrived", the service thread exchanges with
the peers and publishes "released", and the kernel's one spinning thread lets the GPU continue. This
package is the gate's host half, shared by every GPU: `gate` (what the core calls), `host` (the
handshake on the service thread), `layout` and `page` (the control page), `poll`, `seq`,
`select` (which all-reduces take the gate), `profile`, `kernels` (the one kernel body every GPU
language shares), `mlx_backend` (the kernels through MLX's custom-kernel API), `device` (what the
host half needs of a device), `backends` (the one selection point for the GPU backends in
fastcoll/metal/ and fastcoll/cuda/), `probe`, and `sim` (a device played by a thread, for tests).
"""

from fastcoll.gate.gate import Gate
from fastcoll.gate.probe import probe

__all__ = ["Gate", "probe"]
