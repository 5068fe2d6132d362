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

BODIES = ["arrival", "release", "release_wait", "deliver", "mark"]
# What a prelude must define for the shared body.
PRIMITIVES = {"fc_load", "fc_store", "fc_fence", "fc_barrier", "fc_copy_in", "fc_copy_out"}
MACROS = {"FC_DEVICE", "FC_OUT", "FC_X_SPACE", "FC_WORDS", "FC_BYTES"}


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
    return re.findall(r"FC_DEVICE \w+ (fc_\w+)\(", text)


def _defines(text: str) -> set[str]:
    return set(re.findall(r"#define (FC_\w+)", text))


def _block(text: str, start: str) -> str:
    i = text.index(start)
    j = text.index("\n}\n", i)
    return text[i:j]


def test_headers_are_a_prelude_each_over_the_same_helpers():
    hc, hm = kernels.header(cuda, ""), kernels.header(metal, "device")
    assert hc.endswith(kernels.HELPERS) and hm.endswith(kernels.HELPERS)
    # Each prelude gives the primitives the body is written in, and nothing of the body itself.
    for lang in (cuda, metal):
        pre = lang.prelude()
        assert PRIMITIVES <= set(_functions(pre)), lang.LANGUAGE
        assert MACROS <= _defines(pre), lang.LANGUAGE
        assert not set(_functions(pre)) & set(_functions(kernels.HELPERS)), lang.LANGUAGE
    assert {"fc_spin", "fc_poison"} <= set(_functions(kernels.HELPERS))


def test_the_spin_is_shared_and_has_no_backoff():
    spin = _block(kernels.HELPERS, "FC_DEVICE fc_uint fc_spin(")
    assert spin in kernels.header(cuda, "") and spin in kernels.header(metal, "device")
    for backoff in ("sleep", "nanosleep", "fma", "backoff", "for (", "__nanosleep"):
        assert backoff not in spin.split("{", 1)[1]
    assert "max_iters" in spin  # FASTCOLL_FENCE_MAX_ITERS is the bound
    assert "fc_load(words + FC_RELEASE)" in spin  # every poll a system-scope acquire load


def test_system_scope_on_both_sides():
    hm = kernels.header(metal, "device")
    assert hm.lstrip().startswith("#pragma METAL internals : enable")  # scoped: only this header
    assert "typedef volatile coherent(system) device uint* fc_words_t;" in hm
    assert "metal::thread_scope_system" in hm
    hc = kernels.header(cuda, "")
    assert "cuda::atomic_ref<unsigned int, cuda::thread_scope_system>" in hc
    assert "cuda::memory_order_acquire" in hc and "cuda::memory_order_release" in hc
    assert "const_cast" in hc  # MLX passes inputs as const T*


def test_metal_address_spaces_follow_mlx():
    assert metal.x_space(7) == "constant" and metal.x_space(8) == "device"
    assert "#define FC_X_SPACE constant" in kernels.header(metal, "constant")
    assert cuda.x_space(7) == cuda.x_space(8) == ""


def test_release_kernels_are_one_thread_in_one_threadgroup():
    import inspect

    from fastcoll.gate import mlx_backend

    src = inspect.getsource(mlx_backend.MlxBackend.launch)
    for kernel in ('"release"', '"release_wait"'):
        call = src[src.index(f"self._kernel({kernel})"):]
        call = call[: call.index(")\n")]
        assert "grid=(1, 1, 1), threadgroup=(1, 1, 1)" in call, kernel
