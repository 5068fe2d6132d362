/* The TCP kind of link: the bytes go over the socket itself. Frames go out with one sendmsg()
 * for many; what arrives is read into a buffer that batches headers and small payloads into few
 * system calls, and a large payload is read straight into its place. */
#include "fc_link.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#if !defined(FC_PORTABLE) && defined(__linux__)
#include <linux/sockios.h> /* SIOCOUTQ: the bytes a socket holds that its peer has not acknowledged */
#include <sys/ioctl.h>
#define UNACKED_IOCTL SIOCOUTQ
#endif

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else
#define SEND_FLAGS MSG_DONTWAIT /* macOS: Python ignores SIGPIPE, and EPIPE is still reported */
#endif

#define MAX_IOV 64
#define READ_BUFFER (256 * 1024)

typedef struct {
    uint8_t buf[READ_BUFFER];
    size_t start, end; /* the arrived bytes not taken: buf[start..end) */
} tcp_state;

static int tcp_open(fc_link *l, const fc_link_params *p, char *why, size_t why_len)
{
    (void)p;
    l->state = malloc(sizeof(tcp_state));
    if (!l->state) {
        snprintf(why, why_len, "out of memory for the link's read buffer");
        return -1;
    }
    tcp_state *s = l->state;
    s->start = s->end = 0;
    return 0;
}

static void tcp_close(fc_link *l)
{
    free(l->state);
}

static int tcp_push(fc_link *l)
{
    struct iovec iov[MAX_IOV];
    int k = 0;
    for (size_t i = 0; i < l->out_count && k + 2 <= MAX_IOV; i++) {
        fc_frame *f = fc_link_frame(l, i);
        if (f->done < f->head_len) {
            iov[k].iov_base = (void *)(fc_frame_head(f) + f->done);
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
        return -1;
    }
    fc_link_written(l, (size_t)n);
    return n > 0;
}

/* One non-blocking read: the bytes read, 0 if none are there yet, -1 at the end of the stream
 * or on an error (noted in the link). */
static ssize_t tcp_recv_direct(fc_link *l, void *dst, size_t n)
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

static int tcp_pull(fc_link *l)
{
    tcp_state *s = l->state;
    if (s->end == READ_BUFFER && s->start > 0) {
        memmove(s->buf, s->buf + s->start, s->end - s->start);
        s->end -= s->start;
        s->start = 0;
    }
    if (s->end == READ_BUFFER)
        return 0; /* full: the reader takes first */
    ssize_t n = tcp_recv_direct(l, s->buf + s->end, READ_BUFFER - s->end);
    if (n > 0)
        s->end += (size_t)n;
    return n > 0 ? 1 : (int)n;
}

static size_t tcp_have(fc_link *l)
{
    tcp_state *s = l->state;
    return s->end - s->start;
}

static void tcp_peek(fc_link *l, void *dst, size_t n, size_t off)
{
    tcp_state *s = l->state;
    memcpy(dst, s->buf + s->start + off, n);
}

static size_t tcp_take(fc_link *l, void *dst, size_t n)
{
    tcp_state *s = l->state;
    size_t have = s->end - s->start;
    if (n > have)
        n = have;
    if (dst && n)
        memcpy(dst, s->buf + s->start, n);
    s->start += n;
    if (s->start == s->end)
        s->start = s->end = 0;
    return n;
}

/* The bytes the socket holds that the peer has not acknowledged; where that cannot be asked
 * (the portable path), FC_IN_FLIGHT_UNKNOWN. */
static size_t tcp_in_flight(fc_link *l)
{
#ifdef UNACKED_IOCTL
    int n = 0;
    return ioctl(l->fd, UNACKED_IOCTL, &n) == 0 && n > 0 ? (size_t)n : 0;
#else
    (void)l;
    return FC_IN_FLIGHT_UNKNOWN;
#endif
}

const fc_link_kind fc_link_tcp = {
    .name = "tcp",
    .open = tcp_open,
    .close = tcp_close,
    .push = tcp_push,
    .pull = tcp_pull,
    .have = tcp_have,
    .peek = tcp_peek,
    .take = tcp_take,
    .recv_direct = tcp_recv_direct,
    .room_event = POLLOUT, /* room is the socket's: poll() reports it */
    .in_flight = tcp_in_flight,
};
