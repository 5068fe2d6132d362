"""The native engine's door: every public name of the extension `fastcoll.engine._native`, and of
each of its types, declared in one place.

fastcoll/engine/native.py holds the extension to this table at import (`check`): a name it
lacks or one it has beyond these is an ImportError that names it, so the binding
(fastcoll/engine/csrc/binding/) cannot grow a way in that this table and docs/design.md do not
show. An Engine is one rank's data plane; what it does is done through three small objects of
its own: its `runner` (collectives, each described once by an OpSpec), its `links` (and the
messages the pure-Python schedules send over them) and its `gate` (the fence gate's host half).
"""

from __future__ import annotations

from types import ModuleType

# The module's public names: its types (checked below) and the rest.
MODULE = ("ALGORITHMS", "Completion", "DTYPES", "Engine", "GRAPH_TRACE_MAX", "GateHost", "GraphTable", "KINDS",
          "Links", "NativeError", "OPS", "OpSpec", "PHASES", "ResultCache", "Runner", "finish_mean", "link_kinds",
          "reduce")

# Each type's public attributes (methods, fields).
PUBLIC_API: dict[str, tuple[str, ...]] = {
    # Engine(rank, size, channels, spin_us, yield_us, main_thread, long_wait_us=0)
    "Engine": ("abort", "close", "gate", "interrupt", "links", "runner"),
    "Runner": ("claim_if_idle", "graph_open", "on_failure", "release", "run", "spec", "submit", "submit_call"),
    "OpSpec": ("agree_counts", "algorithm", "bounds", "dtype", "itemsize", "kind", "limit", "piece_bytes", "rank",
               "recv_bounds", "reduce", "root", "sig", "size", "trace"),
    "Links": ("add", "flush", "info", "keep_unread", "next_header", "read_payload", "send", "send_raw"),
    "GateHost": ("attach", "outstanding", "release", "stop", "submit", "timings"),
    "Completion": ("code", "done", "wait"),
    "GraphTable": ("capsule", "trace"),  # Runner.graph_open's: the table's capsule, its calls traced
    "ResultCache": ("close", "kept", "take"),
}


class SurfaceError(ImportError):
    """The extension's public names are not the ones this table declares (it was built from
    other sources than this fastcoll)."""


def _public(names: list[str]) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def check(module: ModuleType) -> None:
    """Raise SurfaceError naming every public name `module` lacks or has beyond MODULE and
    PUBLIC_API (a type's own attributes only: what it inherits from object is not its door)."""
    problems = _differ("fastcoll.engine._native", _public(list(vars(module))), set(MODULE))
    for name, declared in PUBLIC_API.items():
        kind = getattr(module, name, None)
        if isinstance(kind, type):
            problems += _differ(f"_native.{name}", _public(dir(kind)) - _public(dir(object)), set(declared))
    if problems:
        raise SurfaceError(f"the native engine's binding is not the surface fastcoll/engine/door.py declares: "
                           f"{'; '.join(problems)} (rebuild it: python setup.py build_ext --inplace)")


def _differ(where: str, have: set[str], declared: set[str]) -> list[str]:
    said = []
    if declared - have:
        said.append(f"{where} lacks {', '.join(sorted(declared - have))}")
    if have - declared:
        said.append(f"{where} has undeclared {', '.join(sorted(have - declared))}")
    return said
