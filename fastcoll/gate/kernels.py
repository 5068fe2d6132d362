"""The fence gate's GPU kernels: one body, written once, for every GPU language.

Each backend (fastcoll/metal/, fastcoll/cuda/) has a prelude in its own language that defines the
few primitives the body is written in; this module holds everything else, so the twins cannot
drift. The prelude gives:

    fc_uint, fc_words_t, fc_bytes_t   a 32-bit word; pointers into the control page
    FC_DEVICE, FC_OUT, FC_X_SPACE      a device function; the outputs' and x's address spaces
    FC_WORDS(p), FC_BYTES(p)          the control page as words or bytes (MLX passes it as input)
    fc_load(p), fc_store(p, v)        system-scope acquire load, release store of a control word
    fc_fence(), fc_barrier()          system-scope fence of this thread's stores; threadgroup barrier
    fc_copy_in(dst, x, n, tid, nt)    x (n bytes) into the send mailbox, as thread tid of nt
    fc_copy_out(out, src, n, tid, nt) the receive mailbox (n bytes) into out

and the two expressions that read a thread's index (THREAD_INDEX in the backend's module).
`header(lang, space)` and `source(lang, name)` assemble what mx.fast.metal_kernel or
mx.fast.cuda_kernel compiles. The load-bearing properties from the seed (docs/gate.md): both
kernels reach the control page only through system-scope accesses; the release spin is one thread
in one threadgroup, with no backoff and no chunking, bounded by FASTCOLL_FENCE_MAX_ITERS.
"""

from __future__ import annotations

from types import ModuleType

from fastcoll.gate.layout import c_defines

HELPERS = r"""
// ---- the body both languages share (fastcoll/gate/kernels.py) ----

// All-ones bytes into out: NaN in every float type, -1 in every signed integer type.
template <typename T>
FC_DEVICE void fc_poison(FC_OUT T* dst, fc_uint n, fc_uint tid, fc_uint nthreads) {
  FC_OUT unsigned char* d = (FC_OUT unsigned char*)(dst);
  for (fc_uint i = tid; i < n; i += nthreads) {
    d[i] = 0xFF;
  }
}

// The release spin: one thread, no backoff and no chunking. Each iteration is one system-scope
// acquire load of RELEASE, compared wrap-aware as in fastcoll/gate/seq.py; max_iters
// (FASTCOLL_FENCE_MAX_ITERS) bounds it as a backstop only, since the host stores RELEASE on every
// failure path. Writes SPIN_ITERS and ACK, and SPIN_FAILED once the bound is hit.
FC_DEVICE fc_uint fc_spin(fc_words_t words, fc_uint seq, fc_uint max_iters) {
  fc_uint status = FC_OK;
  fc_uint iters = 0;
  if (fc_load(words + FC_SPIN_FAILED) != 0u) {
    // An earlier spin hit its bound: the host is gone or stuck, so do not wait again.
    status = FC_TIMEOUT;
  } else {
    while ((int)(fc_load(words + FC_RELEASE) - seq) < 0) {
      if (++iters >= max_iters) {
        status = FC_TIMEOUT;
        break;
      }
    }
    if (status == FC_OK) {
      status = fc_load(words + FC_STATUS);
    }
  }
  if (status == FC_TIMEOUT) {
    fc_store(words + FC_SPIN_FAILED_SEQ, seq);
    fc_store(words + FC_SPIN_FAILED, 1u);
  }
  fc_store(words + FC_SPIN_ITERS, iters);
  fc_store(words + FC_ACK, seq);
  return status;
}
"""

# Each kernel: (input names, output names, body). @TID@ and @NTHREADS@ are the backend's
# THREAD_INDEX expressions (MLX adds a thread attribute to the signature only where the body
# names it, so they are written out, not hidden behind a macro).
KERNELS: dict[str, tuple[list[str], list[str], str]] = {
    # One threadgroup of ARRIVAL_THREADS threads.
    "arrival": (["x", "ctrl", "params", "after"], ["arrived"], r"""
  // fc_arrival: one threadgroup copies x into the send mailbox, then one thread publishes seq.
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint seq = params[FC_P_SEQ];
  const fc_uint nbytes = params[FC_P_NBYTES];
  const fc_uint tid = @TID@;
  const fc_uint nthreads = @NTHREADS@;
  fc_copy_in(FC_BYTES(words) + FC_SEND_OFFSET, x, nbytes, tid, nthreads);
  // Every thread's mailbox stores reach system scope before the threadgroup meets...
  fc_fence();
  fc_barrier();
  if (tid == 0) {
    // ...and only then is ARRIVAL published, with a system-scope release store.
    fc_store(words + FC_ARRIVAL, seq);
    arrived[0] = seq;
  }
"""),
    # One thread in one threadgroup.
    "release": (["ctrl", "params", "after"], ["out", "done"], r"""
  // fc_release: one thread in one threadgroup, a shape deliberately not configurable (more
  // threadgroups slow a saturated GPU). It spins on RELEASE, then copies the receive mailbox out.
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint seq = params[FC_P_SEQ];
  const fc_uint nbytes = params[FC_P_NBYTES];
  const fc_uint status = fc_spin(words, seq, params[FC_P_MAX_ITERS]);
  if (status == FC_OK) {
    fc_copy_out(out, FC_BYTES(words) + params[FC_P_RECV_OFFSET], nbytes, 0u, 1u);
  } else {
    // No valid data: all-ones bytes (NaN), and the host raises the error at the next call.
    fc_poison(out, nbytes, 0u, 1u);
  }
  done[0] = status;
"""),
    # One thread in one threadgroup.
    "release_wait": (["ctrl", "params", "after"], ["done"], r"""
  // fc_release_wait: the same one-thread spin without the copy; fc_deliver copies after it.
  fc_words_t words = FC_WORDS(ctrl);
  done[0] = fc_spin(words, params[FC_P_SEQ], params[FC_P_MAX_ITERS]);
"""),
    # One threadgroup of DELIVER_THREADS threads.
    "deliver": (["ctrl", "params", "status"], ["out", "delivered"], r"""
  // fc_deliver: one threadgroup copies the receive mailbox into out once the spin has ended.
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint nbytes = params[FC_P_NBYTES];
  const fc_uint tid = @TID@;
  const fc_uint nthreads = @NTHREADS@;
  if (status[0] == FC_OK) {
    fc_copy_out(out, FC_BYTES(words) + params[FC_P_RECV_OFFSET], nbytes, tid, nthreads);
  } else {
    // No valid data: all-ones bytes (NaN), and the host raises the error at the next call.
    fc_poison(out, nbytes, tid, nthreads);
  }
  if (tid == 0) {
    delivered[0] = status[0];
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


def header(lang: ModuleType, space: str) -> str:
    """What precedes every kernel: the backend's prelude (x in address space `space`), the
    control page's layout, and the shared helpers."""
    return lang.prelude().replace("@DEFINES@", c_defines()).replace("@X_SPACE@", space) + HELPERS


def source(lang: ModuleType, name: str) -> tuple[list[str], list[str], str]:
    """(input names, output names, body) of kernel `name` in the backend's language."""
    inputs, outputs, body = KERNELS[name]
    tid, nthreads = lang.THREAD_INDEX
    return inputs, outputs, body.replace("@TID@", tid).replace("@NTHREADS@", nthreads)
