"""The fence gate's kernels as MLX builds them, from the sources this package ships: one body for
every GPU language, over a prelude per language.

    fc_gate.inc   the gate's one kernel, of one threadgroup: its threads copy x into this rank's
                  slot (the send mailbox; in the direct mode the gather segment); thread 0
                  publishes the arrival and alone spins until the gate is released, while the
                  others wait at a barrier; then all of them reduce every rank's slot into the
                  result, in rank order
    fc_mark.inc   a one-thread diagnostic kernel: MARK = seq once its input is ready
    gate.h        the helpers fc_gate's body calls (the arrival, the spins, the reduction)

mx.fast.metal_kernel and mx.fast.cuda_kernel take a kernel's body as `source` and what precedes
it as `header`. A kernel's header here is the control page's defines (fastcoll/gate/protocol/layout.py)
and FC_X_SPACE, the constants of one kind of gate (`constants`), the language's prelude
(fastcoll/metal/prelude.h, fastcoll/cuda/prelude.h: the primitives the body is written in)
and the helpers its body calls; the compiler resolves the rest (the `#if FC_DIRECT` paths, each
language's thread index). The seed's spin kernel is one thread in one threadgroup because each
further threadgroup slows a saturated GPU while "threads within a threadgroup are free": fc_gate
keeps one threadgroup and one spinning thread, and holds the copy and the reduction in it, so
that the caller's graph holds one node per gate (bench/NOTES.md 33). The host only moves bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from fastcoll.gate.protocol.layout import OPS, ControlLayout, GatherLayout, c_defines
from fastcoll.gpu.language import Language, read_source


@dataclass(frozen=True)
class Kernel:
    """A kernel's argument names (as MLX passes them), the file of its body, and the files of
    helpers its header ends with."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    body: str
    helpers: tuple[str, ...] = ()


KERNELS = {
    "gate": Kernel(("x", "ctrl", "after"), ("out", "token"), "fc_gate.inc", ("gate.h",)),
    "mark": Kernel(("ctrl", "params", "dep"), ("marked",), "fc_mark.inc"),
}


def source(name: str) -> str:
    """The body of kernel `name`, one text for every language."""
    return read_source(__package__, KERNELS[name].body)


def header(lang: Language, name: str, space: str, layout: ControlLayout, rank: int = 0,
           gather: GatherLayout | None = None, gather_address: int = 0, kind: str = "") -> str:
    """What precedes kernel `name` in `lang`: the control page's `layout` (and, in the direct
    mode, the gather segment's, for `rank`, at GPU address `gather_address`), x's address space
    `space`, the constants of one kind of gate (`kind`, from `constants`), the prelude, and the
    helpers the kernel's body calls."""
    parts = [c_defines(layout, rank, gather, gather_address), f"#define FC_X_SPACE {space}\n", kind,
             lang.prelude(), *(read_source(__package__, file) for file in KERNELS[name].helpers)]
    return "".join(parts)  # each part ends its last line


def constants(lang: Language, dtype_name: str, count: int, op_code: int, max_iters: int, sig: int) -> str:
    """The defines of one kind of gate, for its header: the element type in the language, x's
    size, the op, the spin's bound and the signature. They are the kernel's own (one kernel a
    kind, which a model repeats) rather than template arguments, which MLX formats and hashes at
    every call (bench/NOTES.md 45)."""
    return (f"#define FC_T {lang.types[dtype_name]}\n#define FC_COUNT {count}\n#define FC_OP {op_code}\n"
            f"#define FC_MAX_ITERS {max_iters}u\n#define FC_SIG {sig}u\n")


# One specialization of fastcoll_gpu_implements_op in gate.h: the kernel of one op.
_IMPLEMENTS = re.compile(r"^struct fastcoll_gpu_implements_op<FC_OP_(\w+)> \{", re.M)


def implemented_ops(helpers: str) -> frozenset[str]:
    """The ops whose kernel `helpers` (gate.h's text) holds."""
    return frozenset(name.lower() for name in _IMPLEMENTS.findall(helpers))


def check_ops(ops: Iterable[str], helpers: str) -> None:
    """Raise ImportError naming every op of `ops` (the gate's: fastcoll/dtypes.py's entries that
    say gate=True) that `helpers` has no kernel for: such an op is refused here, when the device
    side is imported, rather than found missing by the GPU's compiler in the middle of a job."""
    missing = sorted(set(ops) - implemented_ops(helpers))
    if missing:
        raise ImportError(f"fastcoll/gate/device/gate.h has no kernel for the reduction op(s) {', '.join(missing)}, "
                          "which fastcoll/dtypes.py's REDUCTIONS gives to the gate (gate=True): add a "
                          "fastcoll_gpu_implements_op specialization for each, or set gate=False")


_COMMENT = re.compile(r"\s*//.*$")  # the sources hold no string literals and no /* */ comments


def minified(text: str) -> str:
    """`text` without comments, blank lines and indentation: MLX copies a kernel's header into
    its source at every call and hashes that source at every evaluation, so every byte costs
    each gate."""
    lines = (_COMMENT.sub("", line).strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line) + "\n"


check_ops(OPS, read_source(__package__, "gate.h"))
