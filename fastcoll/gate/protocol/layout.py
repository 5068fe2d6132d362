"""The control page: one persistent, host-visible array of 32-bit words shared by GPU and host.

    byte 0      line 0  ARRIVAL                      written by the GPU (fc_gate's arrival)
    byte 128    line 1  RELEASE, STATUS              written by the host (service thread)
    byte 256    line 2  ACK, SPIN_ITERS,             written by the GPU (fc_gate's spin)
                        SPIN_FAILED (a status),
                        SPIN_FAILED_SEQ, SPIN_FAILED_PEER
    byte 384    line 3  MARK                         written by the GPU (fc_mark, diagnostics)
    byte 4096           send mailbox (M bytes)       the GPU writes x here, the host reads it
    byte 4096+M         receive mailbox (R x M)      the host writes every rank's x, in rank
                                                     order, the GPU reduces them into the result
    (M = gate_max_bytes rounded up to 4 KiB, R = the number of ranks; the page is rounded up to
    64 KiB)

Words written by different agents sit on different 128-byte lines so that a store by one never
drags the other's line with it. The page is rounded up to 64 KiB, the granularity at which CUDA
applies memory advice, so that no other buffer shares its pages. The kernels get the same
offsets from `c_defines()`, so this module is the one source of truth for them.

Nothing per gate travels in an array of its own: the sequence number comes to each gate's
kernel in the previous gate's token (TOKEN_SEQ + 1), and the element type and count, op, spin
bound and signature are defines of the kernel's header (one kernel a kind of gate, which a model
repeats: kernels.constants).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastcoll import dtypes

LINE_WORDS = 32  # 128 bytes

# Word offsets (units of uint32).
ARRIVAL = 0
RELEASE = LINE_WORDS
STATUS = LINE_WORDS + 1
ACK = 2 * LINE_WORDS
SPIN_ITERS = 2 * LINE_WORDS + 1
SPIN_FAILED = 2 * LINE_WORDS + 2  # the status of the first gate the GPU failed (0: none)
SPIN_FAILED_SEQ = 2 * LINE_WORDS + 3
SPIN_FAILED_PEER = 2 * LINE_WORDS + 4  # direct mode: the rank that did not arrive, or differed
MARK = 3 * LINE_WORDS  # written by fc_mark, a kernel the probe and the benchmark put after a gate

HEADER_BYTES = 4096
SEND_OFFSET = HEADER_BYTES
MAILBOX_ALIGN = 4096
PAGE_BYTES = 64 * 1024

# A gate's token (the last kernel's second output, the next gate's arrival input): four words,
# so that MLX keeps it in device memory (it puts allocations of 8 bytes or less in managed memory).
TOKEN_SEQ = 0  # the gate's sequence number
TOKEN_STATUS = 1  # its status: a spin timeout travels on, so later spins do not wait
TOKEN_WORDS = 4

# The reduction ops the gate takes, as the kernels' FC_OP constant: fastcoll/dtypes.py's entries
# that say gate=True, each with its code there.
OPS = {name: code for code, (name, op) in enumerate(dtypes.REDUCTIONS.items()) if op.gate}

# Status codes in STATUS (host -> GPU) and in the gate kernel's token.
OK = 0
ERROR = 1  # the exchange failed (peer lost, timeout, mismatch): the data is not valid
CLOSED = 2  # the gate was closed or aborted before this gate was served
TIMEOUT = 3  # the GPU's spin hit FASTCOLL_FENCE_MAX_ITERS before the release came
MISMATCH = 4  # direct mode: a rank's signature of this gate differs from this rank's

STATUS_NAMES = {OK: "ok", ERROR: "error", CLOSED: "closed", TIMEOUT: "spin timeout", MISMATCH: "mismatch"}

# Indices into the params array of fc_mark (diagnostics only).
P_SEQ = 0
PARAMS_WORDS = 4

# The release spin compares iterations as signed 32-bit on Metal; keep the bound below that.
MAX_ITERS_LIMIT = 2**31 - 1


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class ControlLayout:
    """Byte offsets and sizes of one control page for gates of up to `max_bytes` on `ranks` ranks."""

    max_bytes: int
    ranks: int = 1

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
    def recv_bytes(self) -> int:
        return self.ranks * self.mailbox_bytes

    @property
    def total_bytes(self) -> int:
        return _round_up(self.recv_offset + self.recv_bytes, PAGE_BYTES)

    @property
    def total_words(self) -> int:
        return self.total_bytes // 4


@dataclass(frozen=True)
class GatherLayout:
    """The gather segment of the direct mode (fastcoll/gate/host/direct_mode.py): host memory that every
    rank of one host maps and its GPU reaches directly.

        rank p's line (128 bytes at p * 128)   FLAG (the last gate it arrived at), SIG (the
                                               signature of its last gate of each parity, 2
                                               words), PID (its process)
        at HEADER_BYTES: two sets of slots      set s = gates of parity s; in a set, rank p's x
                                               at p * nbytes (nbytes: this gate's size)

    Two sets, because a rank may arrive at gate k + 1 (and write its slot) while a slower one
    still reduces gate k; it cannot arrive at k + 2 before everyone has arrived at k + 1, by
    which time gate k is done everywhere.
    """

    max_bytes: int
    ranks: int

    @property
    def header_bytes(self) -> int:
        return _round_up(self.ranks * LINE_WORDS * 4, MAILBOX_ALIGN)

    @property
    def set_bytes(self) -> int:
        return self.ranks * _round_up(max(self.max_bytes, 1), MAILBOX_ALIGN)

    @property
    def total_bytes(self) -> int:
        return _round_up(self.header_bytes + 2 * self.set_bytes, PAGE_BYTES)

    def line(self, rank: int) -> int:
        """The word index of `rank`'s line."""
        return rank * LINE_WORDS


# Words of a rank's line in the gather segment.
G_FLAG = 0
G_SIG = 1  # and 2: one per parity of the gate's sequence number
G_PID = 3


def signature(op: str, dtype_name: str, shape: tuple) -> int:
    """A gate's signature as the direct mode compares it across ranks: a 31-bit hash of what
    the host path's header checks (op, dtype, shape)."""
    import zlib

    return zlib.crc32(f"all_reduce({op},{dtype_name},{tuple(shape)})".encode()) & 0x7FFFFFFF


def c_defines(layout: ControlLayout, rank: int = 0, gather: GatherLayout | None = None,
              gather_address: int = 0) -> str:
    """The word offsets, status codes and `layout`'s mailboxes as preprocessor defines, for both
    kernel languages; with `gather`, the direct mode's (FC_DIRECT 1) for rank `rank`, over the
    segment at GPU address `gather_address` (a constant of the kernels: a pointer that every
    thread loaded from the control page cost a bus round trip per thread, bench/NOTES.md 26)."""
    names = {
        "FC_ARRIVAL": ARRIVAL,
        "FC_RELEASE": RELEASE,
        "FC_STATUS": STATUS,
        "FC_ACK": ACK,
        "FC_SPIN_ITERS": SPIN_ITERS,
        "FC_SPIN_FAILED": SPIN_FAILED,
        "FC_SPIN_FAILED_SEQ": SPIN_FAILED_SEQ,
        "FC_SPIN_FAILED_PEER": SPIN_FAILED_PEER,
        "FC_MARK": MARK,
        "FC_SEND_OFFSET": SEND_OFFSET,
        "FC_RECV_OFFSET": layout.recv_offset,
        "FC_RANKS": layout.ranks,
        "FC_OK": OK,
        "FC_ERROR": ERROR,
        "FC_CLOSED": CLOSED,
        "FC_TIMEOUT": TIMEOUT,
        "FC_MISMATCH": MISMATCH,
        "FC_TOKEN_SEQ": TOKEN_SEQ,
        "FC_TOKEN_STATUS": TOKEN_STATUS,
        "FC_P_SEQ": P_SEQ,
        **{f"FC_OP_{name.upper()}": code for name, code in OPS.items()},
        "FC_RANK": rank,
        "FC_DIRECT": int(gather is not None),
        "FC_G_LINE_BYTES": LINE_WORDS * 4,
        "FC_G_FLAG": G_FLAG,
        "FC_G_SIG": G_SIG,
        "FC_G_HEADER": gather.header_bytes if gather else 0,
        "FC_G_SET_BYTES": gather.set_bytes if gather else 0,
    }
    lines = ["// Generated from fastcoll/gate/protocol/layout.py: the control page's layout."]
    lines += [f"#define {name} {value}u" for name, value in names.items()]
    lines.append(f"#define FC_GATHER_AT {gather_address:#x}ull")
    return "\n".join(lines) + "\n"
