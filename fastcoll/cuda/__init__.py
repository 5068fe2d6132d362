"""The fence gate on MLX's CUDA backend: the CUDA prelude under the shared kernel body.

Ran on an NVIDIA H200 (docs/gate.md). CUDA specifics: MLX passes inputs as `const T*`, so the
control page is written through a const_cast (FC_WORDS). System scope comes from
`cuda::atomic_ref<unsigned, cuda::thread_scope_system>`: acquire loads and release stores
(fc_load, fc_store). MLX arrays live in managed memory once the host has a view of them;
`advise` (advise.py) prefers host memory for the control page so that neither side's accesses
migrate it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Callable

LANGUAGE = "cuda"
THREAD_INDEX = ("threadIdx.x", "blockDim.x")
X_SPACES = ("",)  # one address space
TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}  # as MLX's CUDA kernels name them


@lru_cache(maxsize=1)
def prelude() -> str:
    """The CUDA prelude (prelude.cu) that the shared body (fastcoll/gate/kernels.py) needs."""
    return resources.files(__name__).joinpath("prelude.cu").read_text()


def x_space(size: int) -> str:
    """The address space MLX gives an input of `size` elements (CUDA: the only one)."""
    return ""


def make_kernel(name: str, input_names: list[str], output_names: list[str], source: str, header: str) -> Any:
    """Build one kernel through mx.fast.cuda_kernel (compiled at first use)."""
    import mlx.core as mx

    return mx.fast.cuda_kernel(
        name=name, input_names=input_names, output_names=output_names,
        source=source, header=header, ensure_row_contiguous=True,
    )


def unavailable() -> str | None:
    """Why this MLX cannot run the CUDA kernels, or None if it can."""
    try:
        import mlx.core as mx
    except ImportError:
        return "MLX is not installed"
    cuda = getattr(mx, "cuda", None)
    if cuda is None or not cuda.is_available():
        return "MLX has no CUDA GPU here"
    if not hasattr(mx.fast, "cuda_kernel"):
        return "this MLX has no mx.fast.cuda_kernel"
    return None


def share_host_memory(ptr: int, nbytes: int) -> tuple[int, Callable[[], None]] | None:
    """Make host memory (the direct mode's gather segment) reachable from MLX's GPU: its
    GPU-visible address and an undo, or None."""
    from fastcoll.cuda.advise import register_host_memory

    return register_host_memory(ptr, nbytes)


def advise_page(page: Any) -> Callable[[], None] | None:
    """Prefer host memory for the control page and map it for MLX's GPU; an undo, or None."""
    import mlx.core as mx

    from fastcoll.cuda.advise import advise_towards_host

    # MLX runs on CUDA device 0 of those visible (CUDA_VISIBLE_DEVICES picks which GPU that is).
    ordinal = getattr(mx.default_device(), "index", 0) or 0
    return advise_towards_host(page, ordinal)
