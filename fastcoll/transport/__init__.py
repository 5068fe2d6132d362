"""Transports: how this rank's messages reach its peers. One module each, registered here.

A transport module provides `connect(config, caps, deadline) -> (Transport, Table)`: it listens,
takes part in the rendezvous (fastcoll.transport.rendezvous) with its own address and the
capabilities `caps`, checks that the ranks agree (`rendezvous.agree`), connects to every peer,
and returns its `fastcoll.transport.base.Transport` and the rendezvous table. Adding a transport
is one new module and one entry below; `Config` accepts exactly these names.
"""

from __future__ import annotations

import importlib
from typing import Any

# FASTCOLL_TRANSPORT value -> the module that implements it.
TRANSPORTS: dict[str, str] = {
    "tcp": "fastcoll.transport.tcp",  # sockets; shared memory between ranks of one host
    "zmq": "fastcoll.transport.zmq",  # ZeroMQ ROUTER/DEALER
}


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[Any, Any]:
    """Rendezvous with every rank and connect the transport `config.transport` names: its
    `(Transport, rendezvous.Table)`. `config` is a fastcoll.Config (not imported here: Config
    validates its transport against this registry)."""
    module = importlib.import_module(TRANSPORTS[config.transport])
    return module.connect(config, caps, deadline)
