"""The control page: one persistent, host-visible array of 32-bit words shared by GPU and host.

    byte 0      line 0  ARRIVAL                      written by the GPU (arrival kernel)
    byte 128    line 1  RELEASE, STATUS              written by the host (service thread)
    byte 256    line 2  ACK, SPIN_ITERS,             written by the GPU (release kernel)
                        SPIN_FAILED, SPIN_FAILED_SEQ
    byte 384    line 3  MARK                         written by the GPU (fc_mark, diagnostics)
    byte 4096           send mailbox                 GPU writes x here, the host reads it
    byte 4096+M         receive mailbox              the host writes the result, the GPU reads it
    (M = gate_max_bytes rounded up to 4 KiB; the page is rounded up to 64 KiB)

Words written by different agents sit on different 128-byte lines so that a store by one never
drags the other's line with it. The page is rounded up to 64 KiB, the granularity at which CUDA
applies memory advice, so that no other buffer shares its pages. The kernels get the same
offsets from `c_defines()`, so this module is the one source of truth for them.

Per-gate values reach the kernels through a small params array: the sequence number, the byte
count, the spin's iteration bound and the receive mailbox's offset. Keeping them out of the
kernel source means one compiled kernel per dtype, whatever the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_WORDS = 32  # 128 bytes

# Word offsets (units of uint32).
ARRIVAL = 0
RELEASE = LINE_WORDS
STATUS = LINE_WORDS + 1
ACK = 2 * LINE_WORDS
SPIN_ITERS = 2 * LINE_WORDS + 1
SPIN_FAILED = 2 * LINE_WORDS + 2
SPIN_FAILED_SEQ = 2 * LINE_WORDS + 3
MARK = 3 * LINE_WORDS  # written by fc_mark, a kernel the probe and the benchmark put after a gate

HEADER_BYTES = 4096
SEND_OFFSET = HEADER_BYTES
MAILBOX_ALIGN = 4096
PAGE_BYTES = 64 * 1024

# Status codes in STATUS (host -> GPU) and in the release kernel's status output.
OK = 0
ERROR = 1  # the exchange failed (peer lost, timeout, mismatch): the data is not valid
CLOSED = 2  # the gate was closed or aborted before this gate was served
TIMEOUT = 3  # the GPU's spin hit FASTCOLL_FENCE_MAX_ITERS before the release came

STATUS_NAMES = {OK: "ok", ERROR: "error", CLOSED: "closed", TIMEOUT: "spin timeout"}

# Indices into the per-gate params array (uint32).
P_SEQ = 0
P_NBYTES = 1
P_MAX_ITERS = 2
P_RECV_OFFSET = 3
PARAMS_WORDS = 4

# The release spin compares iterations as signed 32-bit on Metal; keep the bound below that.
MAX_ITERS_LIMIT = 2**31 - 1


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class ControlLayout:
    """Byte offsets and sizes of one control page for mailboxes of `max_bytes`."""

    max_bytes: int

    @property
    def mailbox_bytes(self) -> int:
        return _round_up(max(self.max_bytes, 1), MAILBOX_ALIGN)

    @property
    def send_offset(self) -> int:
        return SEND_OFFSET

    @property
    def recv_offset(self) -> int:
        return SEND_OFFSET + self.mailbox_bytes

    @property
    def total_bytes(self) -> int:
        return _round_up(self.recv_offset + self.mailbox_bytes, PAGE_BYTES)

    @property
    def total_words(self) -> int:
        return self.total_bytes // 4


def c_defines() -> str:
    """The word offsets and status codes as preprocessor defines, for both kernel languages."""
    names = {
        "FC_ARRIVAL": ARRIVAL,
        "FC_RELEASE": RELEASE,
        "FC_STATUS": STATUS,
        "FC_ACK": ACK,
        "FC_SPIN_ITERS": SPIN_ITERS,
        "FC_SPIN_FAILED": SPIN_FAILED,
        "FC_SPIN_FAILED_SEQ": SPIN_FAILED_SEQ,
        "FC_MARK": MARK,
        "FC_SEND_OFFSET": SEND_OFFSET,
        "FC_OK": OK,
        "FC_ERROR": ERROR,
        "FC_CLOSED": CLOSED,
        "FC_TIMEOUT": TIMEOUT,
        "FC_P_SEQ": P_SEQ,
        "FC_P_NBYTES": P_NBYTES,
        "FC_P_MAX_ITERS": P_MAX_ITERS,
        "FC_P_RECV_OFFSET": P_RECV_OFFSET,
    }
    lines = ["// Generated from fastcoll/gate/layout.py: the control page's layout."]
    lines += [f"#define {name} {value}u" for name, value in names.items()]
    return "\n".join(lines) + "\n"
