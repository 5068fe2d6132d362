"""The fence gate: small all-reduces that do not stop the GPU (docs/gate.md).

The GPU publishes "arrived" (fc_arrival), the service thread exchanges with the peers and publishes
"released", and a one-thread kernel spinning on that word (fc_release) lets the GPU continue. This
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
