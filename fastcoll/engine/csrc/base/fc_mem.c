/* Large memory straight from the kernel (see fc_mem.h). */
#include "fc_mem.h"

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

void *fc_scratch_alloc(size_t n)
{
    if (n > SIZE_MAX - HEADER)
        return NULL;
    size_t total = n + HEADER;
    uint8_t *p = total >= FC_MAP_BYTES ? fc_map(total, 0) : malloc(total);
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
    size_t total = *(size_t *)(void *)base;
    if (total >= FC_MAP_BYTES)
        fc_unmap(base, total);
    else
        free(base);
}
