/* What every link shares: the send queue of frames, opening and closing, and the calls the
 * engine makes, each handed to the link's kind (a NULL operation gets fc_link.h's default). */
#include "fc_link.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIRST_QUEUE 16

int fc_link_open(fc_link *l, const fc_link_kind *kind, const fc_link_params *p, char *why, size_t why_len)
{
    memset(l, 0, sizeof *l);
    l->fd = p->fd;
    l->kind = kind;
    int flags = fcntl(p->fd, F_GETFL, 0);
    if (flags >= 0)
        fcntl(p->fd, F_SETFL, flags | O_NONBLOCK);
    l->out_cap = FIRST_QUEUE;
    l->out = calloc(l->out_cap, sizeof *l->out);
    if (!l->out) {
        snprintf(why, why_len, "out of memory for the link's send queue");
        return -1;
    }
    if (kind->open && kind->open(l, p, why, why_len)) {
        free(l->out);
        l->out = NULL;
        l->fd = -1; /* (the socket stays the caller's) */
        return -1;
    }
    return 0;
}

static void release_frame(fc_frame *f)
{
    free(f->head_heap);
    f->head_heap = NULL;
}

void fc_link_drop_all(fc_link *l)
{
    for (size_t i = 0; i < l->out_count; i++)
        release_frame(fc_link_frame(l, i));
    l->out_count = 0;
}

void fc_link_close(fc_link *l)
{
    if (l->out)
        fc_link_drop_all(l);
    free(l->out);
    l->out = NULL;
    if (l->kind && l->kind->close)
        l->kind->close(l);
    l->state = NULL;
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

fc_frame *fc_link_frame(fc_link *l, size_t i)
{
    return &l->out[(l->out_first + i) % l->out_cap];
}

const uint8_t *fc_frame_head(const fc_frame *f)
{
    return f->head_heap ? f->head_heap : f->head;
}

static int grow(fc_link *l)
{
    size_t cap = l->out_cap * 2;
    fc_frame *out = calloc(cap, sizeof *out);
    if (!out)
        return -1;
    for (size_t i = 0; i < l->out_count; i++)
        out[i] = *fc_link_frame(l, i);
    free(l->out);
    l->out = out;
    l->out_cap = cap;
    l->out_first = 0;
    return 0;
}

int fc_link_queue(fc_link *l, const uint8_t *head, size_t head_len, const void *payload, size_t n)
{
    if (l->out_count == l->out_cap && grow(l))
        return -1;
    fc_frame *f = fc_link_frame(l, l->out_count);
    memset(f, 0, sizeof *f);
    if (head_len > FC_INLINE_HEADER) {
        f->head_heap = malloc(head_len);
        if (!f->head_heap)
            return -1;
        memcpy(f->head_heap, head, head_len);
    } else {
        memcpy(f->head, head, head_len);
    }
    f->head_len = (uint32_t)head_len;
    f->payload = payload;
    f->payload_len = n;
    l->out_count++;
    return 0;
}

int fc_link_drop_unstarted(fc_link *l)
{
    if (!l->out_count)
        return 0;
    int started = fc_link_frame(l, 0)->done > 0;
    size_t keep = started ? 1 : 0;
    for (size_t i = keep; i < l->out_count; i++)
        release_frame(fc_link_frame(l, i));
    l->out_count = keep;
    return started;
}

void fc_link_written(fc_link *l, size_t n)
{
    while (n && l->out_count) {
        fc_frame *f = fc_link_frame(l, 0);
        size_t left = f->head_len + f->payload_len - f->done;
        size_t k = n < left ? n : left;
        f->done += k;
        n -= k;
        if (f->done == f->head_len + f->payload_len) {
            release_frame(f);
            l->out_first = (l->out_first + 1) % l->out_cap;
            l->out_count--;
        }
    }
}

/* ----- the kind's operations ----- */

int fc_link_push(fc_link *l)
{
    if (!l->out_count)
        return 0;
    int r = l->send_errno ? -1 : l->kind->push(l);
    if (r < 0)
        fc_link_drop_all(l); /* nobody will take what waits to go out */
    return r;
}

int fc_link_pull(fc_link *l)
{
    if (l->eof || l->recv_errno)
        return -1;
    return l->kind->pull(l);
}

int fc_link_wake(fc_link *l)
{
    if (l->eof || l->recv_errno)
        return -1;
    return l->kind->wake ? l->kind->wake(l) : 0;
}

size_t fc_link_have(fc_link *l)
{
    return l->kind->have(l);
}

void fc_link_peek(fc_link *l, void *dst, size_t n, size_t off)
{
    l->kind->peek(l, dst, n, off);
}

size_t fc_link_take(fc_link *l, void *dst, size_t n)
{
    return l->kind->take(l, dst, n);
}

ssize_t fc_link_recv_direct(fc_link *l, void *dst, size_t n)
{
    if (l->eof || l->recv_errno)
        return -1;
    if (l->kind->recv_direct)
        return l->kind->recv_direct(l, dst, n);
    int pulled = l->kind->pull(l);
    return pulled < 0 ? -1 : (ssize_t)fc_link_take(l, dst, n);
}

int fc_link_may_sleep(fc_link *l)
{
    return l->kind->may_sleep ? l->kind->may_sleep(l) : 1;
}

int fc_link_wait_room(fc_link *l)
{
    return l->kind->wait_room ? l->kind->wait_room(l) : 1;
}

size_t fc_link_in_flight(fc_link *l)
{
    return l->kind->in_flight ? l->kind->in_flight(l) : 0;
}

void fc_link_say_cpu(fc_link *l, int cpu)
{
    if (l->kind->say_cpu)
        l->kind->say_cpu(l, cpu);
}

int fc_link_peer_cpu(fc_link *l)
{
    return l->kind->peer_cpu ? l->kind->peer_cpu(l) : -1;
}
