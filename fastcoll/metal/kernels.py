"""The fence gate's kernels for MLX's Metal backend (mx.fast.metal_kernel).

Side by side with fastcoll/cuda/kernels.py: the kernel bodies are the same text line for line
(same names, same comments) except the two lines that read the thread's index, and the helpers in
the header have the same names, signatures and comments; only their insides say things the Metal
way. tests/test_gate_kernels.py holds the two files to that. NOT RUN HERE: no Mac was available;
see the README for what was and was not verified.

Metal specifics, after MLX's own fence.metal (ml-explore/mlx#1773) and the seed's gate:
- `coherent(system)` on every control-page access, in both kernels: with a plain volatile device
  pointer the GPU never observes the CPU's store (71 of 120 releases missed in the seed's A/B),
  and with coherent(device) it misses about one in a few hundred, a hang every few tokens.
- Reaching that qualifier needs `#pragma METAL internals : enable`. MLX compiles each
  mx.fast.metal_kernel into its own library from its own source, and the pragma is in these
  kernels' header alone, so it is scoped to just these kernels.
- MLX passes inputs of fewer than 8 elements in the `constant` address space and larger ones in
  `device`, so the arrival kernel is built twice, once for each address space of x (FC_X_SPACE).
- Copies move 4-, 2- or 1-byte units by sizeof(T), which MLX's arrays of T are aligned to.
"""

from __future__ import annotations

from typing import Any

from fastcoll.gate.layout import c_defines

LANGUAGE = "metal"

_HEADER = r"""
#pragma METAL internals : enable
#ifndef __METAL_MEMORY_SCOPE_SYSTEM__
#define __METAL_MEMORY_SCOPE_SYSTEM__ 3
namespace metal {{
constexpr constant metal::thread_scope thread_scope_system =
    static_cast<thread_scope>(__METAL_MEMORY_SCOPE_SYSTEM__);
}}
#endif
#include <metal_atomic>

// ---- fastcoll fence gate, Metal side (fastcoll/cuda/kernels.py is the CUDA side) ----
{defines}
// The address space that x lives in (Metal has several; CUDA has one).
#define FC_X_SPACE {x_space}
#define FC_DEVICE inline
#define FC_WORDS(p) ((fc_words_t)(p))
#define FC_BYTES(p) ((fc_bytes_t)(p))

typedef uint fc_uint;
typedef volatile coherent(system) device uint* fc_words_t;
typedef volatile coherent(system) device uchar* fc_bytes_t;

// An acquire load at system scope: the host's stores before RELEASE are seen after it.
FC_DEVICE fc_uint fc_load(fc_words_t p) {{
  const fc_uint v = *p;
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
  return v;
}}

// A release store at system scope: the host sees this thread's earlier stores before it.
FC_DEVICE void fc_store(fc_words_t p, fc_uint v) {{
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
  *p = v;
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
}}

// Make this thread's earlier stores (the send mailbox) visible at system scope.
FC_DEVICE void fc_fence() {{
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
}}

// The threads of the one threadgroup meet here.
FC_DEVICE void fc_barrier() {{
  metal::threadgroup_barrier(metal::mem_flags::mem_device);
}}

// Copy count units as thread tid of nthreads. Metal: units of sizeof(T) up to 4 bytes, the
// alignment MLX's arrays of T have (Metal cannot test a pointer's alignment).
template <typename D, typename S>
FC_DEVICE void fc_copy_units(D dst, S src, fc_uint count, fc_uint tid, fc_uint nthreads) {{
  for (fc_uint i = tid; i < count; i += nthreads) {{
    dst[i] = src[i];
  }}
}}

// x (n bytes) into the send mailbox.
template <typename T>
FC_DEVICE void fc_copy_in(fc_bytes_t dst, const FC_X_SPACE T* src, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  if (sizeof(T) % 4 == 0) {{
    fc_copy_units((volatile coherent(system) device uint*)(dst), (const FC_X_SPACE uint*)(src), n / 4, tid, nthreads);
  }} else if (sizeof(T) == 2) {{
    fc_copy_units((volatile coherent(system) device ushort*)(dst), (const FC_X_SPACE ushort*)(src), n / 2, tid, nthreads);
  }} else {{
    fc_copy_units(dst, (const FC_X_SPACE uchar*)(src), n, tid, nthreads);
  }}
}}

// The receive mailbox (n bytes) into out.
template <typename T>
FC_DEVICE void fc_copy_out(device T* dst, fc_bytes_t src, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  if (sizeof(T) % 4 == 0) {{
    fc_copy_units((device uint*)(dst), (volatile coherent(system) device uint*)(src), n / 4, tid, nthreads);
  }} else if (sizeof(T) == 2) {{
    fc_copy_units((device ushort*)(dst), (volatile coherent(system) device ushort*)(src), n / 2, tid, nthreads);
  }} else {{
    fc_copy_units((device uchar*)(dst), src, n, tid, nthreads);
  }}
}}

// All-ones bytes into out: NaN in every float type, -1 in every signed integer type.
template <typename T>
FC_DEVICE void fc_poison(device T* dst, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  device uchar* d = (device uchar*)(dst);
  for (fc_uint i = tid; i < n; i += nthreads) {{
    d[i] = 0xFF;
  }}
}}

// The release spin: one thread, no backoff and no chunking. Each iteration is one system-scope
// acquire load of RELEASE, compared wrap-aware as in fastcoll/gate/seq.py; max_iters
// (FASTCOLL_FENCE_MAX_ITERS) bounds it as a backstop only, since the host stores RELEASE on every
// failure path. Writes SPIN_ITERS and ACK, and SPIN_FAILED once the bound is hit.
FC_DEVICE fc_uint fc_spin(fc_words_t words, fc_uint seq, fc_uint max_iters) {{
  fc_uint status = FC_OK;
  fc_uint iters = 0;
  if (fc_load(words + FC_SPIN_FAILED) != 0u) {{
    // An earlier spin hit its bound: the host is gone or stuck, so do not wait again.
    status = FC_TIMEOUT;
  }} else {{
    while ((int)(fc_load(words + FC_RELEASE) - seq) < 0) {{
      if (++iters >= max_iters) {{
        status = FC_TIMEOUT;
        break;
      }}
    }}
    if (status == FC_OK) {{
      status = fc_load(words + FC_STATUS);
    }}
  }}
  if (status == FC_TIMEOUT) {{
    fc_store(words + FC_SPIN_FAILED_SEQ, seq);
    fc_store(words + FC_SPIN_FAILED, 1u);
  }}
  fc_store(words + FC_SPIN_ITERS, iters);
  fc_store(words + FC_ACK, seq);
  return status;
}}
"""

# inputs: x, ctrl, params, after; outputs: arrived. One threadgroup of ARRIVAL_THREADS threads.
ARRIVAL = r"""
  // fc_arrival: one threadgroup copies x into the send mailbox, then one thread publishes seq.
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint seq = params[FC_P_SEQ];
  const fc_uint nbytes = params[FC_P_NBYTES];
  const fc_uint tid = thread_position_in_threadgroup.x;
  const fc_uint nthreads = threads_per_threadgroup.x;
  fc_copy_in(FC_BYTES(words) + FC_SEND_OFFSET, x, nbytes, tid, nthreads);
  // Every thread's mailbox stores reach system scope before the threadgroup meets...
  fc_fence();
  fc_barrier();
  if (tid == 0) {
    // ...and only then is ARRIVAL published, with a system-scope release store.
    fc_store(words + FC_ARRIVAL, seq);
    arrived[0] = seq;
  }
"""

# inputs: ctrl, params, after; outputs: out, done. One thread in one threadgroup.
RELEASE = r"""
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
"""

# inputs: ctrl, params, after; outputs: done. One thread in one threadgroup.
RELEASE_WAIT = r"""
  // fc_release_wait: the same one-thread spin without the copy; fc_deliver copies after it.
  fc_words_t words = FC_WORDS(ctrl);
  done[0] = fc_spin(words, params[FC_P_SEQ], params[FC_P_MAX_ITERS]);
"""

# inputs: ctrl, params, status; outputs: out, delivered. One threadgroup of DELIVER_THREADS.
DELIVER = r"""
  // fc_deliver: one threadgroup copies the receive mailbox into out once the spin has ended.
  fc_words_t words = FC_WORDS(ctrl);
  const fc_uint nbytes = params[FC_P_NBYTES];
  const fc_uint tid = thread_position_in_threadgroup.x;
  const fc_uint nthreads = threads_per_threadgroup.x;
  if (status[0] == FC_OK) {
    fc_copy_out(out, FC_BYTES(words) + params[FC_P_RECV_OFFSET], nbytes, tid, nthreads);
  } else {
    // No valid data: all-ones bytes (NaN), and the host raises the error at the next call.
    fc_poison(out, nbytes, tid, nthreads);
  }
  if (tid == 0) {
    delivered[0] = status[0];
  }
"""

# inputs: ctrl, params, dep; outputs: marked. One thread in one threadgroup.
MARK = r"""
  // fc_mark: stores seq into MARK once dep is ready; the host times "GPU continuing" with it.
  fc_words_t words = FC_WORDS(ctrl);
  fc_store(words + FC_MARK, params[FC_P_SEQ]);
  marked[0] = params[FC_P_SEQ];
"""

# MLX binds inputs of fewer than 8 elements as `constant`, larger ones as `device`.
X_SPACES = ("device", "constant")
_MAX_CONSTANT_ARRAY_SIZE = 8


def x_space(size: int) -> str:
    """The address space MLX gives an input of `size` elements."""
    return "constant" if size < _MAX_CONSTANT_ARRAY_SIZE else "device"


def header(space: str) -> str:
    """The kernels' shared header, with x in address space `space`."""
    return _HEADER.format(defines=c_defines(), x_space=space)


def make_kernel(name: str, input_names: list[str], output_names: list[str], source: str, header_text: str) -> Any:
    """Build one kernel through mx.fast.metal_kernel (compiled at first use)."""
    import mlx.core as mx

    return mx.fast.metal_kernel(
        name=name, input_names=input_names, output_names=output_names,
        source=source, header=header_text, ensure_row_contiguous=True,
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
