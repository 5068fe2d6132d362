"""The Metal and CUDA gate kernels stay side by side, line for line, with the seed's properties.

Metal cannot run here, so this is what holds the Metal side to the CUDA side that does run (on the
H200): same kernel bodies except the two lines that read a thread's index, the same helpers with
the same signatures and comments, and the load-bearing properties visible in both.
"""

from __future__ import annotations

import re

import pytest

from fastcoll.cuda import kernels as cuda
from fastcoll.metal import kernels as metal

BODIES = ["ARRIVAL", "RELEASE", "RELEASE_WAIT", "DELIVER", "MARK"]
THREAD_INDEX = {
    "const fc_uint tid = threadIdx.x;": "const fc_uint tid = thread_position_in_threadgroup.x;",
    "const fc_uint nthreads = blockDim.x;": "const fc_uint nthreads = threads_per_threadgroup.x;",
}


@pytest.mark.parametrize("name", BODIES)
def test_bodies_match_line_for_line(name):
    c = getattr(cuda, name).strip("\n").splitlines()
    m = getattr(metal, name).strip("\n").splitlines()
    assert len(c) == len(m)
    for line_c, line_m in zip(c, m):
        if line_c.strip() in THREAD_INDEX:
            assert line_m.strip() == THREAD_INDEX[line_c.strip()]
        else:
            assert line_c == line_m


def _comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("//")
            and "side (" not in line]


def _functions(text: str) -> list[str]:
    return re.findall(r"FC_DEVICE \w+ (fc_\w+)\(", text)


def _block(text: str, start: str) -> str:
    i = text.index(start)
    j = text.index("\n}\n", i)
    return text[i:j]


def test_headers_have_the_same_helpers_and_comments():
    hc, hm = cuda.header(""), metal.header("device")
    # CUDA's fc_copy_bytes picks a unit by run-time alignment, which Metal cannot test (it picks
    # by sizeof(T) instead); every other helper exists in both, in the same order.
    assert [f for f in _functions(hc) if f != "fc_copy_bytes"] == _functions(hm)
    assert {"fc_load", "fc_store", "fc_spin", "fc_copy_in", "fc_copy_out", "fc_poison"} <= set(_functions(hc))
    # Every Metal comment is in the CUDA header too, in the same order, apart from the copy's
    # one language note (each says how it copies).
    def strip(comments: list[str]) -> list[str]:
        return [c for c in comments if not (c.startswith("// CUDA") or "Metal:" in c or "FC_BATCH" in c
                or "memory: each load" in c or "alignment MLX" in c or "sizeof(T) up to" in c)]
    assert strip(_comments(hc)) == strip(_comments(hm))


def test_the_spin_is_identical_and_has_no_backoff():
    spin_c = _block(cuda.header(""), "FC_DEVICE fc_uint fc_spin(")
    spin_m = _block(metal.header("device"), "FC_DEVICE fc_uint fc_spin(")
    assert spin_c == spin_m
    for backoff in ("sleep", "nanosleep", "fma", "backoff", "for (", "__nanosleep"):
        assert backoff not in spin_c.split("{", 1)[1]
    assert "max_iters" in spin_c  # FASTCOLL_FENCE_MAX_ITERS is the bound


def test_system_scope_on_both_sides():
    hm = metal.header("device")
    assert hm.lstrip().startswith("#pragma METAL internals : enable")  # scoped: only this header
    assert "typedef volatile coherent(system) device uint* fc_words_t;" in hm
    assert "metal::thread_scope_system" in hm
    hc = cuda.header("")
    assert "cuda::atomic_ref<unsigned int, cuda::thread_scope_system>" in hc
    assert "cuda::memory_order_acquire" in hc and "cuda::memory_order_release" in hc
    assert "const_cast" in hc  # MLX passes inputs as const T*


def test_metal_address_spaces_follow_mlx():
    assert metal.x_space(7) == "constant" and metal.x_space(8) == "device"
    assert "#define FC_X_SPACE constant" in metal.header("constant")
    assert cuda.x_space(7) == cuda.x_space(8) == ""


def test_release_kernels_are_one_thread_in_one_threadgroup():
    import inspect

    from fastcoll.gate import mlx_backend

    src = inspect.getsource(mlx_backend.MlxBackend.launch)
    for kernel in ('"release"', '"release_wait"'):
        call = src[src.index(f"self._kernel({kernel})"):]
        call = call[: call.index(")\n")]
        assert "grid=(1, 1, 1), threadgroup=(1, 1, 1)" in call, kernel
