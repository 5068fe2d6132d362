#include <cuda/atomic>

// ---- fastcoll fence gate: the CUDA prelude. It follows the control page's defines and
// FC_X_SPACE, the address space that x lives in (empty: CUDA has one); the helpers both languages
// share follow it (fastcoll/gate/device/gate.h); fastcoll/metal/prelude.h is the Metal prelude. ----
#define FC_DEVICE __device__ inline
#define FC_WORDS(p) const_cast<fc_words_t>(p)
#define FC_BYTES(p) reinterpret_cast<fc_bytes_t>(p)

typedef unsigned int fc_uint;
typedef unsigned int* fc_words_t;
typedef unsigned char* fc_bytes_t;

// An acquire load at system scope: the host's stores before RELEASE are seen after it.
FC_DEVICE fc_uint fc_load(fc_words_t p) {
  return cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}

// A release store at system scope: the host sees this thread's earlier stores before it.
FC_DEVICE void fc_store(fc_words_t p, fc_uint v) {
  cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

// A relaxed load and store at system scope: atomic, but ordering nothing around them.
FC_DEVICE fc_uint fc_load_relaxed(fc_words_t p) {
  return cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).load(cuda::memory_order_relaxed);
}
FC_DEVICE void fc_store_relaxed(fc_words_t p, fc_uint v) {
  cuda::atomic_ref<unsigned int, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_relaxed);
}

// Make this thread's earlier stores (the send mailbox) visible at system scope.
FC_DEVICE void fc_fence() {
  __threadfence_system();
}

// The threads of the one threadgroup meet here; their earlier accesses to memory of every kind
// are ordered before their later ones.
FC_DEVICE void fc_barrier() {
  __syncthreads();
}

// A variable that every thread of the threadgroup shares.
#define FC_SHARED __shared__

// Copy count units as thread tid of nthreads. CUDA: each thread loads FC_BATCH units before it
// stores them, so that one thread keeps FC_BATCH loads in flight.
#define FC_BATCH 16
template <typename U>
FC_DEVICE void fc_copy_units(U* dst, const U* src, fc_uint count, fc_uint tid, fc_uint nthreads) {
  for (fc_uint i = tid; i < count; i += FC_BATCH * nthreads) {
    U r[FC_BATCH];
#pragma unroll
    for (fc_uint k = 0; k < FC_BATCH; ++k) {
      const fc_uint j = i + k * nthreads;
      if (j < count) {
        r[k] = src[j];
      }
    }
#pragma unroll
    for (fc_uint k = 0; k < FC_BATCH; ++k) {
      const fc_uint j = i + k * nthreads;
      if (j < count) {
        dst[j] = r[k];
      }
    }
  }
}

// CUDA only: n bytes in 16-byte units where both ends allow it, else 4-byte units, else bytes.
FC_DEVICE void fc_copy_bytes(unsigned char* dst, const unsigned char* src, fc_uint n, fc_uint tid, fc_uint nthreads) {
  const unsigned long long a =
      reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) | n;
  if ((a & 15u) == 0) {
    fc_copy_units(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), n / 16, tid, nthreads);
  } else if ((a & 3u) == 0) {
    fc_copy_units(reinterpret_cast<unsigned int*>(dst), reinterpret_cast<const unsigned int*>(src), n / 4, tid, nthreads);
  } else {
    fc_copy_units(dst, src, n, tid, nthreads);
  }
}

// x (n bytes) into the send mailbox.
template <typename T>
FC_DEVICE void fc_copy_in(fc_bytes_t dst, const FC_X_SPACE T* src, fc_uint n, fc_uint tid, fc_uint nthreads) {
  fc_copy_bytes(dst, reinterpret_cast<const unsigned char*>(src), n, tid, nthreads);
}

// The address space of a kernel's outputs (CUDA has one).
#define FC_OUT

// Element i of a slot of the receive mailbox, as a T: a load that no cache of this GPU may
// answer (__ldcv), since the host or another rank's GPU wrote it.
template <typename T>
FC_DEVICE T fc_mailbox_at(fc_bytes_t base, fc_uint i) {
  return __ldcv(reinterpret_cast<const T*>(base) + i);
}

// The host memory at GPU-visible address a: the direct mode's gather segment, registered with
// CUDA, whose address is compiled into the kernels (FC_GATHER_AT) so that no thread loads it.
FC_DEVICE fc_bytes_t fc_at(unsigned long long a) {
  return reinterpret_cast<fc_bytes_t>(a);
}

// a / b, correctly rounded whatever the compiler's fast-math flags (the host path divides so).
FC_DEVICE float fc_div(float a, float b) {
  return __fdiv_rn(a, b);
}
