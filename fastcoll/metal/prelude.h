#pragma METAL internals : enable
#ifndef __METAL_MEMORY_SCOPE_SYSTEM__
#define __METAL_MEMORY_SCOPE_SYSTEM__ 3
namespace metal {
constexpr constant metal::thread_scope thread_scope_system =
    static_cast<thread_scope>(__METAL_MEMORY_SCOPE_SYSTEM__);
}
#endif
#include <metal_atomic>

// ---- fastcoll fence gate: the Metal prelude. It follows the control page's defines and
// FC_X_SPACE, the address space that x lives in (Metal has several); the helpers both languages
// share follow it (fastcoll/gate/device/gate.h); fastcoll/cuda/prelude.h is the CUDA prelude. ----
#define FC_DEVICE inline
#define FC_WORDS(p) ((fc_words_t)(p))
#define FC_BYTES(p) ((fc_bytes_t)(p))

typedef uint fc_uint;
typedef volatile coherent(system) device uint* fc_words_t;
typedef volatile coherent(system) device uchar* fc_bytes_t;

// An acquire load at system scope: the host's stores before RELEASE are seen after it.
FC_DEVICE fc_uint fc_load(fc_words_t p) {
  const fc_uint v = *p;
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
  return v;
}

// A release store at system scope: the host sees this thread's earlier stores before it.
FC_DEVICE void fc_store(fc_words_t p, fc_uint v) {
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
  *p = v;
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
}

// A relaxed load and store at system scope: ordering nothing around them.
FC_DEVICE fc_uint fc_load_relaxed(fc_words_t p) {
  return *p;
}
FC_DEVICE void fc_store_relaxed(fc_words_t p, fc_uint v) {
  *p = v;
}

// Make this thread's earlier stores (the send mailbox) visible at system scope.
FC_DEVICE void fc_fence() {
  metal::atomic_thread_fence(metal::mem_flags::mem_device, metal::memory_order_seq_cst, metal::thread_scope_system);
}

// The threads of the one threadgroup meet here; their earlier accesses to memory of every kind
// are ordered before their later ones.
FC_DEVICE void fc_barrier() {
  metal::threadgroup_barrier(metal::mem_flags::mem_device | metal::mem_flags::mem_threadgroup);
}

// A variable that every thread of the threadgroup shares.
#define FC_SHARED threadgroup

// Copy count units as thread tid of nthreads. Metal: units of sizeof(T) up to 4 bytes, the
// alignment MLX's arrays of T have (Metal cannot test a pointer's alignment).
template <typename D, typename S>
FC_DEVICE void fc_copy_units(D dst, S src, fc_uint count, fc_uint tid, fc_uint nthreads) {
  for (fc_uint i = tid; i < count; i += nthreads) {
    dst[i] = src[i];
  }
}

// x (n bytes) into the send mailbox.
template <typename T>
FC_DEVICE void fc_copy_in(fc_bytes_t dst, const FC_X_SPACE T* src, fc_uint n, fc_uint tid, fc_uint nthreads) {
  if (sizeof(T) % 4 == 0) {
    fc_copy_units((volatile coherent(system) device uint*)(dst), (const FC_X_SPACE uint*)(src), n / 4, tid, nthreads);
  } else if (sizeof(T) == 2) {
    fc_copy_units((volatile coherent(system) device ushort*)(dst), (const FC_X_SPACE ushort*)(src), n / 2, tid, nthreads);
  } else {
    fc_copy_units(dst, (const FC_X_SPACE uchar*)(src), n, tid, nthreads);
  }
}

// The address space of a kernel's outputs.
#define FC_OUT device

// Element i of a slot of the receive mailbox, as a T: its bits through a coherent(system) load
// of an unsigned word of T's size.
template <int S> struct fc_bits;
template <> struct fc_bits<2> { typedef ushort type; };
template <> struct fc_bits<4> { typedef uint type; };
template <typename T>
FC_DEVICE T fc_mailbox_at(fc_bytes_t base, fc_uint i) {
  typedef typename fc_bits<sizeof(T)>::type B;
  return as_type<T>(((volatile coherent(system) device B*)(base))[i]);
}

// a / b, correctly rounded whatever the compiler's fast-math flags (the host path divides so).
FC_DEVICE float fc_div(float a, float b) {
  return metal::precise::divide(a, b);
}
