"""The fence gate: small all-reduces that do not stop the GPU (DESIGN.md, "The fence gate").

The GPU publishes "arrived" (fc_arrival), the service thread exchanges with the peers and publishes
"released", and a one-thread kernel spinning on that word (fc_release) lets the GPU continue. This
package is the host half shared by both GPUs: the control page's layout, the handshake on the
service thread, the selection rule and the profile. The kernels are in fastcoll/metal/ and
fastcoll/cuda/; fastcoll.gate.sim plays the GPU with a thread for the tests.
"""

from fastcoll.gate.gate import Gate
from fastcoll.gate.probe import probe

__all__ = ["Gate", "probe"]
