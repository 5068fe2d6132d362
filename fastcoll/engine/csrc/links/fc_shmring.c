/* A single-producer single-consumer byte ring in shared memory (see fc_shmring.h). */
#include "fc_shmring.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "fc_streamcopy.h"

#define LINE_WORDS 16 /* 128 bytes of int64 */
#define COUNTER_MAX ((uint64_t)INT64_MAX) /* a counter is an int64 the peer can read: never negative */

/* Mark the ring unusable: the peer wrote `value` into counter `what`. */
static void spoil(fc_ring *r, const char *what, int64_t value)
{
    if (!r->bad) {
        r->bad = 1;
        r->bad_what = what;
        r->bad_value = value;
    }
}

void fc_ring_init(fc_ring *r, uint8_t *mem, size_t cap, int writer)
{
    _Atomic int64_t *words = (_Atomic int64_t *)(void *)mem;
    r->head = words;
    r->tail = words + LINE_WORDS;
    r->asleep = words + 2 * LINE_WORDS;
    r->waiting = words + 2 * LINE_WORDS + 1;
    r->cpu = words + 2 * LINE_WORDS + 2;
    r->data = mem + FC_RING_CONTROL;
    r->cap = cap;
    r->bad = 0;
    r->bad_what = NULL;
    r->bad_value = 0;
    int64_t start = atomic_load_explicit(writer ? r->head : r->tail, memory_order_relaxed);
    r->mine = start < 0 ? 0 : (uint64_t)start;
    if (start < 0)
        spoil(r, writer ? "head (at the start)" : "tail (at the start)", start);
}

void fc_ring_explain(const fc_ring *r, char *out, size_t n)
{
    if (!n)
        return;
    if (!r->bad) {
        out[0] = 0;
        return;
    }
    snprintf(out, n, "a shared-memory ring counter out of range: %s %lld where this side is at %llu, capacity %zu",
             r->bad_what, (long long)r->bad_value, (unsigned long long)r->mine, r->cap);
}

size_t fc_ring_free(fc_ring *r)
{
    int64_t seen = atomic_load_explicit(r->tail, memory_order_acquire);
    uint64_t tail = (uint64_t)seen; /* a negative one is above every valid head */
    if (!r->bad && (tail > r->mine || r->mine - tail > r->cap))
        spoil(r, "tail", seen);
    return r->bad ? 0 : r->cap - (size_t)(r->mine - tail);
}

static void plain_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

/* Copy n bytes between a linear buffer and the ring at position pos (wrapping). */
static void copy_in(fc_ring *r, uint64_t pos, const uint8_t *src, size_t n, int stream)
{
    size_t i = (size_t)(pos % r->cap), first = r->cap - i;
    void (*copy)(void *, const void *, size_t) = stream ? fc_stream_copy : plain_copy;
    if (first > n)
        first = n;
    copy(r->data + i, src, first);
    if (first < n)
        copy(r->data, src + first, n - first);
}

static void copy_out(fc_ring *r, uint64_t pos, uint8_t *dst, size_t n)
{
    size_t i = (size_t)(pos % r->cap), first = r->cap - i;
    if (first > n)
        first = n;
    memcpy(dst, r->data + i, first);
    if (first < n)
        memcpy(dst + first, r->data, n - first);
}

size_t fc_ring_put(fc_ring *r, const void *src, size_t n, int stream)
{
    size_t room = fc_ring_free(r);
    if (n > room)
        n = room;
    if (n) {
        copy_in(r, r->mine, src, n, stream);
        r->mine += n;
    }
    return n;
}

int fc_ring_publish(fc_ring *r)
{
    atomic_store_explicit(r->head, (int64_t)r->mine, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(r->asleep, memory_order_relaxed)) {
        atomic_store_explicit(r->asleep, 0, memory_order_relaxed);
        return 1;
    }
    return 0;
}

int fc_ring_wait_room(fc_ring *r)
{
    atomic_store_explicit(r->waiting, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    return fc_ring_free(r) == 0 && !r->bad;
}

size_t fc_ring_avail(fc_ring *r)
{
    int64_t seen = atomic_load_explicit(r->head, memory_order_acquire);
    uint64_t head = (uint64_t)seen;
    if (!r->bad && (head < r->mine || head - r->mine > r->cap || head > COUNTER_MAX))
        spoil(r, "head", seen);
    return r->bad ? 0 : (size_t)(head - r->mine);
}

void fc_ring_peek(fc_ring *r, void *dst, size_t n, size_t offset)
{
    copy_out(r, r->mine + offset, dst, n);
}

size_t fc_ring_get(fc_ring *r, void *dst, size_t n, int *wake)
{
    size_t avail = fc_ring_avail(r);
    if (n > avail)
        n = avail;
    if (!n)
        return 0;
    if (dst)
        copy_out(r, r->mine, dst, n);
    r->mine += n;
    atomic_store_explicit(r->tail, (int64_t)r->mine, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(r->waiting, memory_order_relaxed)) {
        atomic_store_explicit(r->waiting, 0, memory_order_relaxed);
        *wake = 1;
    }
    return n;
}

int fc_ring_sleep(fc_ring *r)
{
    atomic_store_explicit(r->asleep, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    return fc_ring_avail(r) == 0 && !r->bad;
}

void fc_ring_say_cpu(fc_ring *r, int cpu)
{
    if (atomic_load_explicit(r->cpu, memory_order_relaxed) != cpu + 1)
        atomic_store_explicit(r->cpu, cpu + 1, memory_order_relaxed);
}

int fc_ring_writer_cpu(fc_ring *r)
{
    int64_t v = atomic_load_explicit(r->cpu, memory_order_relaxed); /* the peer's word: any value */
    return v > 0 && v <= INT_MAX ? (int)(v - 1) : -1;
}
