/* Large memory straight from the kernel.
 *
 * glibc serves a large malloc() with a mapping of its own, but the first time such a block is
 * freed it raises its mmap threshold to that block's size (up to 32 MiB), and from then on blocks
 * below it come from the heap, which a pattern of varying sizes fragments and which free() hardly
 * ever gives back: a soak of mixed sizes grew a rank to 360 MB, kept after finalize
 * (bench/NOTES.md, entry 94). The engine's large blocks (scratch, results) are therefore mapped and
 * unmapped here, which leaves glibc's threshold where it was and returns each block's pages at
 * once; small ones still come from malloc().
 */
#ifndef FC_MEM_H
#define FC_MEM_H

#include <stddef.h>

/* Blocks of at least this many bytes are mapped (glibc's own initial threshold). */
#define FC_MAP_BYTES ((size_t)128 << 10)

/* `n` bytes (n > 0) starting on a multiple of `align` (a power of two; a page or less costs
 * nothing more), mapped, zero; NULL if there is no memory. fc_unmap takes the same n (the
 * kernel unmaps whole pages, the last one too); fc_unmap(NULL, n) does nothing. */
void *fc_map(size_t n, size_t align);
void fc_unmap(void *p, size_t n);

/* Scratch memory of `n` bytes (64-byte aligned where mapped, malloc's alignment otherwise),
 * mapped at FC_MAP_BYTES and above; NULL if there is none. fc_scratch_free(NULL) does nothing;
 * it keeps a few mapped blocks for the next alloc of about their size (fc_scratch_trim frees them). */
void *fc_scratch_alloc(size_t n);
void fc_scratch_free(void *p);
/* Give the kept scratch blocks back to the system (an engine's close: finalize frees what the
 * engine held). */
void fc_scratch_trim(void);

#endif
