"""What the host half needs from a device: the shared page and the gate's kernels, in stream order."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from fastcoll.gate.protocol.layout import ControlLayout


class DeviceBackend(Protocol):
    """A GPU (or a thread playing one) that runs the gate's kernels (fastcoll/gate/device/).

    `launch` enqueues, lazily, the gate's kernel: x -> send mailbox, then ARRIVAL = seq (the
    previous token's plus one), the release spin, and the reduction of the receive mailbox into
    the result. It takes `after`, the previous gate's token, as an input, so gates run on the
    device strictly in issue order and never share the mailboxes.
    """

    name: str
    layout: ControlLayout
    page: np.ndarray  # flat uint8, host-visible, layout.total_bytes long

    def initial_token(self, seq: int) -> Any:
        """A token as if gate `seq` had just completed (the first gate is seq + 1)."""

    def launch(self, x: Any, op: str, max_iters: int, after: Any) -> tuple[Any, Any]:
        """Enqueue one gate; return (its result, its token). Evaluates nothing."""

    def wait(self, token: Any) -> None:
        """Run the device work up to `token` and wait for it (the caller's thread only)."""

    def close(self) -> None:
        """Give back what the backend holds (memory advice, threads)."""
