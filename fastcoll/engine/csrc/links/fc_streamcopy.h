/* A copy into memory that another CPU reads next (a shared-memory ring's data).
 *
 * On x86-64 the stores bypass this CPU's caches: a line the reader would otherwise take from the
 * writer's private cache, which between two cores of the 2-CPU VM ran at 2-3 GB/s against
 * 15-19 from memory (bench/NOTES.md 78), comes from memory or the shared cache instead. Elsewhere
 * it is memcpy. The caller publishes the bytes with a release store after it, as after memcpy.
 */
#ifndef FC_STREAMCOPY_H
#define FC_STREAMCOPY_H

#include <stddef.h>

/* Copies of at least this many bytes a message stream; smaller ones are read soon enough that
 * the writer's cache is the fastest place for them. */
#define FC_STREAM_MIN_BYTES ((size_t)256 << 10)

void fc_stream_copy(void *dst, const void *src, size_t n);

#endif
