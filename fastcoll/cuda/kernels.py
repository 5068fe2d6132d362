"""The fence gate's kernels for MLX's CUDA backend (mx.fast.cuda_kernel).

Side by side with fastcoll/metal/kernels.py: the kernel bodies are the same text line for line
(same names, same comments) except the two lines that read the thread's index, and the helpers in
the header have the same names, signatures and comments; only their insides say things the CUDA
way. tests/test_gate_kernels.py holds the two files to that.

CUDA specifics. MLX passes inputs as `const T*`; the control page is written through a
const_cast (FC_WORDS). System scope comes from `cuda::atomic_ref<unsigned,
cuda::thread_scope_system>`: acquire loads and release stores (fc_load, fc_store). MLX arrays live
in managed memory once the host has a view of them; fastcoll/cuda/advise.py advises the control
page towards host memory so that neither side's accesses migrate it.
"""

from __future__ import annotations

from typing import Any

from fastcoll.gate.layout import c_defines

LANGUAGE = "cuda"

_HEADER = r"""
#include <cuda/atomic>

// ---- fastcoll fence gate, CUDA side (fastcoll/metal/kernels.py is the Metal side) ----
{defines}
// The address space that x lives in (Metal has several; CUDA has one).
#define FC_X_SPACE {x_space}
#define FC_DEVICE __device__ inline
#define FC_WORDS(p) const_cast<fc_words_t>(p)
#define FC_BYTES(p) reinterpret_cast<fc_bytes_t>(p)

typedef unsigned int fc_uint;
typedef unsigned int* fc_words_t;
typedef unsigned char* fc_bytes_t;

// An acquire load at system scope: the host's stores before RELEASE are seen after it.
FC_DEVICE fc_uint fc_load(fc_words_t p) {{
  return cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}}

// A release store at system scope: the host sees this thread's earlier stores before it.
FC_DEVICE void fc_store(fc_words_t p, fc_uint v) {{
  cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}}

// Make this thread's earlier stores (the send mailbox) visible at system scope.
FC_DEVICE void fc_fence() {{
  __threadfence_system();
}}

// The threads of the one threadgroup meet here.
FC_DEVICE void fc_barrier() {{
  __syncthreads();
}}

// Copy count units as thread tid of nthreads. CUDA: each thread loads FC_BATCH units before it
// stores them, so that one thread keeps FC_BATCH loads in flight (the receive mailbox is in host
// memory: each load is a bus round trip).
#define FC_BATCH 16
template <typename U>
FC_DEVICE void fc_copy_units(U* dst, const U* src, fc_uint count, fc_uint tid, fc_uint nthreads) {{
  for (fc_uint i = tid; i < count; i += FC_BATCH * nthreads) {{
    U r[FC_BATCH];
#pragma unroll
    for (fc_uint k = 0; k < FC_BATCH; ++k) {{
      const fc_uint j = i + k * nthreads;
      if (j < count) {{
        r[k] = src[j];
      }}
    }}
#pragma unroll
    for (fc_uint k = 0; k < FC_BATCH; ++k) {{
      const fc_uint j = i + k * nthreads;
      if (j < count) {{
        dst[j] = r[k];
      }}
    }}
  }}
}}

// CUDA only: n bytes in 16-byte units where both ends allow it, else 4-byte units, else bytes.
FC_DEVICE void fc_copy_bytes(unsigned char* dst, const unsigned char* src, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  const unsigned long long a =
      reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) | n;
  if ((a & 15u) == 0) {{
    fc_copy_units(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), n / 16, tid, nthreads);
  }} else if ((a & 3u) == 0) {{
    fc_copy_units(reinterpret_cast<unsigned int*>(dst), reinterpret_cast<const unsigned int*>(src), n / 4, tid, nthreads);
  }} else {{
    fc_copy_units(dst, src, n, tid, nthreads);
  }}
}}

// x (n bytes) into the send mailbox.
template <typename T>
FC_DEVICE void fc_copy_in(fc_bytes_t dst, const FC_X_SPACE T* src, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  fc_copy_bytes(dst, reinterpret_cast<const unsigned char*>(src), n, tid, nthreads);
}}

// The receive mailbox (n bytes) into out.
template <typename T>
FC_DEVICE void fc_copy_out(T* dst, fc_bytes_t src, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  fc_copy_bytes(reinterpret_cast<unsigned char*>(dst), src, n, tid, nthreads);
}}

// All-ones bytes into out: NaN in every float type, -1 in every signed integer type.
template <typename T>
FC_DEVICE void fc_poison(T* dst, fc_uint n, fc_uint tid, fc_uint nthreads) {{
  unsigned char* d = reinterpret_cast<unsigned char*>(dst);
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
  const fc_uint tid = threadIdx.x;
  const fc_uint nthreads = blockDim.x;
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
  const fc_uint tid = threadIdx.x;
  const fc_uint nthreads = blockDim.x;
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

# The x-space variants a backend must build (CUDA has one address space).
X_SPACES = ("",)


def x_space(size: int) -> str:
    """The address space MLX gives an input of `size` elements (CUDA: the only one)."""
    return ""


def header(space: str) -> str:
    """The kernels' shared header, with x in address space `space`."""
    return _HEADER.format(defines=c_defines(), x_space=space)


def make_kernel(name: str, input_names: list[str], output_names: list[str], source: str, header_text: str) -> Any:
    """Build one kernel through mx.fast.cuda_kernel (compiled at first use)."""
    import mlx.core as mx

    return mx.fast.cuda_kernel(
        name=name, input_names=input_names, output_names=output_names,
        source=source, header=header_text, ensure_row_contiguous=True,
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
