"""The fence gate's Metal side, checked without a Mac.

Metal cannot run here, so each gate kernel is built as MlxBackend hands it to
mx.fast.metal_kernel, the source MLX would give Metal is assembled from it (the kernel's header,
then the `[[kernel]]` signature MLX writes around the body, as mlx/backend/metal/custom_kernel.cpp's
write_signature does), and that source is compiled as C++ over a stand-in for Metal
(tests/metal_shim/metal_shim.h) and run on one CPU thread against a control page the test fills
as the host half would. So the Metal prelude (fastcoll/metal/prelude.h), the shared body
(fastcoll/gate/device/fc_gate.inc, fc_mark.inc, gate.h) and kernels.py's assembly are held to this: the
assembled source compiles, every gated dtype and every op the gate accepts
(fastcoll/gate/protocol/accept.py) gives the host path's result, in both of x's address spaces, and an op
the GPU side does not implement does not compile (it used to fall through to a sum). CI runs this
file in its macOS step too (.ci/macos-cross).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT
from fastcoll.gate.protocol import layout as L
from fastcoll.gate.protocol.accept import GATE_DTYPES, GATE_OPS
from fastcoll.gpu.language import Language
from fastcoll.metal import LANGUAGE as METAL

mx = pytest.importorskip("mlx.core")

SHIM = os.path.join(ROOT, "tests", "metal_shim")
CXX = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c)), None)
LAYOUT = L.ControlLayout(16 * 1024, 2)
# MLX's names of the dtypes in Metal (get_type_string).
MLX_TYPES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t", "uint32": "uint32_t"}
# The thread attributes MLX's metal_kernel adds to a kernel's signature where its body names them,
# in MLX's order.
ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"), ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"), ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"), ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"), ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"), ("threadgroups_per_grid", "uint3"), ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"), ("threads_per_threadgroup", "uint3"),
]
# What one CPU thread is, for each attribute the kernels name.
ONE_THREAD = {"thread_position_in_threadgroup": "uint3{0, 0, 0}", "threads_per_threadgroup": "uint3{1, 1, 1}"}
SEQ = 42


class _Recorder(Language):
    """The Metal language, whose kernels record how MlxBackend builds and calls them."""

    def __init__(self) -> None:
        super().__init__(**{f.name: getattr(METAL, f.name) for f in dataclasses.fields(METAL)})
        self.built: list[tuple] = []  # (name, input names, output names, source, header, call kwargs)

    def make_kernel(self, name, input_names, output_names, source, header):
        def run(**kw):
            self.built.append((name, input_names, output_names, source, header, kw))
            return [mx.zeros(shape, dtype=dt) for shape, dt in zip(kw["output_shapes"], kw["output_dtypes"])]

        return run


def _mlx_source(name, input_names, output_names, source, header, kw) -> tuple[str, str, list[str]]:
    """(the kernel's name, the source MLX's Metal backend compiles for it, the attributes its
    signature ends with), as metal_kernel writes them for these inputs."""
    inputs = kw["inputs"]
    kernel = "custom_kernel_" + name
    if kw.get("template"):  # MLX names a template's instantiation by its arguments
        kernel += "_" + re.sub(r"<|>|(, )", "_", "<" + ", ".join(MLX_TYPES[str(d).rsplit(".", 1)[-1]]
                                                              for _, d in kw["template"]) + ">")[:-1]
    for a in inputs:
        kernel += "_" + MLX_TYPES[str(a.dtype).rsplit(".", 1)[-1]] + ("s" if a.ndim == 0 else "c" if a.size < 8 else "")
    kernel += "".join("_" + MLX_TYPES[str(d).rsplit(".", 1)[-1]] for d in kw["output_dtypes"])
    args = []
    for n, a in zip(input_names, inputs):
        space = "constant" if a.size < 8 else "device"
        args.append(f"  const {space} {MLX_TYPES[str(a.dtype).rsplit('.', 1)[-1]]}{'&' if a.ndim == 0 else '*'} {n} "
                    f"[[buffer({len(args)})]]")
    for n, d in zip(output_names, kw["output_dtypes"]):
        args.append(f"  device {MLX_TYPES[str(d).rsplit('.', 1)[-1]]}* {n} [[buffer({len(args)})]]")
    attrs = [a for a, _ in ATTRIBUTES if a in source]
    args += [f"  {t} {a} [[{a}]]" for a, t in ATTRIBUTES if a in source]
    text = header
    if kw.get("template"):
        text += "template <" + ", ".join(f"typename {t}" for t, _ in kw["template"]) + ">\n"
    text += f"[[kernel]] void {kernel}(\n" + ",\n".join(args) + ") {\n" + source + "\n}\n"
    if kw.get("template"):
        inst = kernel + "<" + ", ".join(MLX_TYPES[str(d).rsplit(".", 1)[-1]] for _, d in kw["template"]) + ">"
        text += f'\ntemplate [[host_name("{kernel}")]] [[kernel]] decltype({inst}) {inst};\n'
        kernel = inst
    return kernel, text, attrs


def _gate_source(dtype: str, count: int, op: str) -> tuple[str, str, list[str]]:
    """The gate kernel of an all-reduce of `count` elements of `dtype` with `op`, as MLX compiles it."""
    from fastcoll.gate.device.mlx_backend import MlxBackend

    rec = _Recorder()
    backend = MlxBackend(rec, LAYOUT)
    backend.launch(mx.zeros((count,), dtype=getattr(mx, dtype)), op, 1000, backend.initial_token(SEQ - 1))
    (built,) = rec.built
    return _mlx_source(*built)


def _compile(tmp_path, text: str, name: str) -> subprocess.CompletedProcess:
    """`text` compiled into tmp_path/name.so over the Metal stand-in, warnings as errors."""
    if CXX is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) to compile the Metal source over its stand-in")
    src = tmp_path / f"{name}.cpp"
    src.write_text(text)
    return subprocess.run([CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-Wno-unknown-pragmas",
                           "-Wno-attributes", "-D__METAL_VERSION__=310", "-I", SHIM, "-include",
                           os.path.join(SHIM, "metal_shim.h"), str(src), "-o", str(tmp_path / f"{name}.so")],
                          capture_output=True, text=True, timeout=120)


def _driver(kernel: str, attrs: list[str], call: str) -> str:
    """A C entry point that runs the kernel as one thread: `call` is its arguments before the
    attributes."""
    args = ", ".join([call[2], *(ONE_THREAD[a] for a in attrs)])
    return f'\nextern "C" unsigned fc_test_run({call[0]}) {{\n{call[1]}\n  {kernel}({args});\n  return 0;\n}}\n'


def _bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values (exact in `dtype`) as the dtype's storage: bfloat16 as its 16 bits."""
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(np.dtype(dtype))


def _widened(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


@pytest.mark.parametrize("count", [5, 64])  # x in Metal's constant address space (fewer than 8), and device
@pytest.mark.parametrize("dtype", sorted(GATE_DTYPES))
@pytest.mark.parametrize("op", sorted(GATE_OPS))
def test_every_op_the_gate_accepts_runs_as_the_host_path_reduces(tmp_path, op, dtype, count):
    """The gate kernel's Metal source, as MLX would compile it, compiles and, run as one thread
    over a receive mailbox holding two ranks' rows, gives the host path's reduction: rank 0's row
    then rank 1's, in float, rounded to the dtype, NaN propagated."""
    kernel, text, attrs = _gate_source(dtype, count, op)
    assert "[[kernel]] void custom_kernel_fastcoll_gate_gate_" in text and f"#define FC_OP {L.OPS[op]}\n" in text
    assert (f"const constant {MLX_TYPES[dtype]}* x" in text) is (count < 8)
    call = ("const void* x, void* ctrl, void* out, uint32_t* token",
            f"  uint32_t* words = (uint32_t*)ctrl;\n  words[FC_RELEASE] = {SEQ}u;\n  words[FC_STATUS] = FC_OK;\n"
            f"  uint32_t after[4] = {{0u, 0u, 0u, 0u}};\n  after[FC_TOKEN_SEQ] = {SEQ - 1}u;\n"
            "  after[FC_TOKEN_STATUS] = FC_OK;",
            "(const FC_T*)x, (const uint32_t*)ctrl, after, (FC_T*)out, token")
    built = _compile(tmp_path, text + _driver(kernel, attrs, call), "gate")
    assert built.returncode == 0, built.stderr[-4000:]
    a = np.resize(np.array([1.5, -2, 3, 0.25, 7, -0.5, 6, 2], np.float32), count)
    b = np.resize(np.array([2, 0.5, -3, 4, -1, 8, -6, 2], np.float32), count)
    a[-1] = np.nan
    page = np.zeros(LAYOUT.total_bytes, np.uint8)
    slot = count * _bits(a, dtype).itemsize
    page[LAYOUT.recv_offset:LAYOUT.recv_offset + slot] = _bits(a, dtype).view(np.uint8)
    page[LAYOUT.recv_offset + slot:LAYOUT.recv_offset + 2 * slot] = _bits(b, dtype).view(np.uint8)
    x, out, token = _bits(a, dtype), np.zeros_like(_bits(a, dtype)), np.zeros(L.TOKEN_WORDS, np.uint32)
    lib = ctypes.CDLL(str(tmp_path / "gate.so"))
    lib.fc_test_run(x.ctypes.data_as(ctypes.c_void_p), page.ctypes.data_as(ctypes.c_void_p),
                    out.ctypes.data_as(ctypes.c_void_p), token.ctypes.data_as(ctypes.c_void_p))
    assert (token[L.TOKEN_SEQ], token[L.TOKEN_STATUS]) == (SEQ, L.OK), token
    want = {"sum": a + b, "prod": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b), "mean": (a + b) / 2}[op]
    np.testing.assert_array_equal(_widened(out, dtype), want, err_msg=f"{op} {dtype} {count}")
    words = page.view(np.uint32)
    assert words[L.ARRIVAL] == SEQ and words[L.ACK] == SEQ  # the arrival published, the release seen
    sent = page[L.SEND_OFFSET:L.SEND_OFFSET + slot]
    np.testing.assert_array_equal(sent, x.view(np.uint8))  # x copied into the send mailbox


def test_the_mark_kernel_compiles_and_marks(tmp_path):
    """fc_mark, a template kernel as MLX writes one (its instantiation named by host_name):
    compiles over the stand-in and stores the gate's sequence number into MARK."""
    from fastcoll.gate.device.mlx_backend import MlxBackend

    rec = _Recorder()
    MlxBackend(rec, LAYOUT).mark(SEQ, mx.zeros((4,), dtype=mx.float32))
    kernel, text, attrs = _mlx_source(*rec.built[0])
    call = ("void* ctrl, uint32_t* marked", "  uint32_t params[4] = {0u, 0u, 0u, 0u};\n"
            f"  params[FC_P_SEQ] = {SEQ}u;\n  float dep[4] = {{0, 0, 0, 0}};",
            "(const uint32_t*)ctrl, params, dep, marked")
    built = _compile(tmp_path, text + _driver(kernel, attrs, call), "mark")
    assert built.returncode == 0, built.stderr[-4000:]
    page, marked = np.zeros(LAYOUT.total_bytes // 4, np.uint32), np.zeros(1, np.uint32)
    ctypes.CDLL(str(tmp_path / "mark.so")).fc_test_run(page.ctypes.data_as(ctypes.c_void_p),
                                                       marked.ctypes.data_as(ctypes.c_void_p))
    assert page[L.MARK] == SEQ and marked[0] == SEQ


def test_an_op_the_gpu_side_does_not_implement_does_not_compile(tmp_path):
    """An op code outside the table (a new op given to the gate, but not to fc_apply) is a
    compile error naming the op, not a sum."""
    unknown = max(L.OPS.values()) + 1
    _, text, _ = _gate_source("float32", 64, "sum")
    text = text.replace("#define FC_OP 0\n", f"#define FC_OP {unknown}\n", 1)
    assert f"#define FC_OP {unknown}\n" in text
    built = _compile(tmp_path, text, "unknown")
    assert built.returncode != 0, "an unknown op compiled"
    said = built.stderr.replace("\u2018", "'").replace("\u2019", "'")
    # gcc: "incomplete type 'struct X<5>'"; clang: "undefined template 'X<5>'"
    assert re.search(rf"(incomplete type '(struct )?|undefined template ')fastcoll_gpu_implements_op<{unknown}>'",
                     said), built.stderr[-4000:]


def test_every_op_the_gate_accepts_has_a_code_in_the_kernels_table():
    """What the gate accepts (accept.GATE_OPS) is what the kernels' op table names, each with a
    define of its own and a specialization of its own in gate.h (no default that sums)."""
    from fastcoll.gate.device import kernels
    from fastcoll.gpu.language import read_source

    assert set(GATE_OPS) == set(L.OPS) and len(set(L.OPS.values())) == len(L.OPS)
    helpers = read_source("fastcoll.gate.device", "gate.h")
    assert kernels.implemented_ops(helpers) == GATE_OPS
    apply = helpers[helpers.index("FC_DEVICE float fc_apply("):]
    assert "return fastcoll_gpu_implements_op<OP>()(a, b);\n}" in apply  # fc_apply is the op's kernel alone
