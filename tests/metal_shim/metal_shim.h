// What the fence gate's Metal source uses of Metal and of MLX's kernel prelude, in C++ (g++ or
// clang++, -include'd before the source), so that the source MLX would hand Metal can be compiled
// and run here, on one CPU thread (tests/test_gate_metal.py). Not Metal: address spaces vanish,
// coherent(system) with them, fences are the compiler's, and a threadgroup barrier with one
// thread is nothing. It checks what the source says (names, types, templates, the op table), not
// Metal's own rules. No header is included, so that each kernel compiles in a moment.

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
struct uint3 {
  uint x, y, z;
};

// MLX's float16_t and bfloat16_t (mlx/backend/metal/kernels/bf16.h): bfloat16 as float's top
// half, rounded to nearest even.
typedef _Float16 float16_t;
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((int)a | (int)b); }
enum memory_order { memory_order_relaxed, memory_order_seq_cst };
enum thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };
inline void atomic_thread_fence(mem_flags, memory_order, thread_scope) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void threadgroup_barrier(mem_flags) {}
namespace precise {
inline float divide(float a, float b) { return a / b; }
}
template <typename T, typename U>
T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type: sizes differ");
  T t;
  __builtin_memcpy(&t, &u, sizeof t);
  return t;
}
}  // namespace metal
using namespace metal;  // as MLX's kernel prelude has it

// Metal's address spaces and qualifiers: nothing, on one CPU thread; but a threadgroup variable
// is one the threads share, as a function's static is.
#define device
#define constant
#define threadgroup static
#define coherent(scope)
