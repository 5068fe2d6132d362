"""The fence gate's GPU kernels: one body, written once, for every GPU language.

Each backend (fastcoll/metal/, fastcoll/cuda/) has a prelude in its own language that defines the
few primitives the body is written in; this module holds everything else, so the twins cannot
drift. The prelude gives:

    fc_uint, fc_words_t, fc_bytes_t   a 32-bit word; pointers into the control page
    FC_DEVICE, FC_OUT, FC_X_SPACE      a device function; the outputs' and x's address spaces
    FC_WORDS(p), FC_BYTES(p)          the control page as words or bytes (MLX passes it as input)
    fc_load(p), fc_store(p, v)        system-scope acquire load, release store of a control word
    fc_fence(), fc_barrier()          system-scope fence of this thread's stores; threadgroup barrier
    FC_SHARED                         a variable every thread of the threadgroup shares
    fc_load_relaxed, fc_store_relaxed  the same, atomic but ordering nothing around them
    fc_copy_in(dst, x, n, tid, nt)    x (n bytes) into the send mailbox, as thread tid of nt
    fc_mailbox_at<T>(base, i)         element i of a receive-mailbox slot, as a T
    fc_div(a, b)                      a / b correctly rounded (whatever the fast-math flags)

and the two expressions that read a thread's index (THREAD_INDEX in the backend's module).
`header(lang, space)` and `source(lang, name)` assemble what mx.fast.metal_kernel or
mx.fast.cuda_kernel compiles. The load-bearing properties from the seed (docs/gate.md): both
kernels reach the control page only through system-scope accesses; the release spin is one thread
of one threadgroup, with no backoff and no chunking, bounded by FASTCOLL_FENCE_MAX_ITERS.

A gate is one kernel in the caller's graph, of one threadgroup:

    fc_gate    its threads copy x into this rank's slot (the send mailbox; in the direct mode
               the gather segment); thread 0 publishes ARRIVAL (the previous token's seq + 1)
               and alone spins until the gate is released, while the others wait at a barrier;
               then all of them reduce every rank's slot (which the host gathered, or the peers'
               GPUs wrote) into the result, in rank order

The seed's spin kernel is one thread in one threadgroup because each further threadgroup slows a
saturated GPU (one costs 4%, two 21%, four 61%) while "threads within a threadgroup are free";
fc_gate keeps the one threadgroup and the one spinning thread, and puts the copy and the
reduction that were kernels of their own (arrival, deliver) into the same threadgroup, so that
the caller's graph holds one node per gate instead of three (bench/NOTES.md 33).

The host only moves bytes: the reduction runs on the GPU, in float, rounded to the dtype after
every rank as the host path rounds it.
"""

from __future__ import annotations

import re
from types import ModuleType

from fastcoll.gate.layout import ControlLayout, GatherLayout, c_defines

HELPERS = r"""
// ---- the body both languages share (fastcoll/gate/kernels.py) ----

// All-ones bytes into out: NaN in every float type.
template <typename T>
FC_DEVICE void fc_poison(FC_OUT T* dst, fc_uint n, fc_uint tid, fc_uint nthreads) {
  FC_OUT unsigned char* d = (FC_OUT unsigned char*)(dst);
  for (fc_uint i = tid; i < n; i += nthreads) {
    d[i] = 0xFF;
  }
}

// The first gate that failed on the GPU (a spin timeout, a signature mismatch), for the host.
FC_DEVICE void fc_record_failure(fc_words_t words, fc_uint seq, fc_uint status, fc_uint peer) {
  fc_store_relaxed(words + FC_SPIN_FAILED_SEQ, seq);
  fc_store_relaxed(words + FC_SPIN_FAILED_PEER, peer);
  fc_store(words + FC_SPIN_FAILED, status);
}

// The release spin: one thread, no backoff and no chunking. Each iteration is one system-scope
// acquire load of RELEASE, compared wrap-aware as in fastcoll/gate/seq.py; max_iters
// (FASTCOLL_FENCE_MAX_ITERS) bounds it as a backstop only, since the host stores RELEASE on every
// failure path. A gate whose predecessor failed (prev, from the token chain) does not wait: after
// a spin timeout the host is gone or stuck. Writes SPIN_ITERS and ACK (relaxed: for the profile),
// and SPIN_FAILED once the bound is hit.
FC_DEVICE fc_uint fc_spin(fc_words_t words, fc_uint seq, fc_uint prev, fc_uint max_iters) {
  fc_uint status = prev;
  fc_uint iters = 0;
  if (status == FC_OK) {
    while ((int)(fc_load(words + FC_RELEASE) - seq) < 0) {
      if (++iters >= max_iters) {
        status = FC_TIMEOUT;
        fc_record_failure(words, seq, status, FC_RANK);
        break;
      }
    }
  }
  fc_store_relaxed(words + FC_SPIN_ITERS, iters);
  fc_store_relaxed(words + FC_ACK, seq);
  return status;
}

#if FC_DIRECT
// The direct mode (ranks of one host: fastcoll/gate/direct_mode.py). Every rank's GPU writes its x
// into the gather segment and raises its FLAG there; nobody's host moves a byte per gate.

// Rank p's line in the gather segment.
FC_DEVICE fc_words_t fc_line(fc_bytes_t gather, fc_uint p) {
  return (fc_words_t)(gather + p * FC_G_LINE_BYTES);
}

// The direct mode's spin: one thread, no backoff and no chunking, as fc_spin, but it waits for
// every rank's FLAG to reach seq (one system-scope acquire load per iteration); RELEASE now only
// ends the wait early, stored by the host on failure (a peer lost, a timeout). Then every rank's
// signature of this gate must be this rank's: a rank that called another collective is a
// mismatch, never data.
FC_DEVICE fc_uint fc_spin_direct(fc_words_t words, fc_bytes_t gather, fc_uint seq, fc_uint prev, fc_uint sig,
                                 fc_uint max_iters) {
  fc_uint status = prev;
  fc_uint iters = 0;
  fc_uint p = 0;
  if (status == FC_OK) {
    while (p < FC_RANKS) {
      if ((int)(fc_load(fc_line(gather, p) + FC_G_FLAG) - seq) >= 0) {
        ++p;
      } else if ((int)(fc_load(words + FC_RELEASE) - seq) >= 0) {
        status = fc_load(words + FC_STATUS);  // the host gave up on this gate, and says why
        status = status == FC_OK ? FC_ERROR : status;
        break;
      } else if (++iters >= max_iters) {
        status = FC_TIMEOUT;
        fc_record_failure(words, seq, status, p);
        break;
      }
    }
  }
  if (status == FC_OK) {
    for (p = 0; p < FC_RANKS; ++p) {
      if (fc_load_relaxed(fc_line(gather, p) + FC_G_SIG + (seq & 1u)) != sig) {
        status = FC_MISMATCH;
        fc_record_failure(words, seq, status, p);
        break;
      }
    }
  }
  fc_store_relaxed(words + FC_SPIN_ITERS, iters);
  fc_store_relaxed(words + FC_ACK, seq);
  return status;
}
#endif

// Where gate seq's slots are (every rank's x, rank p's at p * its size): the receive mailbox
// the host fills, or in the direct mode the gather segment's set of seq's parity.
FC_DEVICE fc_bytes_t fc_slots(fc_words_t words, fc_uint seq) {
#if FC_DIRECT
  return fc_at(FC_GATHER_AT) + FC_G_HEADER + (seq & 1u) * FC_G_SET_BYTES;
#else
  return FC_BYTES(words) + FC_RECV_OFFSET;
#endif
}

// Where this rank's GPU puts x for gate seq: the send mailbox, or its own slot.
FC_DEVICE fc_bytes_t fc_own_slot(fc_words_t words, fc_uint seq, fc_uint nbytes) {
#if FC_DIRECT
  return fc_slots(words, seq) + FC_RANK * nbytes;
#else
  return FC_BYTES(words) + FC_SEND_OFFSET;
#endif
}

// Publish this rank's arrival at gate seq with system-scope release stores, once x is in its
// slot: in the direct mode the gate's signature and FLAG in this rank's line of the gather
// segment (ARRIVAL too, for the watcher only: the peers read FLAG), else ARRIVAL for the host.
FC_DEVICE void fc_arrive(fc_words_t words, fc_uint seq, fc_uint sig) {
#if FC_DIRECT
  fc_words_t line = fc_line(fc_at(FC_GATHER_AT), FC_RANK);
  fc_store_relaxed(line + FC_G_SIG + (seq & 1u), sig);
  fc_store(line + FC_G_FLAG, seq);
  fc_store_relaxed(words + FC_ARRIVAL, seq);
#else
  fc_store(words + FC_ARRIVAL, seq);
#endif
}

// The spin of either mode, then the host's STATUS of the gate (an acquire load after the spin's):
// the gate's status, which the spinning thread alone reads. Every thread loading a control word
// would be a bus round trip each (these loads do not coalesce): the other threads get the status
// from the spinning thread instead (bench/NOTES.md, entry 26).
FC_DEVICE fc_uint fc_wait(fc_words_t words, fc_uint seq, fc_uint prev, fc_uint sig, fc_uint max_iters) {
#if FC_DIRECT
  fc_uint status = fc_spin_direct(words, fc_at(FC_GATHER_AT), seq, prev, sig, max_iters);
#else
  fc_uint status = fc_spin(words, seq, prev, max_iters);
#endif
  if (status == FC_OK) {
    status = fc_load(words + FC_STATUS);
  }
  return status;
}

// One step of a reduction, as the host path computes it (fastcoll/dtypes.py): in float, the
// result rounded to the dtype by the caller after every rank; min and max propagate NaN as
// numpy's minimum and maximum do.
template <int OP>
FC_DEVICE float fc_apply(float a, float b) {
  if (OP == FC_OP_PROD) {
    return a * b;
  }
  if (OP == FC_OP_MIN) {
    return (a < b || a != a) ? a : b;
  }
  if (OP == FC_OP_MAX) {
    return (a > b || a != a) ? a : b;
  }
  return a + b;  // sum, and mean before its division
}

// out[i] = the reduction of element i over the receive mailbox's FC_RANKS slots (slot p holds
// rank p's x, COUNT elements of T each, back to back), combined in rank order on every rank so
// that every rank gets the same bits, as thread tid of nthreads. Each thread loads BATCH
// elements of every slot before it combines them: the mailbox is in host memory, where each load
// is a bus round trip, so the loads must be in flight together.
template <typename T, int OP, int COUNT, int BATCH>
FC_DEVICE void fc_reduce(FC_OUT T* out, fc_bytes_t recv, fc_uint tid, fc_uint nthreads) {
  for (fc_uint first = tid; first < (fc_uint)COUNT; first += BATCH * nthreads) {
    T w[FC_RANKS][BATCH];
    for (fc_uint p = 0; p < FC_RANKS; ++p) {
      for (fc_uint k = 0; k < BATCH; ++k) {
        const fc_uint i = first + k * nthreads;
        if (i < (fc_uint)COUNT) {
          w[p][k] = fc_mailbox_at<T>(recv + p * (COUNT * sizeof(T)), i);
        }
      }
    }
    for (fc_uint k = 0; k < BATCH; ++k) {
      const fc_uint i = first + k * nthreads;
      if (i < (fc_uint)COUNT) {
        float acc = (float)(w[0][k]);
        for (fc_uint p = 1; p < FC_RANKS; ++p) {
          acc = (float)((T)(fc_apply<OP>(acc, (float)(w[p][k]))));
        }
        if (OP == FC_OP_MEAN) {
          acc = fc_div(acc, (float)(FC_RANKS));
        }
        out[i] = (T)(acc);
      }
    }
  }
}
"""

# Each kernel: (input names, output names, body). @TID@ and @NTHREADS@ are the backend's
# THREAD_INDEX expressions (MLX adds a thread attribute to the signature only where the body
# names it, so they are written out, not hidden behind a macro). The constants of one kind of
# gate, defined in its header (`constants`): FC_T (the dtype), FC_COUNT (x's size in elements),
# FC_OP (layout.OPS), FC_MAX_ITERS (FASTCOLL_FENCE_MAX_ITERS), FC_SIG (layout.signature).
KERNELS: dict[str, tuple[list[str], list[str], str]] = {
    # One threadgroup of GATE_THREADS threads, of which one spins.
    "gate": (["x", "ctrl", "after"], ["out", "token"], r"""
  // fc_gate: a whole gate in one threadgroup, one kernel in the caller's graph. Its threads copy
  // x into this rank's slot; thread 0 publishes the arrival and then alone spins until the gate
  // is released (the one-thread spin: the other threads wait at the barrier, issuing nothing);
  // then all of them reduce every rank's slot into out, with the status the spinning thread
  // read, passed through threadgroup memory.
  FC_SHARED fc_uint gate_status;
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint tid = @TID@;
  const fc_uint nthreads = @NTHREADS@;
  const fc_uint seq = after[FC_TOKEN_SEQ] + 1u;
  const fc_uint nbytes = FC_COUNT * sizeof(FC_T);
  fc_copy_in(fc_own_slot(words, seq, nbytes), x, nbytes, tid, nthreads);
  // Every thread's stores of x reach system scope before the threadgroup meets...
  fc_fence();
  fc_barrier();
  if (tid == 0) {
    fc_arrive(words, seq, FC_SIG);  // ...and only then is the arrival published
    gate_status = fc_wait(words, seq, after[FC_TOKEN_STATUS], FC_SIG, FC_MAX_ITERS);
  }
  // The spinning thread's acquire loads order the peers' (or the host's) stores of the slots
  // before this barrier, and the barrier orders them before every thread's loads below.
  fc_barrier();
  const fc_uint status = gate_status;
  if (status == FC_OK) {
    fc_reduce<FC_T, FC_OP, FC_COUNT, 8>(out, fc_slots(words, seq), tid, nthreads);
  } else {
    // No valid data: all-ones bytes (NaN), and the host raises the error at the next call.
    fc_poison(out, nbytes, tid, nthreads);
  }
  if (tid == 0) {
    token[FC_TOKEN_SEQ] = seq;
    token[FC_TOKEN_STATUS] = status;
  }
"""),
    # One thread in one threadgroup.
    "mark": (["ctrl", "params", "dep"], ["marked"], r"""
  // fc_mark: stores seq into MARK once dep is ready; the host times "GPU continuing" with it.
  fc_words_t words = FC_WORDS(ctrl);
  fc_store(words + FC_MARK, params[FC_P_SEQ]);
  marked[0] = params[FC_P_SEQ];
"""),
}


def header(lang: ModuleType, space: str, layout: ControlLayout, rank: int = 0,
           gather: GatherLayout | None = None, gather_address: int = 0, kind: str = "") -> str:
    """What precedes every kernel: the backend's prelude (x in address space `space`), the
    control page's `layout` (and, in the direct mode, the gather segment's, for `rank`, at GPU
    address `gather_address`), the constants of one kind of gate (`kind`, from `constants`), and
    the shared helpers."""
    defines = c_defines(layout, rank, gather, gather_address) + kind
    return lang.prelude().replace("@DEFINES@", defines).replace("@X_SPACE@", space) + HELPERS


def constants(lang: ModuleType, dtype_name: str, count: int, op_code: int, max_iters: int, sig: int) -> str:
    """The defines of one kind of gate, for its header: the element type in the backend's
    language, x's size, the op, the spin's bound and the signature. They are the kernel's own
    (one kernel a kind, which a model repeats) rather than template arguments, which MLX
    formats and hashes at every call (bench/NOTES.md 45)."""
    return (f"#define FC_T {lang.TYPES[dtype_name]}\n#define FC_COUNT {count}\n#define FC_OP {op_code}\n"
            f"#define FC_MAX_ITERS {max_iters}u\n#define FC_SIG {sig}u\n")


_END_COMMENT = re.compile(r"\s*//.*$")  # the kernels hold no string literals


def compiled(text: str, used_by: str | None = None, direct: bool | None = None) -> str:
    """`text` as the compiler needs it: without comment lines, blank lines and indentation. MLX
    copies a kernel's header into its source at every call and hashes that source at every
    evaluation, so every byte here costs each gate. With `direct` (the mode, True or False), the
    `#if FC_DIRECT` blocks are resolved for it; with `used_by` (a kernel's body), the functions
    that the body does not reach (in that mode) are gone too: each kernel gets the part of the
    header it needs."""
    lines = [_END_COMMENT.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if direct is not None:
        lines = preprocessed(lines, direct)
    if used_by is not None:
        body = used_by if direct is None else "\n".join(preprocessed(used_by.splitlines(), direct))
        lines = _reachable(lines, body)
    return "\n".join(lines) + "\n"


def preprocessed(lines: list[str], direct: bool) -> list[str]:
    """`lines` as the compiler sees them with FC_DIRECT = `direct`: each `#if FC_DIRECT` block
    (and its `#else`) resolved; every other preprocessor line kept as it is."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # per open #if: (is it FC_DIRECT's, are its lines kept)
    for line in lines:
        word = line.split(None, 1)[0] if line.startswith("#") else ""
        if word in ("#if", "#ifdef", "#ifndef"):
            ours = line.split() == ["#if", "FC_DIRECT"]
            stack.append((ours, direct if ours else True))
            if ours:
                continue
        elif word == "#else" and stack and stack[-1][0]:
            stack[-1] = (True, not direct)
            continue
        elif word == "#endif" and stack:
            ours, _ = stack.pop()
            if ours:
                continue
        if all(kept for _, kept in stack):
            out.append(line)
    return out


_DEFINITION = re.compile(r"^FC_DEVICE\b[^(]*?\b(fc_\w+)\s*[<(]")
_MACRO = re.compile(r"^#define (FC_\w+)")
_NAME = re.compile(r"\b(?:fc|FC)_\w+")


def _reachable(lines: list[str], body: str) -> list[str]:
    """`lines` less the function definitions (FC_DEVICE ..., with a template line before it) and
    the FC_ macros that `body` reaches neither directly nor through another kept definition.
    Everything else (other preprocessor lines, typedefs, types) stays, with what it names."""
    items: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(lines):
        start = i
        macro = _MACRO.match(lines[i])
        if macro is not None:
            items.append((macro.group(1), lines[i : i + 1]))
            i += 1
            continue
        if lines[i].startswith("template <") and i + 1 < len(lines) and _DEFINITION.match(lines[i + 1]):
            i += 1
        match = _DEFINITION.match(lines[i])
        if match is None:
            items.append((None, lines[start : i + 1]))
            i += 1
            continue
        depth, j = 0, i
        while True:  # to the brace that closes the definition
            if j == len(lines):
                raise ValueError(f"the kernel header's definition of {match.group(1)} never closes")
            depth += lines[j].count("{") - lines[j].count("}")
            if depth == 0 and "{" in "".join(lines[i : j + 1]):
                break
            j += 1
        items.append((match.group(1), lines[start : j + 1]))
        i = j + 1
    # FC_DIRECT stays whatever is used: a body whose #if FC_DIRECT blocks are still there would
    # otherwise read it as 0, the host mode, in the direct mode.
    needed, todo = set(), set(_NAME.findall(body)) | {"FC_DIRECT"}
    for defined, text in items:
        if defined is None:
            todo |= set(_NAME.findall("\n".join(text)))
    while todo:
        name = todo.pop()
        needed.add(name)
        for defined, text in items:
            if defined == name:
                todo |= set(_NAME.findall("\n".join(text))) - needed
    return [line for defined, text in items if defined is None or defined in needed for line in text]


def source(lang: ModuleType, name: str) -> tuple[list[str], list[str], str]:
    """(input names, output names, body) of kernel `name` in the backend's language."""
    inputs, outputs, body = KERNELS[name]
    tid, nthreads = lang.THREAD_INDEX
    return inputs, outputs, body.replace("@TID@", tid).replace("@NTHREADS@", nthreads)
