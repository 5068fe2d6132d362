"""The fence gate: small all-reduces that do not stop the GPU (docs/gate.md), one wing of three
floors whose imports run one way.

Each gate is one kernel (fc_gate): the GPU publishes "arrived", the service thread exchanges with
the peers and publishes "released", and the kernel's one spinning thread lets the GPU continue.

    protocol/   what both sides agree on and nothing else: the control page's layout (`layout`),
                the host's view of it (`page`), the wrap-aware sequence numbers (`seq`) and which
                all-reduces take the gate (`accept`); it imports no other floor
    device/     the gate's kernels: one body (gate.h, fc_gate.inc, fc_mark.inc) that joins the
                protocol's defines with a language's prelude, and how MLX builds and runs them;
                it knows the protocol and, below the gate, the GPU languages (fastcoll/gpu/,
                fastcoll/metal/, fastcoll/cuda/, which import nothing of the gate)
    host/       the host half, which every GPU shares: `gate` (what the core calls), `serve`
                (the handshake on the service thread), `direct_mode`, `poll`, `profile`,
                `device_backend` (what the host half needs of a device), `backends` (the one
                place that opens the device side) and `probe` (a working Gate or None)

`probe` is not imported here, since it opens the device side.
"""

from fastcoll.gate.host.gate import Gate

__all__ = ["Gate"]
