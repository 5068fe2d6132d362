"""Transports: how this rank's messages reach its peers. One module each, registered here.

A transport module provides `connect(config, caps, deadline) -> (Transport, Table)`: it listens,
takes part in the rendezvous (fastcoll.transport.rendezvous) with its own address and the
capabilities `caps`, checks that the ranks agree (`rendezvous.agree`), connects to every peer,
and returns its `fastcoll.transport.base.Transport` and the rendezvous table. Adding a transport
is one new module, one entry below (a function that imports it) and its name in
`fastcoll.wire.TRANSPORTS`, the names `Config` accepts (checked here at import).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from fastcoll import wire


def _tcp() -> ModuleType:
    from fastcoll.transport import tcp  # sockets; shared memory between ranks of one host

    return tcp


def _zmq() -> ModuleType:
    from fastcoll.transport import zmq  # ZeroMQ ROUTER/DEALER; imported when chosen, as it needs pyzmq

    return zmq


def _rdma() -> ModuleType:
    from fastcoll.transport import rdma  # verbs links, which only the native engine drives

    return rdma


# FASTCOLL_TRANSPORT value -> what imports the module that implements it.
TRANSPORTS: dict[str, Callable[[], ModuleType]] = {"tcp": _tcp, "zmq": _zmq, "rdma": _rdma}
if tuple(TRANSPORTS) != wire.TRANSPORTS:  # the names Config accepts, kept in the leaf it may import
    raise ImportError(f"fastcoll.transport registers {tuple(TRANSPORTS)}, but fastcoll.wire.TRANSPORTS "
                      f"names {wire.TRANSPORTS}: add the transport to both")


def connect(config: Any, caps: dict[str, Any], deadline: float) -> tuple[Any, Any]:
    """Rendezvous with every rank and connect the transport `config.transport` names: its
    `(Transport, rendezvous.Table)`. `config` is a fastcoll.Config (not imported here: Config
    validates its transport against this registry)."""
    module = TRANSPORTS[config.transport]()
    return module.connect(config, caps, deadline)
