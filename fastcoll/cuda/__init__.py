"""MLX's CUDA backend as fastcoll's kernels see it: the CUDA prelude (prelude.h), the
primitives that the fence gate's kernel body (fastcoll/gate/device/, shared by both GPUs) is
written in, and its LANGUAGE. Nothing here imports the gate: its defines reach the prelude as text,
put before it by the gate's device side.

Ran on an NVIDIA H200 (docs/gate.md). CUDA specifics: MLX passes inputs as `const T*`, so the
control page is written through a const_cast (FC_WORDS). System scope comes from
`cuda::atomic_ref<unsigned, cuda::thread_scope_system>`: acquire loads and release stores
(fc_load, fc_store). MLX arrays live in managed memory once the host has a view of them;
advise.py prefers host memory for the control page so that neither side's accesses migrate it,
and registers the direct mode's gather segment with the GPU.
"""

from __future__ import annotations

from fastcoll.cuda.advise import advise_page, register_host_memory
from fastcoll.gpu.language import Language

LANGUAGE = Language(
    name="cuda",
    title="CUDA",
    package=__name__,
    prelude_file="prelude.h",
    types={"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"},  # MLX's dtype_to_cuda_type
    share_host_memory=register_host_memory,
    advise_page=advise_page,
)
