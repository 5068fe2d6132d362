"""probe(config): the Gate this process can run, or None so that the core uses the host path."""

from __future__ import annotations

import logging

from fastcoll import testhooks
from fastcoll.config import Config
from fastcoll.gate.host import backends
from fastcoll.gate.host.gate import Gate
from fastcoll.gate.protocol.layout import ControlLayout

log = logging.getLogger("fastcoll.gate")


def probe(config: Config) -> Gate | None:
    """A Gate on the first GPU backend (Metal, then CUDA) that passes its self-test, else None.

    None when FASTCOLL_FAST_SYNC is off (the default) or no backend can run the kernels. Every rank
    reports whether it got one during the rendezvous; the gate is used only if all did.
    """
    if not config.fast_sync:
        return None
    made = testhooks.gate_factory()
    if made is not None:  # a test's simulated device
        return made(config)
    layout = ControlLayout(config.gate_max_bytes, config.world_size)
    for name in backends.BACKENDS:
        try:
            backend = backends.open_backend(name, layout)
        except Exception as e:  # a broken GPU stack must cost the gate, never the job
            backends.fell_back(f"the {name} fence gate could not be set up, so the host path is used: {e}")
            continue
        if backend is not None:
            log.info("fence gate on %s: all-reduces of up to %d bytes run without stopping the GPU",
                     name, config.gate_max_bytes)
            return Gate(backend, config)
    log.info("FASTCOLL_FAST_SYNC=1 but no GPU backend can run the fence gate here; using the host path")
    return None
