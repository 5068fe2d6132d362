"""What the host half needs from a device: the shared page and the two kernels, in stream order."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from fastcoll.gate.layout import ControlLayout


class DeviceBackend(Protocol):
    """A GPU (or a thread playing one) that runs the gate's arrival and release kernels.

    `launch` enqueues, lazily, the arrival-publish kernel (x -> send mailbox, then ARRIVAL = seq)
    and after it the release-spin kernel (spin until RELEASE reaches seq, then receive mailbox ->
    result). The arrival kernel takes `after`, the previous gate's token, as an input, so gates
    run on the device strictly in issue order and never share the mailboxes.
    """

    name: str
    layout: ControlLayout
    page: np.ndarray  # flat uint8, host-visible, layout.total_bytes long

    def initial_token(self) -> Any:
        """The token the first gate waits on (an already-finished one)."""

    def launch(self, x: Any, seq: int, nbytes: int, max_iters: int, after: Any) -> tuple[Any, Any]:
        """Enqueue one gate; return (its result, its token). Evaluates nothing."""

    def wait(self, token: Any) -> None:
        """Run the device work up to `token` and wait for it (the caller's thread only)."""

    def close(self) -> None:
        """Give back what the backend holds (memory advice, threads)."""
