"""The native engine's reductions (fastcoll/engine/csrc/reduce/fc_reduce.c) are bit-identical to the
pure-Python engine's numpy reducers (fastcoll/dtypes.py: reducer, finish_mean).

Two implementations are checked the same way:
  - "native": the extension's `_native.reduce(dtype, op, a, b, out)` and
    `_native.finish_mean(dtype, buf, world_size)`; skipped where fastcoll.engine._native is not
    built;
  - "csrc": fc_reduce.c itself, compiled here by the system C compiler (warnings are errors) into
    a temporary shared library and called through ctypes; skipped where there is no compiler.

Every (dtype, op) pair that fastcoll reduces is run over random data salted with edge values
(NaN with payloads, signalling NaN, +-inf, +-0, subnormals, the largest values, integer extremes,
float16/bfloat16 ties that round to even), several lengths, out being a, b or neither, and
unaligned buffers. Everything must match numpy bit for bit except where numpy itself has no one
answer: two NaNs combined by sum/prod/mean may give either one's payload (numpy's own float32
loops pick different operands in their vector body and their scalar tail; the NaN of a fused
complex product, or of a complex mean of two non-finite parts, depends on the compiler's operand
order), and on arm64 numpy's float min/max order -0 below +0 and quiet signalling NaNs, which
fc_reduce.c (following numpy on x86) does not.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shlex
import shutil
import subprocess

import numpy as np
import pytest

from fastcoll import dtypes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "fastcoll", "engine", "csrc")
LENGTHS = (0, 1, 7, 1000, 100003)
ALIASES = ("none", "out_is_a", "out_is_b", "all_one")
WORLD_SIZES = (1, 2, 3, 5, 7, 8, 12, 1000, 2049, 4097, 65519, 65520, 100000)

INTS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")


def _valid(name: str, op: str) -> bool:
    try:
        dtypes.check_reduction(name, op)
    except (TypeError, ValueError):
        return False
    return True


PAIRS = [(name, op) for name in dtypes.names() for op in dtypes.OPS if _valid(name, op)]
INVALID = [(name, op) for name in dtypes.names() for op in dtypes.OPS if not _valid(name, op)]


# ---- the two implementations ----


class CtypesReduce:
    """fc_reduce.c through ctypes, with the extension's signature."""

    def __init__(self, path: str):
        self.lib = lib = ctypes.CDLL(path)
        lib.fc_reduce.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.fc_finish_mean.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.fc_itemsize.argtypes = [ctypes.c_int]
        lib.fc_itemsize.restype = ctypes.c_size_t
        lib.fc_reduction_valid.argtypes = [ctypes.c_int, ctypes.c_int]
        self.codes = {name: i for i, name in enumerate(dtypes.names())}  # fc_reduce.h's order
        self.ops = {op: i for i, op in enumerate(dtypes.OPS)}

    def reduce(self, dtype: str, op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        assert len(a) == len(b) == len(out)
        if self.lib.fc_reduce(self.codes[dtype], self.ops[op], a.ctypes.data, b.ctypes.data, out.ctypes.data, len(out)) != 0:
            raise TypeError(f"{op} is no reduction of {dtype}")

    def finish_mean(self, dtype: str, buf: np.ndarray, world_size: int) -> None:
        if self.lib.fc_finish_mean(self.codes[dtype], buf.ctypes.data, len(buf), world_size) != 0:
            raise TypeError(f"{dtype} has no mean")


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC")
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> CtypesReduce:
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang or $CC) to build fc_reduce.c for the ctypes tests")
    out = str(tmp_path_factory.mktemp("fc_reduce") / "libfc_reduce.so")
    flags = ["-O2", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-shared", "-fPIC"]
    cmd = [*cc, *flags, os.path.join(CSRC, "reduce", "fc_reduce.c"), "-o", out, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}"
    return CtypesReduce(out)


@pytest.fixture(scope="module", params=["native", "csrc"])
def impl(request):
    if request.param == "native":
        return pytest.importorskip(
            "fastcoll.engine._native",
            reason="the extension fastcoll.engine._native is not built (the csrc tests check fc_reduce.c itself)",
        )
    return request.getfixturevalue("compiled")


# ---- data ----

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

# bit patterns of edge values
_EDGE_BITS = {
    "float16": [0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x7BFF, 0xFBFF,
                0x7BFE, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E01, 0x7FFF, 0xFFFF, 0x7C01, 0xFC01, 0x7D55,
                0x3C00, 0xBC00, 0x3C01, 0x3BFF, 0x1400, 0x1401, 0x0C00, 0x5BFF, 0x7800, 0x3555],
    "bfloat16": [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x8080, 0x7F7F, 0xFF7F, 0x7F7E, 0x7F80,
                 0xFF80, 0x7FC0, 0xFFC0, 0x7FC1, 0x7FFF, 0xFFFF, 0x7F81, 0xFF81, 0x7FA5, 0x3F80, 0xBF80,
                 0x3F81, 0x3F7F, 0x3B80, 0x3B81, 0x0100, 0x4B00],
    "float32": [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF,
                0xFFFFFFFF, 0x7F800001, 0xFF800005, 0x7FA00000, 0x3F800000, 0xBF800000, 0x3F800001,
                0x33800000, 0x34000000, 0x0C000000],
    "float64": [0x0, 0x8000000000000000, 0x1, 0x8000000000000001, 0x000FFFFFFFFFFFFF, 0x0010000000000000,
                0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
                0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF,
                0x7FF0000000000001, 0xFFF0000000000007, 0x3FF0000000000000, 0xBFF0000000000000,
                0x3FF0000000000001, 0x3CA0000000000000],
}


def _host(name: str) -> np.dtype:
    return dtypes.host_dtype(name)


def _float_values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n floats of `name` (as their host dtype): ordinary values of many magnitudes, values of one
    binade (whose sums tie), arbitrary bit patterns, and edge values."""
    if name == "complex64":
        parts = _float_values("float32", 2 * n, rng)
        return parts.view(np.complex64)
    host = _host(name)
    bits_t = _UINT[host.itemsize]
    compute = np.float32 if name in ("float16", "bfloat16") else host.type
    with np.errstate(over="ignore"):  # float16 overflows to inf: one more edge value
        ordinary = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)).astype(compute)
        binade = rng.uniform(1, 2, n).astype(compute) * compute(2.0) ** rng.integers(-3, 4, n).astype(compute)
        if name == "bfloat16":
            ordinary, binade = (dtypes.float32_to_bf16(v) for v in (ordinary, binade))
        else:
            ordinary, binade = ordinary.astype(host), binade.astype(host)
    noise = rng.integers(0, np.iinfo(bits_t).max, n, dtype=bits_t, endpoint=True)
    edges = np.array(_EDGE_BITS[name], dtype=bits_t)[rng.integers(0, len(_EDGE_BITS[name]), n)]
    which = rng.integers(0, 4, n)
    out = np.where(which == 0, ordinary.view(bits_t), np.where(which == 1, binade.view(bits_t), np.where(which == 2, noise, edges)))
    return out.astype(bits_t).view(host)


def _int_values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    host = _host(name)
    info = np.iinfo(host)
    noise = rng.integers(info.min, info.max, n, dtype=host, endpoint=True)
    small = rng.integers(max(info.min, -20), 21, n).astype(host)
    edges = np.array([info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, info.max // 2 + 1], dtype=host)
    edges = np.concatenate([edges, np.array([-1], dtype=np.int64).astype(host)]) if info.min < 0 else edges
    which = rng.integers(0, 3, n)
    return np.where(which == 0, noise, np.where(which == 1, small, edges[rng.integers(0, len(edges), n)])).astype(host)


def _values(name: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return _int_values(name, n, rng) if name in INTS else _float_values(name, n, rng)


# ---- comparison ----


def _bits(x: np.ndarray) -> np.ndarray:
    """The raw bits; complex64 as (n, 2) uint32."""
    if x.dtype == np.complex64:
        return x.view(np.uint32).reshape(-1, 2)
    return x.view(_UINT[x.dtype.itemsize])


def _isnan(name: str, bits: np.ndarray) -> np.ndarray:
    if name == "float16":
        return (bits & 0x7FFF) > 0x7C00
    if name == "bfloat16":
        return (bits & 0x7FFF) > 0x7F80
    if name in ("float32", "complex64"):
        return (bits & 0x7FFFFFFF) > 0x7F800000
    if name == "float64":
        return (bits & 0x7FFFFFFFFFFFFFFF) > 0x7FF0000000000000
    return np.zeros(bits.shape, bool)


_ARM = platform.machine().lower() in ("arm64", "aarch64")
_QUIET = {"float16": 0x200, "bfloat16": 0x40, "float32": 0x400000, "complex64": 0x400000, "float64": 1 << 51}


def assert_same(name: str, op: str, got: np.ndarray, want: np.ndarray, a: np.ndarray, b: np.ndarray, what: str) -> None:
    g, w = _bits(got), _bits(want)
    differ = g != w
    if not differ.any():
        return
    if name in _QUIET and op != "min" and op != "max":
        ga, gb = _bits(a), _bits(b)
        quiet = g.dtype.type(_QUIET[name])
        if name == "complex64" and op == "prod":
            # the NaN of a fused complex product depends on the order of its operands
            ok = _isnan(name, g) & _isnan(name, w)
        else:
            both = _isnan(name, ga) & _isnan(name, gb)
            ok = both & ((g == w) | (g == (ga | quiet)) | (g == (gb | quiet)))
        differ &= ~ok
    if name in ("float32", "float64", "bfloat16") and op in ("min", "max") and _ARM:
        # numpy on arm64 takes FMIN/FMAX: -0 below +0, a signalling NaN made quiet; fc_reduce.c
        # keeps numpy's x86 choice (b on a tie, NaNs untouched) on every machine
        ga, gb = _bits(a), _bits(b)
        quiet, sign = g.dtype.type(_QUIET[name]), g.dtype.type(1 << (8 * g.itemsize - 1))
        zeros = ((ga | sign) == sign) & ((gb | sign) == sign) & ((g == ga) | (g == gb))
        nans = (_isnan(name, ga) | _isnan(name, gb)) & _isnan(name, g)
        nans &= (g == ga) | (g == gb) | (g == (ga | quiet)) | (g == (gb | quiet))
        differ &= ~(zeros | nans)
    if differ.any():
        i = np.argwhere(differ)[0][0]
        raise AssertionError(
            f"{name} {op} {what}: {int(differ.sum())} of {len(got)} elements differ from numpy; first at {i}: "
            f"a={_bits(a)[i]!r} b={_bits(b)[i]!r} got={g[i]!r} numpy={w[i]!r}"
        )


def _reference(name: str, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    with np.errstate(all="ignore"):
        dtypes.reducer(name, op)(a.copy(), b.copy(), out)
    return out


def _unaligned(x: np.ndarray) -> np.ndarray:
    """A copy of x at an odd address."""
    y = np.zeros(x.nbytes + 1, np.uint8)[1:].view(x.dtype)
    y[...] = x
    assert y.ctypes.data % 2 == 1
    return y


# ---- the tests ----


def test_header_lists_fastcoll_dtypes_in_order():
    """fc_tables.h's codes are dtypes.names() and dtypes.OPS, in that order (the ctypes path and
    the extension rely on it)."""
    header = open(os.path.join(CSRC, "reduce", "fc_tables.h")).read()
    enums = [re.findall(r"\bFC_(\w+)", body) for body in re.findall(r"enum\s+\w+\s*\{([^}]*)\}", header)]
    listed = {e[-1]: tuple(n.lower() for n in e[:-1]) for e in enums}
    assert listed["DTYPE_COUNT"] == dtypes.names()
    assert listed["OP_COUNT"] == dtypes.OPS


def test_the_generated_headers_are_what_the_tables_make(monkeypatch):
    """reduce/fc_tables.h and gate/fc_gate_page.h are checked in as `python -m
    fastcoll.engine.tables` writes them from fastcoll/dtypes.py and the gate's layout; a table
    changed without them is caught here."""
    from fastcoll.engine import tables

    assert tables.stale() == []
    monkeypatch.setitem(dtypes.REDUCTIONS, "bitor", dtypes.Reduction(np.bitwise_or, frozenset({"int32"}), "", False))
    monkeypatch.setattr(dtypes, "OPS", tuple(dtypes.REDUCTIONS))
    assert tables.stale() == [os.path.join("reduce", "fc_tables.h")]


def test_an_op_without_its_loops_in_fc_reduce_c_is_refused(tmp_path, monkeypatch):
    """A new op in the table (so in fc_tables.h) whose loops fc_reduce.c does not have is refused
    by the C reductions, never reduced as another op; the ops before it keep their codes."""
    from fastcoll.engine import tables

    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang or $CC) to build fc_reduce.c")
    monkeypatch.setitem(dtypes.REDUCTIONS, "bitor", dtypes.Reduction(np.bitwise_or, frozenset({"int32"}), "", False))
    monkeypatch.setattr(dtypes, "OPS", tuple(dtypes.REDUCTIONS))
    (tmp_path / "reduce").mkdir()
    for name in ("fc_reduce.c", "fc_reduce.h"):
        (tmp_path / "reduce" / name).write_text(open(os.path.join(CSRC, "reduce", name)).read())
    (tmp_path / "reduce" / "fc_tables.h").write_text(tables.reduce_header())
    out = str(tmp_path / "libfc_reduce.so")
    cmd = [*cc, "-O1", "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC", str(tmp_path / "reduce" / "fc_reduce.c"),
           "-o", out, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = CtypesReduce(out)
    bitor, int32 = dtypes.OPS.index("bitor"), dtypes.names().index("int32")
    assert not lib.lib.fc_reduction_valid(int32, bitor)
    a = np.array([1, 2], np.int32)
    out_buf = np.zeros_like(a)
    assert lib.lib.fc_reduce(int32, bitor, a.ctypes.data, a.ctypes.data, out_buf.ctypes.data, 2) == -1
    lib.reduce("int32", "sum", a, a, out_buf)  # the ops before it: their codes and loops unchanged
    assert out_buf.tolist() == [2, 4]


def test_itemsize_and_validity(compiled):
    lib = compiled.lib
    for name, code in compiled.codes.items():
        assert lib.fc_itemsize(code) == _host(name).itemsize, name
        for op, opcode in compiled.ops.items():
            assert bool(lib.fc_reduction_valid(code, opcode)) == _valid(name, op), (name, op)
    assert lib.fc_itemsize(-1) == 0 and lib.fc_itemsize(len(compiled.codes)) == 0
    assert not lib.fc_reduction_valid(compiled.codes["float32"], len(compiled.ops))
    assert not lib.fc_reduction_valid(compiled.codes["float32"], -1)


@pytest.mark.parametrize("name,op", PAIRS, ids=[f"{n}-{o}" for n, o in PAIRS])
def test_reduce_matches_numpy(impl, name, op):
    for n in LENGTHS:
        a, b = _values(name, n, seed=2 * n + 1), _values(name, n, seed=2 * n + 2)
        want = _reference(name, op, a, b)
        for alias in ALIASES:
            x, y = a.copy(), b.copy()
            if alias == "all_one":  # a op a, in place
                impl.reduce(name, op, x, x, x)
                assert_same(name, op, x, _reference(name, op, a, a), a, a, f"n={n} {alias}")
                continue
            out = {"none": np.full_like(a, 7), "out_is_a": x, "out_is_b": y}[alias]
            impl.reduce(name, op, x, y, out)
            assert_same(name, op, out, want, a, b, f"n={n} {alias}")


@pytest.mark.parametrize("name,op", PAIRS, ids=[f"{n}-{o}" for n, o in PAIRS])
def test_reduce_unaligned(impl, name, op):
    n = 1003
    a, b = _values(name, n, seed=11), _values(name, n, seed=12)
    want = _reference(name, op, a, b)
    x, y, out = _unaligned(a), _unaligned(b), _unaligned(np.zeros_like(a))
    impl.reduce(name, op, x, y, out)
    assert_same(name, op, out, want, a, b, "unaligned")
    impl.reduce(name, op, x, y, x)
    assert_same(name, op, x, want, a, b, "unaligned, out is a")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_every_half_value(impl, name, op):
    """Every 16-bit pattern against shuffled ones and against each edge value."""
    every = np.arange(1 << 16, dtype=np.uint16).view(_host(name))
    rng = np.random.default_rng(5)
    partners = [rng.permutation(every) for _ in range(6)]
    partners += [np.full(1 << 16, e, np.uint16).view(every.dtype) for e in _EDGE_BITS[name]]
    for other in partners:
        for a, b in ((every, other), (other, every)):
            out = np.empty_like(a)
            impl.reduce(name, op, a, b, out)
            assert_same(name, op, out, _reference(name, op, a, b), a, b, "every value")


def _assert_mean_same(name: str, x: np.ndarray, got: np.ndarray, want: np.ndarray, what: str) -> None:
    g, w = _bits(got), _bits(want)
    differ = g != w
    if name == "complex64":
        # numpy computes ((re + im*0) / w, (im - re*0) / w): where neither part is finite, two
        # NaNs meet (inf*0 makes one), and either may come out
        both = ((_bits(x) & 0x7F800000) == 0x7F800000).all(axis=1)[:, None]
        differ &= ~(both & _isnan(name, g) & _isnan(name, w))
        differ = differ.any(axis=1)
    if differ.any():
        i = np.argwhere(differ)[0][0]
        raise AssertionError(f"{name} mean {what}: {int(differ.sum())} differ from numpy; first at {i}: x={_bits(x)[i]!r} got={g[i]!r} numpy={w[i]!r}")


def _numpy_mean(name: str, x: np.ndarray, world_size: int) -> np.ndarray:
    want = x.copy()
    with np.errstate(all="ignore"):
        dtypes.finish_mean(name, want, world_size)
    return want


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "complex64"])
def test_finish_mean_matches_numpy(impl, name):
    for n in LENGTHS:
        x = _values(name, n, seed=n + 99)
        if name == "float16":  # every half value as well
            x = np.concatenate([x, np.arange(1 << 16, dtype=np.uint16).view(np.float16)])
        for ws in WORLD_SIZES:
            got = x.copy()
            impl.finish_mean(name, got, ws)
            _assert_mean_same(name, x, got, _numpy_mean(name, x, ws), f"n={n} world={ws}")
    x = _values(name, 1001, seed=3)
    got = _unaligned(x)
    impl.finish_mean(name, got, 3)
    _assert_mean_same(name, x, got, _numpy_mean(name, x, 3), "unaligned")


@pytest.mark.parametrize("name,op", INVALID, ids=[f"{n}-{o}" for n, o in INVALID])
def test_invalid_pairs_refused(impl, name, op):
    a = np.zeros(4, _host(name))
    out = np.full_like(a, 1)
    with pytest.raises((TypeError, ValueError)):
        impl.reduce(name, op, a, a.copy(), out)
    assert (out == 1).all(), "nothing is written for an invalid pair"


@pytest.mark.parametrize("name", INTS + ("bool",))
def test_mean_needs_a_float(impl, name):
    with pytest.raises((TypeError, ValueError)):
        impl.finish_mean(name, np.zeros(4, _host(name)), 2)


def test_native_refuses_mismatched_buffers():
    """The extension checks what C can't: lengths that differ would read or write past a buffer."""
    native = pytest.importorskip("fastcoll.engine._native", reason="the extension fastcoll.engine._native is not built")
    a, b = np.ones(8, np.float32), np.ones(8, np.float32)
    for x, y, out in ((a, b, np.ones(7, np.float32)), (a, np.ones(9, np.float32), np.ones(8, np.float32)), (a[:7], b, b)):
        with pytest.raises((TypeError, ValueError)):
            native.reduce("float32", "sum", x, y, out)
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        native.reduce("float32", "sum", a, b, ro)
    with pytest.raises((TypeError, ValueError, BufferError)):
        native.finish_mean("float32", ro, 2)
