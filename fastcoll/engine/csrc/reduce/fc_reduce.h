/* Element-wise reductions of host buffers, for every dtype fastcoll moves.
 *
 * Results are bit-identical to the pure-Python engine's numpy reducers (fastcoll/dtypes.py):
 * integers wrap as numpy's do, float16 and bfloat16 are combined in float32 and rounded back to
 * nearest-even after every pair (bfloat16 NaN keeps a quiet NaN), min/max propagate NaN as
 * np.minimum/np.maximum do (x86's rule on every machine), complex64 products are fused as numpy
 * fuses them (fmaf(ar, br, -(ai*bi)), fmaf(ar, bi, ai*br)), and nothing else is fused (the
 * sources are compiled with -ffp-contract=off).
 */
#ifndef FC_REDUCE_H
#define FC_REDUCE_H

#include <stddef.h>

/* The dtype and op codes (enum fc_dtype, enum fc_redop) and their names, generated from
 * fastcoll/dtypes.py's tables. mean reduces as sum; the caller divides by the world size once at
 * the end with fc_finish_mean. */
#include "fc_tables.h"

/* Bytes per element of `dtype`; 0 for an unknown code. */
size_t fc_itemsize(int dtype);

/* Whether `op` is a reduction of `dtype` (as fastcoll/dtypes.check_reduction allows). */
int fc_reduction_valid(int dtype, int op);

/* out[i] = a[i] op b[i] for i < count; out may be a or b. Returns 0, or -1 for an invalid
 * (dtype, op) pair (nothing is written then). */
int fc_reduce(int dtype, int op, const void *a, const void *b, void *out, size_t count);

/* buf[i] /= world_size, rounded as the dtype rounds (float16/bfloat16 through float32);
 * for floating and complex dtypes only. Returns 0, or -1 for a dtype without a mean. */
int fc_finish_mean(int dtype, void *buf, size_t count, int world_size);

#endif
