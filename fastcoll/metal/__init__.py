"""The fence gate on MLX's Metal backend: the Metal prelude under the shared kernel body.

NOT RUN: no Mac was available to this project; docs/gate.md says what ran on which hardware.

Metal specifics, after MLX's own fence.metal (ml-explore/mlx#1773) and the seed's gate:
- `coherent(system)` on every control-page access, in both kernels: with a plain volatile device
  pointer the GPU never observes the CPU's store (71 of 120 releases missed in the seed's A/B),
  and with coherent(device) it misses about one in a few hundred, a hang every few tokens.
- Reaching that qualifier needs `#pragma METAL internals : enable`. MLX compiles each
  mx.fast.metal_kernel into its own library from its own source, and the pragma is in these
  kernels' prelude alone, so it is scoped to just these kernels. Where it is unavailable the
  kernels fail to compile, the self-test fails, and the host path is used, as the seed does.
- MLX passes inputs of fewer than 8 elements in the `constant` address space and larger ones in
  `device`, so the gate kernel is built twice, once for each address space of x (FC_X_SPACE).
- Copies move 4-, 2- or 1-byte units by sizeof(T), which MLX's arrays of T are aligned to.
- Apple GPUs share memory with the CPU: the control page needs no advice.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Callable

LANGUAGE = "metal"
THREAD_INDEX = ("thread_position_in_threadgroup.x", "threads_per_threadgroup.x")
# MLX binds inputs of fewer than 8 elements as `constant`, larger ones as `device`.
X_SPACES = ("device", "constant")
TYPES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"}  # as MLX's Metal kernels name them
_MAX_CONSTANT_ARRAY_SIZE = 8


@lru_cache(maxsize=1)
def prelude() -> str:
    """The Metal prelude (prelude.metal) that the shared body (fastcoll/gate/kernels.py) needs."""
    return resources.files(__name__).joinpath("prelude.metal").read_text()


def x_space(size: int) -> str:
    """The address space MLX gives an input of `size` elements."""
    return "constant" if size < _MAX_CONSTANT_ARRAY_SIZE else "device"


def make_kernel(name: str, input_names: list[str], output_names: list[str], source: str, header: str) -> Any:
    """Build one kernel through mx.fast.metal_kernel (compiled at first use)."""
    import mlx.core as mx

    return mx.fast.metal_kernel(
        name=name, input_names=input_names, output_names=output_names,
        source=source, header=header, ensure_row_contiguous=True,
    )


def unavailable() -> str | None:
    """Why this MLX cannot run the Metal kernels, or None if it can."""
    try:
        import mlx.core as mx
    except ImportError:
        return "MLX is not installed"
    if not mx.metal.is_available():
        return "MLX has no Metal GPU here"
    if not hasattr(mx.fast, "metal_kernel"):
        return "this MLX has no mx.fast.metal_kernel"
    return None


def share_host_memory(ptr: int, nbytes: int) -> tuple[int, Callable[[], None]] | None:
    """None: a Metal kernel built through MLX cannot reach another process's memory, so the
    gate's direct mode is CUDA's only; Metal gates exchange through the host."""
    return None


def advise_page(page: Any) -> Callable[[], None] | None:
    """Nothing to advise: Apple GPUs and CPUs share memory."""
    return None
