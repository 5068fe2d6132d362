"""The fence gate's host half, shared by every GPU: small all-reduces that do not stop the GPU
(docs/gate.md).

Each gate is one kernel (fc_gate): the GPU publishes "arrived", the service thread exchanges with
the peers and publishes "released", and the kernel's one spinning thread lets the GPU continue.
This package is the host's side of it: `gate` (what the core calls), `host` (the handshake on the
service thread), `direct_mode` (the GPUs gather among themselves; a watcher supervises), `layout`
and `page` (the control page), `poll`, `seq`, `accept` (which all-reduces take the gate),
`profile`, `device` (what the host half needs of a device), `backends` (the one place that knows
the GPU backends) and `probe` (`probe(config)`: a working Gate or None). The device side, the
kernels and how MLX runs them, is fastcoll/gpu/ with a language each in fastcoll/metal/ and
fastcoll/cuda/; `probe` is not imported here, since it opens the device side, which reads this
package's layout.
"""

from fastcoll.gate.gate import Gate

__all__ = ["Gate"]
