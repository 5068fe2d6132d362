"""One GPU language of fastcoll's kernels (Metal or CUDA): what differs between the two, and how
a kernel is built through MLX. fastcoll/metal/ and fastcoll/cuda/ each hold one (`LANGUAGE`); it
knows nothing of the gate, whose kernel body the gate's device side puts over a language's prelude."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

# MLX binds an input of fewer elements than this in Metal's `constant` address space.
MAX_CONSTANT_ARRAY_SIZE = 8

ShareHostMemory = Callable[[int, int], "tuple[int, Callable[[], None]] | None"]
AdvisePage = Callable[[Any], "Callable[[], None] | None"]


@lru_cache(maxsize=None)
def read_source(package: str, file: str) -> str:
    """The text of a kernel source file that `package` ships as package data."""
    return resources.files(package).joinpath(file).read_text()


def no_shared_memory(ptr: int, nbytes: int) -> None:
    """A language whose kernels cannot reach another process's memory: no direct mode."""
    return None


def no_advice(page: Any) -> None:
    """A GPU that shares memory with the CPU: the control page needs no advice."""
    return None


@dataclass
class Language:
    """A GPU language as MLX names it: `name` is 'metal' (mx.metal, mx.fast.metal_kernel) or
    'cuda' (mx.cuda, mx.fast.cuda_kernel); its prelude is `prelude_file` of `package`."""

    name: str
    title: str  # as people write it, for messages
    package: str
    prelude_file: str
    types: dict[str, str]  # each gated dtype as MLX's own kernels name it in this language
    # x's address space for an input of at least MAX_CONSTANT_ARRAY_SIZE elements, then for a smaller one.
    x_spaces: tuple[str, ...] = ("",)
    share_host_memory: ShareHostMemory = no_shared_memory  # (ptr, nbytes) -> (GPU address, undo) or None
    advise_page: AdvisePage = no_advice  # the control page -> an undo of the advice, or None

    def prelude(self) -> str:
        """The primitives the shared kernel body is written in, in this language."""
        return read_source(self.package, self.prelude_file)

    def x_space(self, size: int) -> str:
        """The address space MLX gives an input of `size` elements."""
        return self.x_spaces[-1] if size < MAX_CONSTANT_ARRAY_SIZE else self.x_spaces[0]

    def make_kernel(self, name: str, input_names: list[str], output_names: list[str], source: str,
                    header: str) -> Any:
        """One kernel through mx.fast.metal_kernel or mx.fast.cuda_kernel (compiled at first use)."""
        import mlx.core as mx

        build = getattr(mx.fast, f"{self.name}_kernel")
        return build(name=name, input_names=input_names, output_names=output_names,
                     source=source, header=header, ensure_row_contiguous=True)

    def unavailable(self) -> str | None:
        """Why this MLX cannot run the kernels in this language, or None if it can."""
        try:
            import mlx.core as mx
        except ImportError:
            return "MLX is not installed"
        backend = getattr(mx, self.name, None)
        if backend is None or not backend.is_available():
            return f"MLX has no {self.title} GPU here"
        if not hasattr(mx.fast, f"{self.name}_kernel"):
            return f"this MLX has no mx.fast.{self.name}_kernel"
        return None
