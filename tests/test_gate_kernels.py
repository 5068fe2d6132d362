"""The Metal and CUDA gate kernels are one body over two preludes, with the seed's properties.

Metal cannot run here, so this is what holds the Metal side to the CUDA side that does run (on the
H200): every kernel body and every helper but the language primitives is one file for both
(fastcoll/gate/device/: fc_gate.inc, fc_mark.inc, gate.h), each prelude defines the same primitives, the
load-bearing properties are visible where they live, and every name a kernel uses is defined
once the C preprocessor has run (both languages, both modes); nvcc compiles the CUDA kernels.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from importlib import resources

import pytest

from conftest import ROOT
from fastcoll.cuda import LANGUAGE as CUDA
from fastcoll.gate.protocol.layout import OPS as L_OPS
from fastcoll.gate.protocol.layout import ControlLayout, GatherLayout
from fastcoll.gate.device import kernels
from fastcoll.gpu.language import Language, read_source
from fastcoll.metal import LANGUAGE as METAL

LAYOUT = ControlLayout(16 * 1024, 2)
GATHER = GatherLayout(16 * 1024, 2)
GATHER_AT = 0x7F0000001000

BODIES = ["gate", "mark"]
# What a prelude must define for the shared body.
PRIMITIVES = {"fc_load", "fc_store", "fc_load_relaxed", "fc_store_relaxed", "fc_fence", "fc_barrier",
              "fc_copy_in", "fc_mailbox_at", "fc_div"}
MACROS = {"FC_DEVICE", "FC_OUT", "FC_WORDS", "FC_BYTES", "FC_SHARED"}
SOURCES = {"fastcoll.gate.device": ["gate.h", "fc_gate.inc", "fc_mark.inc"], "fastcoll.metal": ["prelude.h"],
           "fastcoll.cuda": ["prelude.h"]}


def _functions(text: str) -> list[str]:
    return re.findall(r"FC_DEVICE \w+ (fc_\w+)[<(]", text)


def _defines(text: str) -> set[str]:
    return set(re.findall(r"#define (FC_\w+)", text))


def _block(text: str, start: str) -> str:
    i = text.index(start)
    j = text.index("\n}\n", i)
    return text[i:j]


def _header(lang: Language, name: str, direct: bool = False, kind: str = "") -> str:
    """Kernel `name`'s header as MlxBackend builds it, before minifying (rank 1 in the direct mode)."""
    space = lang.x_spaces[0]
    if direct:
        return kernels.header(lang, name, space, LAYOUT, 1, GATHER, GATHER_AT, kind)
    return kernels.header(lang, name, space, LAYOUT, 0, None, 0, kind)


class _Recorder(Language):
    """The CUDA language (or another), whose kernels only record how they are built and launched."""

    def __init__(self, lang: Language = CUDA):
        super().__init__(**{f.name: getattr(lang, f.name) for f in dataclasses.fields(lang)})
        self.launches: list[tuple[str, dict]] = []
        self.kernels: dict[str, tuple[str, str]] = {}  # name -> (source, header)

    def make_kernel(self, name, input_names, output_names, source, header):
        import mlx.core as mx

        self.kernels[name] = (source, header)

        def run(**kw):
            self.launches.append((name, kw))
            return [mx.zeros(shape, dtype=dt) for shape, dt in zip(kw["output_shapes"], kw["output_dtypes"])]

        return run


def _built(lang: Language, direct: bool = False) -> dict[str, tuple[str, str]]:
    """Every kernel of a 4096-element bf16 sum and the mark kernel, as MlxBackend hands them to MLX."""
    import mlx.core as mx

    from fastcoll.gate.device.mlx_backend import MlxBackend

    rec = _Recorder(lang)
    backend = MlxBackend(rec, LAYOUT)
    if direct:
        backend.use_gather(GATHER_AT, GATHER, 1)
    backend.launch(mx.zeros((1, 4096), dtype=mx.bfloat16), "sum", 1000, backend.initial_token(0))
    backend.mark(1, mx.zeros((4,), dtype=mx.float32))
    return {("mark" if "_mark" in name else "gate"): built for name, built in rec.kernels.items()}


def test_the_sources_are_package_data_that_pip_installs():
    """Each kernel source is a file of its package, which pyproject's package-data and MANIFEST.in
    (the sdist) name, so a wheel and `pip install .` carry them; no other file sits beside them."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        section = f.read().split("[tool.setuptools.package-data]\n", 1)[1].split("\n[", 1)[0]
    data = {package: re.findall(r'"([^"]+)"', globs)
            for package, globs in re.findall(r'^"([\w.]+)" = \[(.*)\]$', section, flags=re.M)}
    with open(os.path.join(ROOT, "MANIFEST.in")) as f:
        manifest = f.read()
    for package, files in SOURCES.items():
        found = sorted(p.name for p in resources.files(package).iterdir()
                       if p.is_file() and not p.name.endswith((".py", ".pyc")))
        assert found == sorted(files), package
        for file in files:
            assert read_source(package, file).endswith("\n"), file  # the header's parts end their lines
            assert any(fnmatch(file, glob) for glob in data.get(package, [])), (package, file)
            assert f"*{file[file.rindex('.'):]}" in manifest, file


@pytest.mark.parametrize("direct", [False, True])
def test_one_body_and_one_set_of_helpers_for_both_languages(direct):
    """Both languages get the same body for each kernel, and the same helpers after their
    preludes; only the prelude (and the x address space) differs."""
    c, m = _built(CUDA, direct), _built(METAL, direct)
    for name in BODIES:
        assert c[name][0] == m[name][0] == kernels.minified(kernels.source(name)), name
    helpers = kernels.minified(read_source("fastcoll.gate.device", "gate.h"))
    assert c["gate"][1].endswith(helpers) and m["gate"][1].endswith(helpers)
    assert helpers not in c["mark"][1] and helpers not in m["mark"][1]  # fc_mark calls no helper
    # The one language switch in a body: MLX's Metal backend adds the thread attributes that the
    # source names, so both languages' thread index are written out, chosen by the compiler.
    for name in BODIES:
        body = kernels.source(name)
        outside = re.sub(r"#ifdef __METAL_VERSION__\n.*?#endif\n", "", body, flags=re.S)
        for word in ("threadIdx", "blockDim", "thread_position_in_threadgroup", "threads_per_threadgroup",
                     "__METAL_VERSION__", "metal::", "cuda::", "__syncthreads"):
            assert word not in outside, (name, word)
    assert "thread_position_in_threadgroup.x" in c["gate"][0] and "threadIdx.x" in m["gate"][0]


def test_each_prelude_gives_the_same_primitives_and_nothing_of_the_body():
    helpers = read_source("fastcoll.gate.device", "gate.h")
    for lang in (CUDA, METAL):
        pre = lang.prelude()
        assert PRIMITIVES <= set(_functions(pre)), lang.name
        assert MACROS <= _defines(pre), lang.name
        assert not set(_functions(pre)) & set(_functions(helpers)), lang.name
        header = _header(lang, "gate")
        assert header.index("#define FC_X_SPACE") < header.index(pre) < header.index(helpers)
    assert {"fc_spin", "fc_poison", "fc_apply", "fc_reduce"} <= set(_functions(helpers))


def test_each_language_names_every_gated_dtype_as_mlx_does():
    """A kind's element type is a define of its header (kernels.constants), in the backend's
    language: the names MLX's own kernels use (dtype_to_cuda_type, get_type_string)."""
    from fastcoll.gate.protocol.accept import GATE_DTYPES

    assert set(CUDA.types) == set(METAL.types) == GATE_DTYPES
    assert CUDA.types["bfloat16"] == "__nv_bfloat16" and METAL.types["bfloat16"] == "bfloat16_t"
    for lang in (CUDA, METAL):
        kind = kernels.constants(lang, "float16", 5, 4, 1000, 2**31 - 1)
        assert kind == (f"#define FC_T {lang.types['float16']}\n#define FC_COUNT 5\n#define FC_OP 4\n"
                        "#define FC_MAX_ITERS 1000u\n#define FC_SIG 2147483647u\n")
        assert kind in _header(lang, "gate", kind=kind)


def test_the_spin_is_shared_and_has_no_backoff():
    spin = _block(read_source("fastcoll.gate.device", "gate.h"), "FC_DEVICE fc_uint fc_spin(")
    assert spin in _header(CUDA, "gate") and spin in _header(METAL, "gate")
    for backoff in ("sleep", "nanosleep", "fma", "backoff", "for (", "__nanosleep"):
        assert backoff not in spin.split("{", 1)[1]
    assert "max_iters" in spin  # FASTCOLL_FENCE_MAX_ITERS is the bound
    assert "fc_load(words + FC_RELEASE)" in spin  # every poll a system-scope acquire load


def test_system_scope_on_both_sides():
    pre = METAL.prelude()
    assert pre.startswith("#pragma METAL internals : enable\n")  # in these kernels' header alone
    hm = _header(METAL, "gate")
    assert hm.index("#pragma METAL internals : enable") < hm.index("coherent(")
    assert "typedef volatile coherent(system) device uint* fc_words_t;" in pre
    assert "metal::thread_scope_system" in pre
    # coherent(system) on every access to the control page and the mailboxes: every volatile
    # pointer of the Metal prelude is one, and the shared helpers name no address space at all.
    volatile = re.findall(r"volatile [^*]*\*", pre)
    assert len(volatile) >= 5 and all(v.startswith("volatile coherent(system) device ") for v in volatile), volatile
    helpers = read_source("fastcoll.gate.device", "gate.h") + kernels.source("gate") + kernels.source("mark")
    for space in ("device ", "coherent", "volatile", "threadgroup "):
        assert space not in re.sub(r"//.*", "", helpers), space
    pc = CUDA.prelude()
    assert "cuda::atomic_ref<unsigned int, cuda::thread_scope_system>" in pc
    assert "cuda::memory_order_acquire" in pc and "cuda::memory_order_release" in pc
    assert "const_cast" in pc  # MLX passes inputs as const T*


def test_metal_address_spaces_follow_mlx():
    assert METAL.x_space(7) == "constant" and METAL.x_space(8) == "device"
    assert "#define FC_X_SPACE constant\n" in kernels.header(METAL, "gate", "constant", LAYOUT)
    assert CUDA.x_space(7) == CUDA.x_space(8) == ""


@pytest.mark.parametrize("nbytes", [2, 64, 8192])
def test_a_gate_is_one_kernel_of_one_threadgroup_whose_thread_0_alone_spins(nbytes):
    import mlx.core as mx

    from fastcoll.gate.device.mlx_backend import MlxBackend

    lang = _Recorder()
    backend = MlxBackend(lang, LAYOUT)
    x = mx.zeros((1, nbytes // 2), dtype=mx.bfloat16)
    out, token = backend.launch(x, "sum", 1000, backend.initial_token(0))
    name, kw = lang.launches[0]
    assert len(lang.launches) == 1 and name.startswith(f"fastcoll_gate_gate_bfloat16_{nbytes // 2}_sum_")
    assert kw["grid"] == kw["threadgroup"]  # one threadgroup
    # The kind's constants are in its kernel (lang.kernels), not arguments of each call
    assert "template" not in kw
    header = lang.kernels[name][1]
    assert f"#define FC_COUNT {nbytes // 2}\n" in header and "#define FC_MAX_ITERS 1000u\n" in header
    assert "#define FC_T __nv_bfloat16\n" in header
    # Nothing per gate travels as an array of its own: x, the control page, the previous token.
    assert len(kw["inputs"]) == 3
    assert kw["output_shapes"] == [(1, nbytes // 2), (4,)]  # the result keeps x's shape
    body = kernels.source("gate")
    spin = body.index("fc_wait(")
    guard = body.rindex("if (tid == 0) {", 0, spin)
    assert "}" not in body[guard:spin]  # the spin is inside thread 0's block, and nobody else's
    assert body.count("fc_wait(") == 1
    assert body.index("fc_barrier()", spin) < body.index("fc_reduce<", spin)  # all reduce after the spin


def _preprocessed(lang: Language, name: str, direct: bool) -> str:
    """Kernel `name` (its header as MlxBackend builds it, then its body in a function) after the C
    preprocessor, as the language's compiler would see it, less the prelude's #include and
    #pragma lines (the language's own headers, which are not here)."""
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor (cpp) here")
    kind = kernels.constants(lang, "bfloat16", 4096, 0, 1000, 12345) if name == "gate" else ""
    text = kernels.minified(_header(lang, name, direct, kind)) + "void k() {\n" + kernels.minified(
        kernels.source(name)) + "}\n"
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("#include", "#pragma")))
    metal = ["-D__METAL_VERSION__=310"] if lang is METAL else []
    r = subprocess.run([cpp, "-P", "-undef", "-x", "c++", *metal, "-"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.parametrize("lang,direct", [(CUDA, False), (CUDA, True), (METAL, False)])
@pytest.mark.parametrize("name", BODIES)
def test_every_name_a_kernel_uses_is_defined_in_its_mode(lang, name, direct):
    """After the preprocessor (the #if FC_DIRECT paths resolved for the mode, the thread index
    for the language) no FC_ macro is left undefined, every fc_ function called is defined,
    and what the other mode or language alone uses is gone."""
    text = _preprocessed(lang, name, direct)
    assert not re.findall(r"\bFC_\w+", text), sorted(set(re.findall(r"\bFC_\w+", text)))
    defined = set(re.findall(r"\binline\s+(?:[\w:]+\s+)+?(fc_\w+)\s*\(", text))
    called = set(re.findall(r"\b(fc_\w+)\s*[<(]", text)) - {"fc_bits"}  # Metal's trait type
    assert called <= defined, sorted(called - defined)
    other = "threadIdx" if lang is METAL else "thread_position_in_threadgroup"
    assert other not in text
    if name == "gate":
        assert ("fc_spin_direct(" in text) is direct and ("fc_line(" in text) is direct


def _mlx_cuda_source(gather=None, only: str | None = None) -> str:
    """Every gate kernel as mx.fast.cuda_kernel would build it (mlx/backend/cuda/custom_kernel.cpp:
    the header, then `__global__ void name(const T* input, ..., T* output, ...)` whose body starts
    with the kind's constants defined before it), for each gated dtype and op; the direct mode's
    with `gather`. Without `only`, every kernel under the fullest header (the gate kernel's, as
    written, comments and all); with `only`, that kernel alone under its own header, as MlxBackend
    hands it to MLX."""
    from fastcoll.gate.protocol import layout as L

    def header(name: str) -> str:
        return kernels.header(CUDA, name, "", LAYOUT, 1, gather, GATHER_AT if gather else 0)

    parts = ["#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cstdint>\n",
             header("gate") if only is None else kernels.minified(header(only)), "namespace mlx::core::cu {\n"]
    n = 0
    for name, ctype in CUDA.types.items():
        for op, code in L.OPS.items():
            if only is not None and (name, op) != ("bfloat16", "mean"):  # the header is what differs
                continue
            for which, consts in (
                ("gate", {"COUNT": 4096, "OP": code, "MAX_ITERS": 1000, "SIG": 12345}),
                ("gate", {"COUNT": 5, "OP": code, "MAX_ITERS": 1000, "SIG": 12345}),  # not 16-byte units
                ("mark", {}),
            ):
                if only is not None and which != only:
                    continue
                kernel = kernels.KERNELS[which]
                body = kernels.source(which) if only is None else kernels.minified(kernels.source(which))
                types = {"x": f"const {ctype}*", "dep": f"const {ctype}*", "out": f"{ctype}*"}
                args = [f"{types.get(i, 'const uint32_t*')} {i}" for i in kernel.inputs]
                args += [f"{types.get(o, 'uint32_t*')} {o}" for o in kernel.outputs]
                n += 1
                if consts:  # each kind's header defines its constants (one file here: redefined)
                    parts.append("#undef FC_T\n#undef FC_COUNT\n#undef FC_OP\n#undef FC_MAX_ITERS\n#undef FC_SIG\n"
                                 + kernels.constants(CUDA, name, consts["COUNT"], consts["OP"],
                                                     consts["MAX_ITERS"], consts["SIG"]))
                parts.append(f"__global__ void k{n}_{which}({', '.join(args)}) {{\n" + body + "}\n")
    parts.append("}\n")
    return "\n".join(parts)


def _nvcc(tmp_path, text: str) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA kernels are compiled on the GPU machine only")
    src = tmp_path / "gate.cu"
    src.write_text(text)
    r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "gate.o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("mode", ["host", "direct"])
def test_cuda_kernels_compile(tmp_path, mode):
    """The CUDA side, compiled here as MLX's NVRTC would compile it (no GPU needed), in both modes,
    every kernel under the full header."""
    _nvcc(tmp_path, _mlx_cuda_source(GATHER if mode == "direct" else None))


@pytest.mark.parametrize("mode", ["host", "direct"])
def test_cuda_kernels_compile_each_with_its_own_header(tmp_path, mode):
    """Each kernel under its own header (what MLX compiles: fc_mark's without the helpers), in
    both modes: one file, each kernel and its header in a namespace of its own (the same
    #defines may repeat; the include may not)."""
    gather = GATHER if mode == "direct" else None
    parts = []
    for which in BODIES:
        lines = _mlx_cuda_source(gather, only=which).splitlines()
        parts[:0] = [line for line in lines if line.startswith("#include") and line not in parts]
        body = "\n".join(line for line in lines if not line.startswith("#include"))
        parts.append(f"namespace own_{which} {{\n{body}\n}}\n")
    _nvcc(tmp_path, "\n".join(parts))


def test_minified_drops_comments_blank_lines_and_indentation_only():
    assert kernels.minified("  x = 1;  // why\n\n  // a comment\n#define FC_Y 2u\n") == "x = 1;\n#define FC_Y 2u\n"
    for package, files in SOURCES.items():  # what minified() relies on
        for file in files:
            code = re.sub(r"//.*", "", read_source(package, file))
            assert "/*" not in code and '"' not in code and "'" not in code, file  # no literal holds a //


_WITH_AN_OP = """
import numpy as np
from fastcoll import dtypes
dtypes.REDUCTIONS["bitor"] = dtypes.Reduction(np.bitwise_or, frozenset({"float32"}), "", gate={gate})
dtypes.OPS = tuple(dtypes.REDUCTIONS)
from fastcoll.gate.protocol.accept import gate_accepts
try:
    import fastcoll.gate.device.kernels
except ImportError as e:
    print("refused:", e)
else:
    print("imported; the gate takes bitor:", gate_accepts((4,), "float32", "bitor", 1 << 20))
"""


@pytest.mark.parametrize("gate", [True, False])
def test_an_op_missing_from_the_gpu_kernels_is_refused(gate):
    """A new entry of fastcoll/dtypes.py's table that gives the gate an op gate.h has no kernel
    for makes the device side refuse to import, naming the op (never a sum); one that keeps the op
    off the gate (gate=False) imports, and the gate leaves that op to the host path."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _WITH_AN_OP.replace("{gate}", str(gate))], capture_output=True, text=True,
                       timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    if gate:
        assert r.stdout.startswith("refused: fastcoll/gate/device/gate.h has no kernel for the reduction op(s) "
                                   "bitor, which fastcoll/dtypes.py's REDUCTIONS gives to the gate"), r.stdout
    else:
        assert r.stdout == "imported; the gate takes bitor: False\n", r.stdout


def test_the_import_check_reads_each_ops_specialization():
    helpers = read_source("fastcoll.gate.device", "gate.h")
    assert kernels.implemented_ops(helpers) == {"sum", "prod", "min", "max", "mean"}
    kernels.check_ops(("sum", "mean"), helpers)
    without_min = helpers.replace("struct fastcoll_gpu_implements_op<FC_OP_MIN> {", "struct unrelated {")
    with pytest.raises(ImportError, match=r"no kernel for the reduction op\(s\) min, which"):
        kernels.check_ops(L_OPS, without_min)
