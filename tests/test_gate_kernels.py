"""The Metal and CUDA gate kernels are one body over two preludes, with the seed's properties.

Metal cannot run here, so this is what holds the Metal side to the CUDA side that does run (on the
H200): every kernel body and every helper but the language primitives is the same text for both
(fastcoll/gate/kernels.py), each prelude defines the same primitives, and the load-bearing
properties are visible where they live.
"""

from __future__ import annotations

import re

import pytest

from fastcoll import cuda, metal
from fastcoll.gate import kernels
from fastcoll.gate.layout import ControlLayout

LAYOUT = ControlLayout(16 * 1024, 2)

BODIES = ["gate", "mark"]
# What a prelude must define for the shared body.
PRIMITIVES = {"fc_load", "fc_store", "fc_load_relaxed", "fc_store_relaxed", "fc_fence", "fc_barrier",
              "fc_copy_in", "fc_mailbox_at", "fc_div"}
MACROS = {"FC_DEVICE", "FC_OUT", "FC_X_SPACE", "FC_WORDS", "FC_BYTES", "FC_SHARED"}


@pytest.mark.parametrize("name", BODIES)
def test_bodies_match_line_for_line(name):
    """The same body for both languages, but for the expressions that read a thread's index."""
    _, _, c = kernels.source(cuda, name)
    _, _, m = kernels.source(metal, name)
    c_lines, m_lines = c.strip("\n").splitlines(), m.strip("\n").splitlines()
    assert len(c_lines) == len(m_lines)
    for line_c, line_m in zip(c_lines, m_lines):
        for ci, mi in zip(cuda.THREAD_INDEX, metal.THREAD_INDEX):
            line_c = line_c.replace(ci, "@")
            line_m = line_m.replace(mi, "@")
        assert line_c == line_m
    assert "@TID@" not in c and "@TID@" not in m


def _functions(text: str) -> list[str]:
    return re.findall(r"FC_DEVICE \w+ (fc_\w+)[<(]", text)


def _defines(text: str) -> set[str]:
    return set(re.findall(r"#define (FC_\w+)", text))


def _block(text: str, start: str) -> str:
    i = text.index(start)
    j = text.index("\n}\n", i)
    return text[i:j]


def test_headers_are_a_prelude_each_over_the_same_helpers():
    hc, hm = kernels.header(cuda, "", LAYOUT), kernels.header(metal, "device", LAYOUT)
    assert hc.endswith(kernels.HELPERS) and hm.endswith(kernels.HELPERS)
    # Each prelude gives the primitives the body is written in, and nothing of the body itself.
    for lang in (cuda, metal):
        pre = lang.prelude()
        assert PRIMITIVES <= set(_functions(pre)), lang.LANGUAGE
        assert MACROS <= _defines(pre), lang.LANGUAGE
        assert not set(_functions(pre)) & set(_functions(kernels.HELPERS)), lang.LANGUAGE
    assert {"fc_spin", "fc_poison", "fc_apply", "fc_reduce"} <= set(_functions(kernels.HELPERS))


def test_each_language_names_every_gated_dtype_as_mlx_does():
    """A kind's element type is a define of its header (kernels.constants), in the backend's
    language: the names MLX's own kernels use (dtype_to_cuda_type, get_type_string)."""
    from fastcoll.gate.accept import GATE_DTYPES

    assert set(cuda.TYPES) == set(metal.TYPES) == GATE_DTYPES
    assert cuda.TYPES["bfloat16"] == "__nv_bfloat16" and metal.TYPES["bfloat16"] == "bfloat16_t"
    for lang in (cuda, metal):
        kind = kernels.constants(lang, "float16", 5, 4, 1000, 2**31 - 1)
        assert kind == (f"#define FC_T {lang.TYPES['float16']}\n#define FC_COUNT 5\n#define FC_OP 4\n"
                        "#define FC_MAX_ITERS 1000u\n#define FC_SIG 2147483647u\n")


def test_the_spin_is_shared_and_has_no_backoff():
    spin = _block(kernels.HELPERS, "FC_DEVICE fc_uint fc_spin(")
    assert spin in kernels.header(cuda, "", LAYOUT) and spin in kernels.header(metal, "device", LAYOUT)
    for backoff in ("sleep", "nanosleep", "fma", "backoff", "for (", "__nanosleep"):
        assert backoff not in spin.split("{", 1)[1]
    assert "max_iters" in spin  # FASTCOLL_FENCE_MAX_ITERS is the bound
    assert "fc_load(words + FC_RELEASE)" in spin  # every poll a system-scope acquire load


def test_system_scope_on_both_sides():
    hm = kernels.header(metal, "device", LAYOUT)
    assert hm.lstrip().startswith("#pragma METAL internals : enable")  # scoped: only this header
    assert "typedef volatile coherent(system) device uint* fc_words_t;" in hm
    assert "metal::thread_scope_system" in hm
    hc = kernels.header(cuda, "", LAYOUT)
    assert "cuda::atomic_ref<unsigned int, cuda::thread_scope_system>" in hc
    assert "cuda::memory_order_acquire" in hc and "cuda::memory_order_release" in hc
    assert "const_cast" in hc  # MLX passes inputs as const T*


def test_metal_address_spaces_follow_mlx():
    assert metal.x_space(7) == "constant" and metal.x_space(8) == "device"
    assert "#define FC_X_SPACE constant" in kernels.header(metal, "constant", LAYOUT)
    assert cuda.x_space(7) == cuda.x_space(8) == ""


class _Recorder:
    """A backend language whose kernels only record how they are launched (no GPU needed)."""

    LANGUAGE = "recorder"
    THREAD_INDEX = cuda.THREAD_INDEX
    X_SPACES = ("",)
    TYPES = cuda.TYPES

    def __init__(self):
        self.launches: list[tuple[str, dict]] = []
        self.kernels: dict[str, tuple[str, str]] = {}  # name -> (source, header)

    def prelude(self) -> str:
        return cuda.prelude()

    def x_space(self, size: int) -> str:
        return ""

    def make_kernel(self, name, input_names, output_names, source, header):
        import mlx.core as mx

        self.kernels[name] = (source, header)

        def run(**kw):
            self.launches.append((name, kw))
            return [mx.zeros(shape, dtype=dt) for shape, dt in zip(kw["output_shapes"], kw["output_dtypes"])]

        return run


@pytest.mark.parametrize("nbytes", [2, 64, 8192])
def test_a_gate_is_one_kernel_of_one_threadgroup_whose_thread_0_alone_spins(nbytes):
    import mlx.core as mx

    from fastcoll.gate.mlx_backend import MlxBackend

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
    body = kernels.source(cuda, "gate")[2]
    spin = body.index("fc_wait(")
    guard = body.rindex("if (tid == 0) {", 0, spin)
    assert "}" not in body[guard:spin]  # the spin is inside thread 0's block, and nobody else's
    assert body.count("fc_wait(") == 1
    assert body.index("fc_barrier()", spin) < body.index("fc_reduce<", spin)  # all reduce after the spin


def _mlx_cuda_source(gather=None, only: str | None = None) -> str:
    """Every gate kernel as mx.fast.cuda_kernel would build it (mlx/backend/cuda/custom_kernel.cpp:
    the header, then `__global__ void name(const T* input, ..., T* output, ...)` whose body starts
    with the kind's constants defined before it), for each gated dtype and op; the direct mode's with `gather`.
    With `only`, that kernel alone, under the header cut to what it reaches, as MLX gets it."""
    from fastcoll.gate import layout as L

    header = kernels.header(cuda, "", LAYOUT, 1, gather, 0x7F0000001000 if gather else 0)
    if only is not None:
        header = kernels.compiled(header, kernels.source(cuda, only)[2], direct=gather is not None)
    parts = ["#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cstdint>\n",
             header, "namespace mlx::core::cu {\n"]
    n = 0
    for name, ctype in cuda.TYPES.items():
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
                inputs, outputs, body = kernels.source(cuda, which)
                if only is not None:  # as MlxBackend passes it: comments, indentation and the
                    body = kernels.compiled(body, direct=gather is not None)  # other mode gone
                types = {"x": f"const {ctype}*", "dep": f"const {ctype}*", "out": f"{ctype}*"}
                args = [f"{types.get(i, 'const uint32_t*')} {i}" for i in inputs]
                args += [f"{types.get(o, 'uint32_t*')} {o}" for o in outputs]
                n += 1
                if consts:  # each kind's header defines its constants (one file here: redefined)
                    parts.append("#undef FC_T\n#undef FC_COUNT\n#undef FC_OP\n#undef FC_MAX_ITERS\n#undef FC_SIG\n"
                                 + kernels.constants(cuda, name, consts["COUNT"], consts["OP"],
                                                     consts["MAX_ITERS"], consts["SIG"]))
                parts.append(f"__global__ void k{n}_{which}({', '.join(args)}) {{\n" + body + "}\n")
    parts.append("}\n")
    return "\n".join(parts)


@pytest.mark.parametrize("mode", ["host", "direct"])
def test_cuda_kernels_compile(tmp_path, mode):
    """The CUDA side, compiled here as MLX's NVRTC would compile it (no GPU needed), in both modes."""
    import shutil
    import subprocess

    from fastcoll.gate.layout import GatherLayout

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA kernels are compiled on the GPU machine only")
    src = tmp_path / "gate.cu"
    src.write_text(_mlx_cuda_source(GatherLayout(16 * 1024, 2) if mode == "direct" else None))
    r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "gate.o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("mode", ["host", "direct"])
def test_cuda_kernels_compile_each_with_its_own_header(tmp_path, mode):
    """Each kernel under its cut header (what MLX compiles), in both modes: one file, each kernel
    and its header in a namespace of its own (the same #defines may repeat; the include may not)."""
    import shutil
    import subprocess

    from fastcoll.gate.layout import GatherLayout

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA kernels are compiled on the GPU machine only")
    gather = GatherLayout(16 * 1024, 2) if mode == "direct" else None
    parts = []
    for which in BODIES:
        lines = _mlx_cuda_source(gather, only=which).splitlines()
        parts[:0] = [line for line in lines if line.startswith("#include") and line not in parts]
        body = "\n".join(line for line in lines if not line.startswith("#include"))
        parts.append(f"namespace cut_{which} {{\n{body}\n}}\n")
    src = tmp_path / "gate.cu"
    src.write_text("\n".join(parts))
    r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "gate.o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("lang,direct", [(cuda, False), (cuda, True), (metal, False)])
@pytest.mark.parametrize("name", BODIES)
def test_each_kernel_gets_the_helpers_it_reaches(lang, name, direct):
    """A kernel's header is cut to the functions and FC_ macros its body reaches in its mode
    (MLX copies and hashes it at every call): every function the body or a kept helper calls is
    still defined, and every FC_ name used, in the order of the full header; the rest is gone."""
    from fastcoll.gate.layout import GatherLayout

    gather = GatherLayout(16 * 1024, 2) if direct else None
    kind = kernels.constants(lang, "bfloat16", 4096, 0, 1000, 12345) if name == "gate" else ""  # as MlxBackend
    header = kernels.header(lang, lang.X_SPACES[0], LAYOUT, 0, gather, 0x7F0000001000 if direct else 0, kind)
    body = kernels.compiled(kernels.source(lang, name)[2], direct=direct)
    full = kernels.compiled(header, direct=direct).splitlines()
    cut = kernels.compiled(header, body, direct=direct).splitlines()
    assert len(cut) < len(full)
    it = iter(full)
    assert all(line in it for line in cut)  # a subsequence: nothing reordered or rewritten
    text = "\n".join(cut) + body
    assert "#if FC_DIRECT" not in text and "#else" not in text  # resolved for the mode
    defined = set(_functions(text))
    called = set(re.findall(r"\b(fc_\w+)\s*[<(]", text)) - {"fc_bits"}  # Metal's trait type
    assert called <= defined, sorted(called - defined)
    macros = _defines(text)
    used = set(re.findall(r"\bFC_\w+", text)) - {"FC_DIRECT"}
    assert used <= macros, sorted(used - macros)
    assert "FC_DIRECT" in macros  # kept, for a body not resolved for its mode
    assert set(_functions("\n".join(full))) - defined or _defines("\n".join(full)) - macros, "nothing was cut"


def test_the_mode_is_resolved_as_the_compiler_would():
    lines = ["a", "#if FC_DIRECT", "direct", "#else", "host", "#endif", "#ifndef X", "#if FC_DIRECT",
             "d2", "#endif", "#endif", "b"]
    assert kernels.preprocessed(lines, True) == ["a", "direct", "#ifndef X", "d2", "#endif", "b"]
    assert kernels.preprocessed(lines, False) == ["a", "host", "#ifndef X", "#endif", "b"]
    assert kernels.compiled("  x = 1;  // why\n\n  // a comment\n#define FC_Y 2u\n") == "x = 1;\n#define FC_Y 2u\n"


