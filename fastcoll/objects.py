"""Small Python values between ranks, as msgpack, never pickle: broadcast_object and
all_gather_object.

What travels: None, bool, int (-2**63 .. 2**64 - 1), float, str, bytes, lists and tuples
(tuples arrive as lists), dicts whose keys are None, bool, int, float, str or bytes; nested
at most MAX_DEPTH deep. Anything else (a set, a numpy array or scalar, an object of any
class) is a TypeError on the caller, naming where in the value it sits, before any byte moves.
A packed value is at most MAX_OBJECT_BYTES; a size a peer reports is checked against that
bound before anything is allocated, and what arrives is decoded with msgpack's own bounds and
checked again, so a peer can make a rank neither allocate nor build anything else.

Each call is two collectives: the packed sizes (int64), then the bytes (uint8) along the
algorithms' ordinary paths.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from fastcoll.collectives import begin, check_rank
from fastcoll.exchange import cut
from fastcoll.engine.ops import Op
from fastcoll.errors import MismatchError
from fastcoll.group import Group

MAX_OBJECT_BYTES = 64 << 20  # one packed value
MAX_DEPTH = 64
_SCALARS = (type(None), bool, int, float, str, bytes)
_KINDS = "None, bool, int, float, str, bytes, list, tuple, dict"


def _where(path: list[Any]) -> str:
    return "obj" + "".join(f"[{p!r}]" for p in path)


def check_value(obj: Any, what: str) -> None:
    """TypeError (naming the place) unless msgpack carries `obj` and it comes back equal
    (tuples as lists); ValueError past MAX_DEPTH."""
    stack: list[tuple[Any, list[Any]]] = [(obj, [])]
    while stack:
        v, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ValueError(f"{what}: {_where(path[:3])}... nests deeper than {MAX_DEPTH} levels")
        t = type(v)
        if t in _SCALARS:
            if t is int and not -(1 << 63) <= v < (1 << 64):
                raise TypeError(f"{what}: {_where(path)} = {v} is outside msgpack's integers (-2**63 .. 2**64-1)")
            continue
        if t in (list, tuple):
            stack.extend((item, path + [i]) for i, item in enumerate(v))
        elif t is dict:
            for k, item in v.items():
                if type(k) not in _SCALARS:
                    raise TypeError(f"{what}: {_where(path)} has a key of type {type(k).__name__}; "
                                    "keys must be None, bool, int, float, str or bytes")
                stack.append((k, path + ["<key>"]))
                stack.append((item, path + [k]))
        else:
            raise TypeError(
                f"{what}: {_where(path)} is a {t.__module__}.{t.__qualname__}, which msgpack "
                f"cannot carry (it carries {_KINDS}); fastcoll never pickles")


def pack(obj: Any, what: str) -> bytes:
    """The msgpack bytes of `obj`, checked; TypeError/ValueError before anything is sent."""
    check_value(obj, what)
    data = msgpack.packb(obj, use_bin_type=True)
    if len(data) > MAX_OBJECT_BYTES:
        raise ValueError(f"{what}: the value packs to {len(data)} bytes, over "
                         f"fastcoll.objects.MAX_OBJECT_BYTES ({MAX_OBJECT_BYTES})")
    return data


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not a value fastcoll sends")


def unpack(data: bytes | memoryview, what: str) -> Any:
    """Decode what a peer sent, with msgpack's bounds; MismatchError if it is not one of the
    values pack() makes."""
    try:
        # msgpack bounds every length inside by the buffer's size, so nothing outgrows it.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True,
                              ext_hook=_refuse_ext, timestamp=0)
        check_value(obj, what)
    except (TypeError, ValueError, msgpack.UnpackException) as e:
        raise MismatchError(f"{what}: a peer sent bytes that are not a fastcoll value: {e}") from None
    return obj


def _sizes_ok(sizes: np.ndarray, what: str) -> None:
    bad = [int(s) for s in sizes if not 0 < s <= MAX_OBJECT_BYTES]
    if bad:
        raise MismatchError(f"{what}: a rank reported a packed size of {bad[0]} bytes, outside "
                            f"1..{MAX_OBJECT_BYTES} (fastcoll.objects.MAX_OBJECT_BYTES)")


def broadcast_object(obj: Any, root: int = 0, group: Group | None = None, timeout: float | None = None) -> Any:
    """Every rank gets root's `obj` (a msgpack value, see the module), decoded from the same bytes
    on every rank, root included (so tuples are lists everywhere). `obj` is ignored on the other
    ranks (pass None)."""
    g = begin(group, timeout)
    check_rank(root, g, "root")
    me = g.rank() == root
    data = pack(obj, "broadcast_object") if me else b""
    if g.size() == 1:
        return unpack(data, "broadcast_object")
    size = np.array([len(data)], dtype=np.int64)
    step = Op("broadcast", g.choose("broadcast", size.nbytes), dst=size, root=root,
              after=lambda: _sizes_ok(size, "broadcast_object"))
    g.run(f"broadcast_object.size({root})", step, timeout)
    buf = np.frombuffer(data, dtype=np.uint8).copy() if me else np.empty(int(size[0]), dtype=np.uint8)
    step = Op("broadcast", g.choose("broadcast", buf.nbytes), dst=buf, root=root)
    g.run(f"broadcast_object({root},{buf.nbytes})", step, timeout)
    return unpack(memoryview(buf), "broadcast_object")


def all_gather_object(obj: Any, group: Group | None = None, timeout: float | None = None) -> list[Any]:
    """Every rank's `obj` (a msgpack value, see the module), as a list in rank order, the same on
    every rank."""
    g = begin(group, timeout)
    data = pack(obj, "all_gather_object")
    n = g.size()
    if n == 1:
        return [unpack(data, "all_gather_object")]
    table = g.gather_ints("all_gather_object.size", [len(data)], timeout)
    sizes = table[:, 0]
    _sizes_ok(sizes, "all_gather_object")
    buf = np.empty(int(sizes.sum()), dtype=np.uint8)
    bounds = cut([int(s) for s in sizes], 1)
    a, b = bounds[g.rank()]
    buf[a:b] = np.frombuffer(data, dtype=np.uint8)
    step = Op("all_gather", g.choose("all_gather", buf.nbytes), dst=buf, bounds=bounds)
    g.run(f"all_gather_object(uint8,{buf.nbytes})", step, timeout)
    mv = memoryview(buf)
    return [unpack(mv[a:b], "all_gather_object") for a, b in bounds]

