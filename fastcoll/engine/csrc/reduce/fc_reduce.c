/* Element-wise reductions of host buffers (see fc_reduce.h), bit-identical to fastcoll/dtypes.py.
 *
 * Every loop reads and writes elements with memcpy, so buffers need no alignment, and it works a
 * block at a time through small local arrays: out may be a or b (a block is read before it is
 * written), and the fixed-length inner loop vectorizes without the compiler having to prove that
 * the buffers don't overlap. Signed integers are summed and multiplied as their unsigned twins
 * (the same bits, wrapping as numpy's do, with no overflow); only min and max see the sign.
 *
 * What numpy does, and so what this file does (numpy 2.4, checked on x86-64 with AVX-512; read
 * from numpy's source for arm64):
 *   - float32/float64 min/max: a NaN in a wins, else a NaN in b, both returned unchanged (not
 *     made quiet); on a tie (+0 against -0) the result is b. (numpy on arm64 uses FMIN/FMAX
 *     there, which order -0 below +0 and quiet a signalling NaN; this file doesn't follow it.)
 *   - float16 min/max: the same NaN rule, but a tie gives a.
 *   - float16 sum/prod/mean: in float32, rounded to nearest-even; of two NaNs numpy returns b's,
 *     made quiet (numpy's float32/float64 sums of two NaNs are not consistent even within one
 *     array, so those keep whatever the hardware gives).
 *   - bfloat16: as float32, then rounded to nearest-even; a NaN is made quiet (| 0x40).
 *   - complex64 prod: re = fma(ar, br, -(ai*bi)), im = fma(ar, bi, ai*br): numpy's SIMD loop
 *     fuses (fmaddsub on x86 with FMA3, vfma on arm64), so this does too, with C99 fmaf (a call
 *     into libm unless the target has FMA; only an x86 CPU without FMA3 has numpy not fuse).
 *   - complex64 mean: numpy divides by complex(w, 0) with Smith's method, which is a product
 *     with 1/w (not a division by w), and inf * 0 in the cross terms makes NaNs.
 */
#include "fc_reduce.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef unsigned char byte;
typedef void (*loop_fn)(const byte *a, const byte *b, byte *out, size_t n);

#define BLOCK_BYTES 16 /* bytes of each operand per block: one vector register */

/* NAME(a, b, out, n): out[i] = EXPR for i < n, where EXPR combines x = a[i] and y = b[i] of type
 * T. */
#define DEFINE_LOOP(NAME, T, EXPR)                                                              \
    static void NAME(const byte *a, const byte *b, byte *out, size_t n)                         \
    {                                                                                           \
        enum { B = BLOCK_BYTES / sizeof(T) };                                                   \
        size_t i = 0;                                                                           \
        for (; n - i >= (size_t)B; i += B) {                                                    \
            T xs[B], ys[B], rs[B];                                                              \
            memcpy(xs, a + i * sizeof(T), sizeof xs);                                           \
            memcpy(ys, b + i * sizeof(T), sizeof ys);                                           \
            for (size_t j = 0; j < (size_t)B; j++) {                                            \
                T x = xs[j], y = ys[j];                                                         \
                rs[j] = (EXPR);                                                                 \
            }                                                                                   \
            memcpy(out + i * sizeof(T), rs, sizeof rs);                                         \
        }                                                                                       \
        for (; i < n; i++) {                                                                    \
            T x, y, r;                                                                          \
            memcpy(&x, a + i * sizeof(T), sizeof x);                                            \
            memcpy(&y, b + i * sizeof(T), sizeof y);                                            \
            r = (EXPR);                                                                         \
            memcpy(out + i * sizeof(T), &r, sizeof r);                                          \
        }                                                                                       \
    }

/* NAME(buf, n, w): buf[i] = EXPR for i < n, where EXPR maps x = buf[i] of type T, given W w. */
#define DEFINE_MAP(NAME, T, W, EXPR)                                                            \
    static void NAME(byte *buf, size_t n, W w)                                                  \
    {                                                                                           \
        enum { B = BLOCK_BYTES / sizeof(T) };                                                   \
        size_t i = 0;                                                                           \
        for (; n - i >= (size_t)B; i += B) {                                                    \
            T xs[B];                                                                            \
            memcpy(xs, buf + i * sizeof(T), sizeof xs);                                         \
            for (size_t j = 0; j < (size_t)B; j++) {                                            \
                T x = xs[j];                                                                    \
                xs[j] = (EXPR);                                                                 \
            }                                                                                   \
            memcpy(buf + i * sizeof(T), xs, sizeof xs);                                         \
        }                                                                                       \
        for (; i < n; i++) {                                                                    \
            T x;                                                                                \
            memcpy(&x, buf + i * sizeof(T), sizeof x);                                          \
            x = (EXPR);                                                                         \
            memcpy(buf + i * sizeof(T), &x, sizeof x);                                          \
        }                                                                                       \
    }

/* ---- float bits ---- */

static inline float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline double f64_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* numpy's np.minimum/np.maximum of float32/float64: a's NaN, else b's NaN, else the smaller
 * (larger), b on a tie; the bits of the chosen operand, untouched. */
static inline uint32_t f32_min(uint32_t x, uint32_t y)
{
    float fx = f32_of(x), fy = f32_of(y);
    return (isnan(fx) || fx < fy) ? x : y;
}

static inline uint32_t f32_max(uint32_t x, uint32_t y)
{
    float fx = f32_of(x), fy = f32_of(y);
    return (isnan(fx) || fx > fy) ? x : y;
}

static inline uint64_t f64_min(uint64_t x, uint64_t y)
{
    double fx = f64_of(x), fy = f64_of(y);
    return (isnan(fx) || fx < fy) ? x : y;
}

static inline uint64_t f64_max(uint64_t x, uint64_t y)
{
    double fx = f64_of(x), fy = f64_of(y);
    return (isnan(fx) || fx > fy) ? x : y;
}

/* ---- bfloat16: uint16 bits, the top half of a float32 ---- */

static inline float bf16_to_f32(uint16_t h) { return f32_of((uint32_t)h << 16); }

/* dtypes.float32_to_bf16: round to nearest-even; a NaN keeps its top bits and is made quiet. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline uint16_t bf16_quiet(uint16_t h)
{
    return (uint16_t)((h & 0x7fffu) > 0x7f80u ? h | 0x40u : h);
}

static inline uint16_t bf16_min(uint16_t x, uint16_t y)
{
    float fx = bf16_to_f32(x), fy = bf16_to_f32(y);
    return bf16_quiet((isnan(fx) || fx < fy) ? x : y);
}

static inline uint16_t bf16_max(uint16_t x, uint16_t y)
{
    float fx = bf16_to_f32(x), fy = bf16_to_f32(y);
    return bf16_quiet((isnan(fx) || fx > fy) ? x : y);
}

/* ---- float16 (IEEE binary16), converted in software ---- */

/* c ? x : y without a branch: the float16 helpers are written so (every operand computed, then
 * selected), since a compiler won't turn a conditional float operation into a vector select
 * (it might raise a floating-point exception the branch had avoided). */
static inline uint32_t pick(int c, uint32_t x, uint32_t y)
{
    uint32_t m = 0u - (uint32_t)(c != 0);
    return (x & m) | (y & ~m);
}

/* Exact. A subnormal half is m * 2^-24, which float32 holds as a normal number. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    uint32_t subnormal = bits_of((float)(int32_t)em * 0x1p-24f); /* and zero */
    uint32_t normal = (em << 13) + (112u << 23);                  /* rebias the exponent */
    uint32_t special = (em << 13) | 0x7f800000u;                  /* inf, NaN (payload kept) */
    return f32_of(sign | pick(em < 0x0400u, subnormal, pick(em < 0x7c00u, normal, special)));
}

/* Round to nearest-even; overflow gives inf, a NaN keeps its top payload bits and is made
 * quiet. A result below 2^-14 (a subnormal half) is rounded by a float32 addition of 0.5,
 * whose unit in the last place is 2^-24, the subnormal half's step: exact but for that
 * rounding, done in the default rounding mode as all of numpy's arithmetic is. (It never sees
 * a float32 subnormal: float16 sums, products and means are 0 or at least 2^-55 in magnitude,
 * so flush-to-zero modes can't change it either.) */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
    uint32_t normal = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    uint32_t subnormal = bits_of(f32_of(ax) + 0.5f) - 0x3f000000u;
    uint32_t h = pick(ax > 0x7f800000u, nan,
                      pick(ax >= 0x477ff000u, 0x7c00u, /* >= 65520: rounds to inf */
                           pick(ax >= 0x38800000u, normal, subnormal))); /* >= 2^-14 */
    return (uint16_t)(sign | h);
}

static inline int f16_isnan(uint32_t h) { return (h & 0x7fffu) > 0x7c00u; }

/* The NaN numpy's float16 arithmetic returns: b's if b is NaN, else a's, made quiet. */
static inline uint16_t f16_nan(uint16_t x, uint16_t y, uint16_t r)
{
    return (uint16_t)pick(f16_isnan(y), y | 0x200u, pick(f16_isnan(x), x | 0x200u, r));
}

static inline uint16_t f16_sum(uint16_t x, uint16_t y)
{
    return f16_nan(x, y, f32_to_f16(f16_to_f32(x) + f16_to_f32(y)));
}

static inline uint16_t f16_prod(uint16_t x, uint16_t y)
{
    return f16_nan(x, y, f32_to_f16(f16_to_f32(x) * f16_to_f32(y)));
}

/* numpy's float16 min/max compare halves: a's NaN, else b's NaN; a tie gives a. */
static inline uint16_t f16_min(uint16_t x, uint16_t y)
{
    float fx = f16_to_f32(x), fy = f16_to_f32(y);
    return (uint16_t)pick(isnan(fx) | (fx <= fy), x, y);
}

static inline uint16_t f16_max(uint16_t x, uint16_t y)
{
    float fx = f16_to_f32(x), fy = f16_to_f32(y);
    return (uint16_t)pick(isnan(fx) | (fx >= fy), x, y);
}

/* ---- the loops ---- */

#define MIN(x, y) ((x) < (y) ? (x) : (y))
#define MAX(x, y) ((x) > (y) ? (x) : (y))

/* Sums and products wrap: unsigned arithmetic, at least as wide as unsigned int (1u * x), so
 * that narrow types aren't promoted to int, where a product could overflow. */
#define DEFINE_INT(W)                                                                          \
    DEFINE_LOOP(sum_u##W, uint##W##_t, (uint##W##_t)(x + y))                                   \
    DEFINE_LOOP(prod_u##W, uint##W##_t, (uint##W##_t)(1u * x * y))                             \
    DEFINE_LOOP(min_u##W, uint##W##_t, MIN(x, y))                                              \
    DEFINE_LOOP(max_u##W, uint##W##_t, MAX(x, y))                                              \
    DEFINE_LOOP(min_i##W, int##W##_t, MIN(x, y))                                               \
    DEFINE_LOOP(max_i##W, int##W##_t, MAX(x, y))

DEFINE_INT(8)
DEFINE_INT(16)
DEFINE_INT(32)
DEFINE_INT(64)

DEFINE_LOOP(sum_f16, uint16_t, f16_sum(x, y))
DEFINE_LOOP(prod_f16, uint16_t, f16_prod(x, y))
DEFINE_LOOP(min_f16, uint16_t, f16_min(x, y))
DEFINE_LOOP(max_f16, uint16_t, f16_max(x, y))

DEFINE_LOOP(sum_bf16, uint16_t, f32_to_bf16(bf16_to_f32(x) + bf16_to_f32(y)))
DEFINE_LOOP(prod_bf16, uint16_t, f32_to_bf16(bf16_to_f32(x) * bf16_to_f32(y)))
DEFINE_LOOP(min_bf16, uint16_t, bf16_min(x, y))
DEFINE_LOOP(max_bf16, uint16_t, bf16_max(x, y))

DEFINE_LOOP(sum_f32, float, x + y)
DEFINE_LOOP(prod_f32, float, x * y)
DEFINE_LOOP(min_f32, uint32_t, f32_min(x, y))
DEFINE_LOOP(max_f32, uint32_t, f32_max(x, y))

DEFINE_LOOP(sum_f64, double, x + y)
DEFINE_LOOP(prod_f64, double, x * y)
DEFINE_LOOP(min_f64, uint64_t, f64_min(x, y))
DEFINE_LOOP(max_f64, uint64_t, f64_max(x, y))

static void sum_c64(const byte *a, const byte *b, byte *out, size_t n) { sum_f32(a, b, out, 2 * n); }

static void prod_c64(const byte *a, const byte *b, byte *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x[2], y[2], r[2];
        memcpy(x, a + i * sizeof x, sizeof x);
        memcpy(y, b + i * sizeof y, sizeof y);
        r[0] = fmaf(x[0], y[0], -(x[1] * y[1]));
        r[1] = fmaf(x[0], y[1], x[1] * y[0]);
        memcpy(out + i * sizeof r, r, sizeof r);
    }
}

/* One dtype's loops, by op; mean reduces as sum. A new op of fastcoll/dtypes.py's table is a new
 * argument here, which every row below must then give. */
#define ROW(SUM, PROD, MIN, MAX) {[FC_SUM] = SUM, [FC_PROD] = PROD, [FC_MIN] = MIN, [FC_MAX] = MAX, [FC_MEAN] = SUM}

/* [dtype][op]; NULL where the dtype has no such loop. */
static const loop_fn LOOPS[FC_DTYPE_COUNT][FC_OP_COUNT] = {
    [FC_UINT8] = ROW(sum_u8, prod_u8, min_u8, max_u8),
    [FC_UINT16] = ROW(sum_u16, prod_u16, min_u16, max_u16),
    [FC_UINT32] = ROW(sum_u32, prod_u32, min_u32, max_u32),
    [FC_UINT64] = ROW(sum_u64, prod_u64, min_u64, max_u64),
    [FC_INT8] = ROW(sum_u8, prod_u8, min_i8, max_i8),
    [FC_INT16] = ROW(sum_u16, prod_u16, min_i16, max_i16),
    [FC_INT32] = ROW(sum_u32, prod_u32, min_i32, max_i32),
    [FC_INT64] = ROW(sum_u64, prod_u64, min_i64, max_i64),
    [FC_FLOAT16] = ROW(sum_f16, prod_f16, min_f16, max_f16),
    [FC_BFLOAT16] = ROW(sum_bf16, prod_bf16, min_bf16, max_bf16),
    [FC_FLOAT32] = ROW(sum_f32, prod_f32, min_f32, max_f32),
    [FC_FLOAT64] = ROW(sum_f64, prod_f64, min_f64, max_f64),
    [FC_COMPLEX64] = ROW(sum_c64, prod_c64, NULL, NULL),
};

size_t fc_itemsize(int dtype)
{
    static const size_t SIZES[FC_DTYPE_COUNT] = FC_DTYPE_SIZES;
    return dtype >= 0 && dtype < FC_DTYPE_COUNT ? SIZES[dtype] : 0;
}

/* What the table allows (FC_OP_DTYPES), and only where a loop exists: a pair the table allows
 * without a loop here is refused, never reduced as something else (tests/test_native_reduce.py
 * holds the two to each other). */
int fc_reduction_valid(int dtype, int op)
{
    static const unsigned OP_DTYPES[FC_OP_COUNT] = FC_OP_DTYPES;
    return dtype >= 0 && dtype < FC_DTYPE_COUNT && op >= 0 && op < FC_OP_COUNT && (OP_DTYPES[op] >> dtype & 1u) &&
           LOOPS[dtype][op] != NULL;
}

int fc_reduce(int dtype, int op, const void *a, const void *b, void *out, size_t count)
{
    if (!fc_reduction_valid(dtype, op))
        return -1;
    if (count > 0)
        LOOPS[dtype][op](a, b, out, count);
    return 0;
}

/* ---- the mean's final division ---- */

DEFINE_MAP(div_f16, uint16_t, float, f16_nan(x, x, f32_to_f16(f16_to_f32(x) / w)))
DEFINE_MAP(div_bf16, uint16_t, float, f32_to_bf16(bf16_to_f32(x) / w))
DEFINE_MAP(div_f32, float, float, x / w)
DEFINE_MAP(div_f64, double, double, x / w)

/* numpy's complex division by (w, 0) (Smith's method, as its CFLOAT_divide loop writes it). */
static void div_c64(byte *buf, size_t n, float w)
{
    const float wi = 0.0f;
    if (w == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            float x[2];
            memcpy(x, buf + i * sizeof x, sizeof x);
            x[0] = x[0] / fabsf(w);
            x[1] = x[1] / fabsf(w);
            memcpy(buf + i * sizeof x, x, sizeof x);
        }
        return;
    }
    const float rat = wi / w, scl = 1.0f / (w + wi * rat);
    for (size_t i = 0; i < n; i++) {
        float x[2], r[2];
        memcpy(x, buf + i * sizeof x, sizeof x);
        r[0] = (x[0] + x[1] * rat) * scl;
        r[1] = (x[1] - x[0] * rat) * scl;
        memcpy(buf + i * sizeof r, r, sizeof r);
    }
}

int fc_finish_mean(int dtype, void *buf, size_t count, int world_size)
{
    if (!fc_reduction_valid(dtype, FC_MEAN))
        return -1;
    if (count == 0)
        return 0;
    switch (dtype) {
    case FC_FLOAT16: /* numpy divides by float16(world_size), which is inf from 65520 up */
        div_f16(buf, count, f16_to_f32(f32_to_f16((float)world_size)));
        break;
    case FC_BFLOAT16:
        div_bf16(buf, count, (float)world_size);
        break;
    case FC_FLOAT32:
        div_f32(buf, count, (float)world_size);
        break;
    case FC_FLOAT64:
        div_f64(buf, count, (double)world_size);
        break;
    default: /* FC_COMPLEX64 */
        div_c64(buf, count, (float)world_size);
        break;
    }
    return 0;
}
