/* One connection to one peer: a TCP socket or shared-memory rings behind the same calls. */
#include "fc_link.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fc_streamcopy.h"

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else
#define SEND_FLAGS MSG_DONTWAIT /* macOS: Python ignores SIGPIPE, and EPIPE is still reported */
#endif

#define MAX_IOV 64

int fc_link_init(fc_link *l, int fd, uint8_t *tx_mem, uint8_t *rx_mem, size_t cap)
{
    memset(l, 0, sizeof *l);
    l->fd = fd;
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (tx_mem && rx_mem) {
        l->shm = 1;
        fc_ring_init(&l->tx, tx_mem, cap, 1);
        fc_ring_init(&l->rx, rx_mem, cap, 0);
    } else {
        l->rbuf = malloc(FC_READ_BUFFER);
        if (!l->rbuf)
            return -1;
    }
    l->out_cap = 16;
    l->out = calloc(l->out_cap, sizeof *l->out);
    return l->out ? 0 : -1;
}

static void release_frame(fc_frame *f)
{
    free(f->head_heap);
    f->head_heap = NULL;
}

static void drop_all(fc_link *l)
{
    for (size_t i = 0; i < l->out_count; i++)
        release_frame(&l->out[(l->out_first + i) % l->out_cap]);
    l->out_count = 0;
}

void fc_link_close(fc_link *l)
{
    if (l->out)
        drop_all(l);
    free(l->out);
    free(l->rbuf);
    l->out = NULL;
    l->rbuf = NULL;
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

static int grow(fc_link *l)
{
    size_t cap = l->out_cap * 2;
    fc_frame *out = calloc(cap, sizeof *out);
    if (!out)
        return -1;
    for (size_t i = 0; i < l->out_count; i++)
        out[i] = l->out[(l->out_first + i) % l->out_cap];
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
    fc_frame *f = &l->out[(l->out_first + l->out_count) % l->out_cap];
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
    fc_frame *first = &l->out[l->out_first];
    int started = first->done > 0;
    size_t keep = started ? 1 : 0;
    for (size_t i = keep; i < l->out_count; i++)
        release_frame(&l->out[(l->out_first + i) % l->out_cap]);
    l->out_count = keep;
    return started;
}

static const uint8_t *frame_head(const fc_frame *f)
{
    return f->head_heap ? f->head_heap : f->head;
}

/* Advance the queue past `n` written bytes. */
static void written(fc_link *l, size_t n)
{
    while (n && l->out_count) {
        fc_frame *f = &l->out[l->out_first];
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

static int push_tcp(fc_link *l)
{
    struct iovec iov[MAX_IOV];
    int k = 0;
    for (size_t i = 0; i < l->out_count && k + 2 <= MAX_IOV; i++) {
        fc_frame *f = &l->out[(l->out_first + i) % l->out_cap];
        if (f->done < f->head_len) {
            iov[k].iov_base = (void *)(frame_head(f) + f->done);
            iov[k++].iov_len = f->head_len - f->done;
        }
        size_t pdone = f->done > f->head_len ? f->done - f->head_len : 0;
        if (f->payload_len > pdone) {
            iov[k].iov_base = (void *)(f->payload + pdone);
            iov[k++].iov_len = f->payload_len - pdone;
        }
    }
    if (!k)
        return 0;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = k;
    ssize_t n = sendmsg(l->fd, &msg, SEND_FLAGS);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return 0;
        l->send_errno = errno;
        drop_all(l);
        return -1;
    }
    written(l, (size_t)n);
    return n > 0;
}

static void ring_bell(fc_link *l)
{
    char bell = 0;
    /* A full socket buffer already holds bells, and a gone peer is found by the reads. */
    (void)!send(l->fd, &bell, 1, SEND_FLAGS);
}

static int push_shm(fc_link *l)
{
    size_t total = 0;
    while (l->out_count) {
        fc_frame *f = &l->out[l->out_first];
        size_t got;
        if (f->done < f->head_len) {
            got = fc_ring_put(&l->tx, frame_head(f) + f->done, f->head_len - f->done, 0);
        } else {
            size_t pdone = f->done - f->head_len;
            got = fc_ring_put(&l->tx, f->payload + pdone, f->payload_len - pdone,
                              f->payload_len >= FC_STREAM_MIN_BYTES);
        }
        size_t before = l->out_count;
        written(l, got);
        total += got;
        if (!got && l->out_count == before && f->head_len + f->payload_len > f->done)
            break; /* the ring is full */
    }
    if (total && fc_ring_publish(&l->tx))
        ring_bell(l);
    return total > 0;
}

int fc_link_push(fc_link *l)
{
    if (!l->out_count)
        return 0;
    if (l->shm && l->eof && !l->send_errno)
        l->send_errno = EPIPE; /* the peer's end of the stream came: it reads no more */
    if (l->shm && (l->tx.bad || l->rx.bad) && !l->send_errno)
        l->send_errno = EPROTO; /* the peer broke a ring's counters (fc_shmring.h) */
    if (l->send_errno) {
        drop_all(l);
        return -1;
    }
    return l->shm ? push_shm(l) : push_tcp(l);
}

int fc_link_wait_room(fc_link *l)
{
    return l->shm && fc_ring_wait_room(&l->tx);
}

/* One non-blocking read: the bytes read, 0 if none are there yet, -1 at the end of the stream
 * or on an error (noted in the link). */
static ssize_t recv_some(fc_link *l, void *dst, size_t n)
{
    ssize_t got = recv(l->fd, dst, n, MSG_DONTWAIT);
    if (got > 0)
        return got;
    if (got == 0) {
        l->eof = 1;
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    l->recv_errno = errno;
    return -1;
}

static int pull_tcp(fc_link *l)
{
    if (l->rend == FC_READ_BUFFER && l->rstart > 0) {
        memmove(l->rbuf, l->rbuf + l->rstart, l->rend - l->rstart);
        l->rend -= l->rstart;
        l->rstart = 0;
    }
    if (l->rend == FC_READ_BUFFER)
        return 0; /* full: the reader takes first */
    ssize_t n = recv_some(l, l->rbuf + l->rend, FC_READ_BUFFER - l->rend);
    if (n > 0)
        l->rend += (size_t)n;
    return n > 0 ? 1 : (int)n;
}

static int pull_bells(fc_link *l)
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
        l->eof = 1; /* an orderly end or a reset: the peer is gone either way */
    }
    if (l->out_count && !l->send_errno) { /* nobody will take what waits to go out */
        l->send_errno = EPIPE;
        drop_all(l);
    }
    return -1;
}

int fc_link_pull(fc_link *l)
{
    if (l->eof || l->recv_errno)
        return -1;
    return l->shm ? pull_bells(l) : pull_tcp(l);
}

size_t fc_link_have(fc_link *l)
{
    if (!l->shm)
        return l->rend - l->rstart;
    size_t n = fc_ring_avail(&l->rx);
    if ((l->rx.bad || l->tx.bad) && !l->recv_errno)
        l->recv_errno = EPROTO; /* the peer broke a ring's counters: a failed receive */
    return n;
}

void fc_link_peek(fc_link *l, void *dst, size_t n, size_t off)
{
    if (l->shm)
        fc_ring_peek(&l->rx, dst, n, off);
    else
        memcpy(dst, l->rbuf + l->rstart + off, n);
}

size_t fc_link_take(fc_link *l, void *dst, size_t n)
{
    if (l->shm) {
        int wake = 0;
        size_t got = fc_ring_get(&l->rx, dst, n, &wake);
        if (wake)
            ring_bell(l);
        if (l->rx.bad && !l->recv_errno)
            l->recv_errno = EPROTO; /* the peer broke the ring's counters: a failed receive */
        return got;
    }
    size_t have = l->rend - l->rstart;
    if (n > have)
        n = have;
    if (dst && n)
        memcpy(dst, l->rbuf + l->rstart, n);
    l->rstart += n;
    if (l->rstart == l->rend)
        l->rstart = l->rend = 0;
    return n;
}

ssize_t fc_link_recv_direct(fc_link *l, void *dst, size_t n)
{
    if (l->eof || l->recv_errno)
        return -1;
    return recv_some(l, dst, n);
}

int fc_link_may_sleep(fc_link *l)
{
    return l->shm ? fc_ring_sleep(&l->rx) : 1; /* poll() reports what reaches a socket */
}
