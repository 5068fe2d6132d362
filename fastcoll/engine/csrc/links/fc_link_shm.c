/* The shared-memory kind of link: the bytes go through a pair of rings (fc_shmring.h), one each
 * way, in a segment both ranks map. The socket carries only one-byte doorbells, which wake a
 * side asleep in poll(), and, when a rank exits, the end of the stream: the rings outlive a dead
 * writer, so that end is how its death is seen. */
#include "fc_link.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "fc_shmring.h"
#include "fc_streamcopy.h"

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else
#define SEND_FLAGS MSG_DONTWAIT
#endif

typedef struct {
    fc_ring tx, rx;
} shm_state;

static int shm_open(fc_link *l, const fc_link_params *p, char *why, size_t why_len)
{
    if (!p->tx_mem || !p->rx_mem || !p->cap) {
        snprintf(why, why_len, "a shared-memory link needs a segment holding both rings");
        return -1;
    }
    shm_state *s = malloc(sizeof *s);
    if (!s) {
        snprintf(why, why_len, "out of memory for the link's rings");
        return -1;
    }
    fc_ring_init(&s->tx, p->tx_mem, p->cap, 1);
    fc_ring_init(&s->rx, p->rx_mem, p->cap, 0);
    l->state = s;
    return 0;
}

static void shm_close(fc_link *l)
{
    free(l->state); /* (the segment is the caller's) */
}

static void ring_bell(fc_link *l)
{
    char bell = 0;
    /* A full socket buffer already holds bells, and a gone peer is found by the reads. */
    (void)!send(l->fd, &bell, 1, SEND_FLAGS);
}

/* A peer that wrote a ring counter out of range (fc_shmring.h) has broken the link for good:
 * 1, with the ring's account of it in l->why and `*slot` (the failed direction's errno) set to
 * EBADMSG, which the engine reports as a malformed frame from that peer. */
static int spoiled(fc_link *l, int *slot)
{
    shm_state *s = l->state;
    fc_ring *r = s->rx.bad ? &s->rx : s->tx.bad ? &s->tx : NULL;
    if (!r)
        return 0;
    if (!l->why[0])
        fc_ring_explain(r, l->why, sizeof l->why);
    if (!*slot)
        *slot = EBADMSG;
    return 1;
}

static int shm_push(fc_link *l)
{
    shm_state *s = l->state;
    if (spoiled(l, &l->send_errno))
        return -1;
    if (l->eof) {
        l->send_errno = EPIPE; /* the peer's end of the stream came: it reads no more */
        return -1;
    }
    size_t total = 0;
    while (l->out_count) {
        fc_frame *f = fc_link_frame(l, 0);
        size_t got;
        if (f->done < f->head_len) {
            got = fc_ring_put(&s->tx, fc_frame_head(f) + f->done, f->head_len - f->done, 0);
        } else {
            size_t pdone = f->done - f->head_len;
            got = fc_ring_put(&s->tx, f->payload + pdone, f->payload_len - pdone,
                              f->payload_len >= FC_STREAM_MIN_BYTES);
        }
        size_t before = l->out_count;
        fc_link_written(l, got);
        total += got;
        if (!got && l->out_count == before && f->head_len + f->payload_len > f->done)
            break; /* the ring is full */
    }
    if (total && fc_ring_publish(&s->tx))
        ring_bell(l);
    return spoiled(l, &l->send_errno) ? -1 : total > 0;
}

/* The hot path's look: the bytes are in the ring already (have, take), so only the end of the
 * stream, which the doorbells' reader (shm_wake) notes, is news here. */
static int shm_pull(fc_link *l)
{
    return l->eof ? -1 : 0;
}

/* Take the doorbells; note the end of the stream (an orderly end or a reset: the peer is gone
 * either way). 1: bells came; 0: none; -1: the stream ended. */
static int shm_wake(fc_link *l)
{
    char bells[4096];
    int got = 0;
    while (!l->eof) {
        ssize_t n = recv(l->fd, bells, sizeof bells, MSG_DONTWAIT);
        if (n > 0) {
            got = 1;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return got;
        l->eof = 1;
    }
    if (l->out_count && !l->send_errno) { /* nobody will take what waits to go out */
        l->send_errno = EPIPE;
        fc_link_drop_all(l);
    }
    return -1;
}

static size_t shm_have(fc_link *l)
{
    size_t n = fc_ring_avail(&((shm_state *)l->state)->rx);
    spoiled(l, &l->recv_errno); /* (a bad ring has no data: the next pull reports it) */
    return n;
}

static void shm_peek(fc_link *l, void *dst, size_t n, size_t off)
{
    fc_ring_peek(&((shm_state *)l->state)->rx, dst, n, off);
}

static size_t shm_take(fc_link *l, void *dst, size_t n)
{
    int wake = 0;
    size_t got = fc_ring_get(&((shm_state *)l->state)->rx, dst, n, &wake);
    if (wake)
        ring_bell(l); /* the writer waits for room */
    spoiled(l, &l->recv_errno);
    return got;
}

static int shm_may_sleep(fc_link *l)
{
    return fc_ring_sleep(&((shm_state *)l->state)->rx); /* the writer rings once the flag is up */
}

static int shm_wait_room(fc_link *l)
{
    return fc_ring_wait_room(&((shm_state *)l->state)->tx);
}

static void shm_say_cpu(fc_link *l, int cpu)
{
    fc_ring_say_cpu(&((shm_state *)l->state)->tx, cpu);
}

static int shm_peer_cpu(fc_link *l)
{
    return fc_ring_writer_cpu(&((shm_state *)l->state)->rx);
}

const fc_link_kind fc_link_shm = {
    .name = "shm",
    .open = shm_open,
    .close = shm_close,
    .push = shm_push,
    .pull = shm_pull,
    .wake = shm_wake,
    .have = shm_have,
    .peek = shm_peek,
    .take = shm_take,
    .may_sleep = shm_may_sleep,
    .wait_room = shm_wait_room,
    .room_event = POLLIN, /* the reader rings when it takes bytes */
    .say_cpu = shm_say_cpu,
    .peer_cpu = shm_peer_cpu,
    /* (no in_flight: the rings outlive a rank that exits, so nothing it said is lost) */
};
