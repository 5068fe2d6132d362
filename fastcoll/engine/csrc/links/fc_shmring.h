/* One direction of a shared-memory connection: a single-producer single-consumer byte ring.
 *
 * The layout is the pure-Python engine's (fastcoll/transport/shm.py): a control block of three
 * 128-byte lines (HEAD, the bytes ever written, published by the writer; TAIL, the bytes ever
 * read, published by the reader; the reader's ASLEEP flag, beside which this engine keeps the
 * writer's WAITING flag), then the data. The writer copies bytes and then publishes HEAD with a
 * release store; the reader loads HEAD with acquire, copies, and publishes TAIL with release, so
 * the order holds on weakly ordered CPUs (Apple silicon) as on x86-64. A side that is about to
 * sleep raises its flag, fences, and looks once more; the other side, after publishing, fences
 * and looks at the flag: one of the two always sees the other, so no wake-up is lost.
 *
 * The peer can write every word of the control block, so each counter read from it is checked
 * before it is used (0 <= tail <= head <= tail + capacity, in unsigned arithmetic; a ring
 * position is its counter modulo the capacity, never a signed remainder). A counter out of range
 * marks the ring `bad` for good: it then has no data and no room, and the link reports its peer
 * as malformed (fc_link_shm.c). This side's own counter is read once, when the ring is made.
 */
#ifndef FC_SHMRING_H
#define FC_SHMRING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FC_RING_CONTROL 384

typedef struct fc_ring {
    _Atomic int64_t *head;
    _Atomic int64_t *tail;
    _Atomic int64_t *asleep;  /* the reader sleeps until woken */
    _Atomic int64_t *waiting; /* the writer sleeps until there is room */
    _Atomic int64_t *cpu;     /* the CPU the writer last ran on (+1; 0: unknown) */
    uint8_t *data;
    size_t cap;
    uint64_t mine; /* the writer's head, or the reader's tail (below 2^63) */
    int bad;       /* the peer wrote a counter out of range: the ring is unusable */
    const char *bad_what; /* which counter ("head", "tail", or this side's own at the start) */
    int64_t bad_value;    /* the value read */
} fc_ring;

/* A ring over `mem` (FC_RING_CONTROL + cap bytes, 8-byte aligned); `writer`: this side writes. */
void fc_ring_init(fc_ring *r, uint8_t *mem, size_t cap, int writer);

/* What made the ring bad, as text for an error (a message of at most n bytes, NUL-ended). */
void fc_ring_explain(const fc_ring *r, char *out, size_t n);

/* Writer: free bytes now (0 once bad). */
size_t fc_ring_free(fc_ring *r);
/* Writer: copy up to n bytes after the head (what fits); how many. Invisible until published.
 * `stream`: with stores that bypass this CPU's caches (fc_streamcopy.h), for a large message. */
size_t fc_ring_put(fc_ring *r, const void *src, size_t n, int stream);
/* Writer: publish what was put; 1 if the reader sleeps and must be woken (its flag is cleared). */
int fc_ring_publish(fc_ring *r);
/* Writer: about to sleep for room: 1 if the ring is still full (sleep), 0 if room came (or
 * it went bad: the next push reports it). */
int fc_ring_wait_room(fc_ring *r);

/* Reader: published bytes not yet read (0 once bad). */
size_t fc_ring_avail(fc_ring *r);
/* Reader: copy n bytes at `offset` past the tail without taking them (n + offset <= avail). */
void fc_ring_peek(fc_ring *r, void *dst, size_t n, size_t offset);
/* Reader: take up to n bytes into dst (NULL: drop them); how many. Sets *wake when the writer
 * waits for room and must be woken (its flag is cleared). */
size_t fc_ring_get(fc_ring *r, void *dst, size_t n, int *wake);
/* Reader: about to sleep: 1 if the ring is still empty (sleep), 0 if data came (or it went
 * bad: the next look reports it). */
int fc_ring_sleep(fc_ring *r);
/* Writer: say which CPU this side runs on (-1: unknown). Reader: the writer's, or -1. */
void fc_ring_say_cpu(fc_ring *r, int cpu);
int fc_ring_writer_cpu(fc_ring *r);

#endif
