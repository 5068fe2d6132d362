/* Large memory straight from the kernel (see fc_mem.h). */
#include "fc_mem.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS MAP_ANON
#endif

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

void *fc_map(size_t n, size_t align)
{
    size_t page = page_size();
    if (align < page)
        align = page;
    if (!n || n > SIZE_MAX / 2 - 2 * align)
        return NULL;
    size_t len = (n + page - 1) / page * page;
    size_t extra = align > page ? align : 0; /* room to slide to an aligned start */
    uint8_t *raw = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *p = raw;
    if (extra) { /* give back what lies before the aligned start and after its end */
        size_t lead = (align - (size_t)((uintptr_t)raw % align)) % align;
        p = raw + lead;
        if (lead)
            munmap(raw, lead);
        if (extra - lead)
            munmap(p + len, extra - lead);
    }
    return p;
}

void fc_unmap(void *p, size_t n)
{
    if (p)
        munmap(p, n);
}

/* A scratch block starts with this header: its length with the header, which says whether it
 * was mapped (FC_MAP_BYTES or more) or malloc'd. */
#define HEADER 64

/* Mapped blocks freed and kept for the next call: a collective of one size, step after step,
 * takes its block back instead of mapping, faulting in and unmapping it each time (which made a
 * 1 MiB reduce_scatter four times slower, bench/NOTES.md 103). A few blocks, bounded in bytes,
 * shared by the engines of the process (under a lock: each engine's thread frees its own). */
#define KEEP_BLOCKS 4
#define KEEP_BYTES ((size_t)64 << 20)
static uint8_t *kept[KEEP_BLOCKS];
static size_t kept_bytes;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t total_of(const uint8_t *base)
{
    return *(const size_t *)(const void *)base;
}

/* The smallest kept block of `total` bytes or more, no more than twice that (NULL: none). */
static uint8_t *take_kept(size_t total)
{
    int best = -1;
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < KEEP_BLOCKS; i++)
        if (kept[i] && total_of(kept[i]) >= total && total_of(kept[i]) / 2 <= total &&
            (best < 0 || total_of(kept[i]) < total_of(kept[best])))
            best = i;
    uint8_t *p = best < 0 ? NULL : kept[best];
    if (p) {
        kept[best] = NULL;
        kept_bytes -= total_of(p);
    }
    pthread_mutex_unlock(&kept_lock);
    return p;
}

/* Keep a freed mapped block where there is room; 0 if it was not kept. */
static int keep(uint8_t *base)
{
    int done = 0;
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < KEEP_BLOCKS && !done; i++)
        if (!kept[i] && kept_bytes + total_of(base) <= KEEP_BYTES) {
            kept[i] = base;
            kept_bytes += total_of(base);
            done = 1;
        }
    pthread_mutex_unlock(&kept_lock);
    return done;
}

void fc_scratch_trim(void)
{
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < KEEP_BLOCKS; i++) {
        if (kept[i])
            fc_unmap(kept[i], total_of(kept[i]));
        kept[i] = NULL;
    }
    kept_bytes = 0;
    pthread_mutex_unlock(&kept_lock);
}

void *fc_scratch_alloc(size_t n)
{
    if (n > SIZE_MAX - HEADER)
        return NULL;
    size_t total = n + HEADER;
    uint8_t *p;
    if (total < FC_MAP_BYTES)
        p = malloc(total);
    else if ((p = take_kept(total)))
        total = total_of(p); /* a kept block keeps its own length */
    else
        p = fc_map(total, 0);
    if (!p)
        return NULL;
    *(size_t *)(void *)p = total;
    return p + HEADER;
}

void fc_scratch_free(void *p)
{
    if (!p)
        return;
    uint8_t *base = (uint8_t *)p - HEADER;
    size_t total = total_of(base);
    if (total < FC_MAP_BYTES)
        free(base);
    else if (!keep(base))
        fc_unmap(base, total);
}
