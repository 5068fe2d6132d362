/* The verbs link's traffic: completions taken from the queue, each arriving frame checked, stream
 * bytes packed into send slots, and credits returned.
 *
 * Credits. A side sends a data frame only while it holds two credits or more, keeping the last
 * for a credit-only frame, so that two sides that each owe the other can always say so. The
 * receiver returns credits in every frame it sends, and in a credit-only frame once half its
 * slots are owed, or an eighth once the engine has taken everything that came, or at once when
 * the peer may be down to fewer than two. When no frame can go
 * (no credit left, or every small buffer still in flight) the credits go over the TCP socket:
 * credits must go back as soon as the engine takes the bytes, whatever the engine does next,
 * as a TCP receive window reopens without the reader's help; otherwise a rank that took a
 * peer's bytes and then waited on another rank would leave that peer unable to finish sending.
 */
#include "fc_verbs.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else
#define SEND_FLAGS MSG_DONTWAIT /* macOS: Python ignores SIGPIPE, and EPIPE is still reported */
#endif

#define POLL_BATCH 16
#define SOCK_MSG 8

static const uint8_t CREDIT_MAGIC[4] = {'F', 'C', 'V', 'C'}; /* the socket's messages: credits */
static const uint8_t BELL_MAGIC[4] = {'F', 'C', 'V', 'W'};   /* ... and a wake-up */

static inline fc_verbs *st(fc_link *l)
{
    return (fc_verbs *)l->state;
}

static const char *conn_of(const fc_verbs *v)
{
    return v->q.reliable ? "reliable connection" : "unreliable connection";
}

void fc_verbs_fail(fc_link *l, int send, int code, const char *fmt, ...)
{
    if (!l->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(l->why, sizeof l->why, fmt, ap);
        va_end(ap);
    }
    int *slot = send ? &l->send_errno : &l->recv_errno;
    if (!*slot)
        *slot = code;
}

static const char *status_text(int status)
{
    switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
        return "the peer did not acknowledge it (retries exceeded: is the peer gone?)";
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return "the peer had no receive posted (receiver-not-ready retries exceeded)";
    case IBV_WC_WR_FLUSH_ERR:
        return "the queue pair had failed before it (flushed)";
    case IBV_WC_LOC_LEN_ERR:
        return "a message longer than its buffer";
    case IBV_WC_LOC_PROT_ERR:
        return "a buffer outside the registered memory";
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
        return "the peer's device refused it";
    default:
        return "the device reported an error";
    }
}

void fc_verbs_repost(fc_link *l, uint32_t slot)
{
    int rc = fc_verbs_post_recv(&st(l)->q, slot);
    if (rc)
        fc_verbs_fail(l, 0, EIO, "posting a receive on the RDMA link failed (error %d)", rc);
    else
        st(l)->owed++;
}

/* Write what waits to go over the socket, as much as it takes now (a failure is the peer gone,
 * which the reads find). */
static void flush_socket(fc_link *l)
{
    fc_verbs *v = st(l);
    if (!v->sock_out_len)
        return;
    ssize_t k = send(l->fd, v->sock_out, v->sock_out_len, SEND_FLAGS);
    if (k <= 0)
        return;
    memmove(v->sock_out, v->sock_out + k, v->sock_out_len - (size_t)k);
    v->sock_out_len -= (uint32_t)k;
}

/* Queue one 8-byte message for the socket and write what it takes. 0, or -1 where eight wait
 * unread already (the peer reads them when it needs them). */
static int say_on_socket(fc_link *l, const uint8_t magic[4], uint32_t value)
{
    fc_verbs *v = st(l);
    if (v->sock_out_len + SOCK_MSG > sizeof v->sock_out)
        return -1;
    memcpy(v->sock_out + v->sock_out_len, magic, 4);
    fc_put32(v->sock_out + v->sock_out_len + 4, value);
    v->sock_out_len += SOCK_MSG;
    flush_socket(l);
    return 0;
}

typedef struct frame_head {
    uint32_t seq, len, credits, flags, ack, cpu;
} frame_head;

/* The link header at h of a message of `bytes`, checked. 0, or -1 (the link failed, saying how). */
static int check_head(fc_link *l, const uint8_t *h, uint32_t bytes, frame_head *f)
{
    fc_verbs *v = st(l);
    f->seq = fc_get32(h), f->len = fc_get32(h + 4), f->ack = fc_get32(h + 12), f->cpu = fc_get32(h + 16);
    f->credits = h[8] | (uint32_t)h[9] << 8, f->flags = h[10] | (uint32_t)h[11] << 8;
    if (f->len != bytes - FC_VERBS_HEAD || (f->flags & ~FC_VERBS_ASLEEP) || (int32_t)(v->seq - f->ack) < 0 ||
        f->cpu > FC_VERBS_MAX_CPU) {
        fc_verbs_fail(l, 0, EPROTO, "a malformed frame came on the RDMA link (%s): frame %u of %u bytes", conn_of(v),
                      f->seq, bytes);
        return -1;
    }
    if (f->seq != v->expect) {
        int lost = (int32_t)(f->seq - v->expect) > 0;
        fc_verbs_fail(l, 0, EPROTO, "a frame %s on the RDMA link (%s): frame %u expected, %u came%s",
                      lost ? "was lost" : "came twice", conn_of(v), v->expect, f->seq, lost ? "" : " again");
        return -1;
    }
    if (f->credits > v->peer_slots - v->credits) {
        fc_verbs_fail(l, 0, EPROTO, "the peer returned %u credits on the RDMA link, more than the %u it lacked",
                      f->credits, v->peer_slots - v->credits);
        return -1;
    }
    return 0;
}

/* Check the frame that landed in `slot` and add it to the stream. 1: data came; 0: a
 * credit-only frame; -1: it broke the link's protocol (the link failed, saying how). */
static int frame_in(fc_link *l, uint32_t slot, uint32_t bytes)
{
    fc_verbs *v = st(l);
    frame_head f;
    if (slot >= FC_VERBS_RX_SLOTS || bytes < FC_VERBS_HEAD || bytes > FC_VERBS_SLOT_BYTES) {
        fc_verbs_fail(l, 0, EPROTO, "a frame of %u bytes came on the RDMA link (%s), outside %d..%d", bytes,
                      conn_of(v), FC_VERBS_HEAD, FC_VERBS_SLOT_BYTES);
        return -1;
    }
    if (check_head(l, v->q.rx_mem + (size_t)slot * FC_VERBS_SLOT_BYTES, bytes, &f))
        return -1;
    v->expect++;
    v->credits += f.credits;
    v->peer_cpu = v->same_host && f.cpu ? (int)f.cpu - 1 : -1;
    v->announced = 0; /* (the peer has sent since: it rings no more until told again) */
    if (f.flags & FC_VERBS_ASLEEP) {
        /* It fell asleep before frames of this side reached it: they wait unseen, so ring now. */
        if (f.ack == v->seq || say_on_socket(l, BELL_MAGIC, 0) != 0)
            v->peer_asleep = 1; /* (ring with the next message) */
    }
    if (f.len == 0) { /* credit-only: its slot goes back at once */
        fc_verbs_repost(l, slot);
        return 0;
    }
    v->arrived[(v->first + v->count) % FC_VERBS_RX_SLOTS] = slot;
    v->arrived_len[slot] = f.len;
    v->count++;
    v->avail += f.len;
    return 1;
}

/* One completion: 1 if stream bytes arrived with it. */
static int complete(fc_link *l, const struct ibv_wc *wc)
{
    fc_verbs *v = st(l);
    uint32_t kind = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id;
    if (kind == FC_WR_SEND)
        v->tx_done++;
    else if (kind == FC_WR_CTL)
        v->cx_done++;
    if (wc->status != IBV_WC_SUCCESS) {
        fc_verbs_fail(l, kind != FC_WR_RECV, EIO, "a %s failed on the RDMA link (%s): %s (status %d)",
                      kind == FC_WR_RECV ? "receive" : "send", conn_of(v), status_text(wc->status), wc->status);
        return 0;
    }
    if (kind != FC_WR_RECV || l->recv_errno)
        return 0; /* (what comes after a broken frame is not read) */
    return frame_in(l, idx, wc->byte_len) > 0;
}

int fc_verbs_drain(fc_link *l)
{
    fc_verbs *v = st(l);
    struct ibv_wc wc[POLL_BATCH];
    int arrived = 0;
    for (;;) {
        int n = ibv_poll_cq(v->q.cq, POLL_BATCH, wc);
        if (n < 0) {
            fc_verbs_fail(l, 0, EIO, "polling the RDMA link's completion queue failed (%d)", n);
            break;
        }
        for (int i = 0; i < n; i++)
            arrived += complete(l, &wc[i]);
        if (n < POLL_BATCH)
            break;
    }
    return l->recv_errno ? -1 : arrived;
}

/* The link header: frame number, length, credits returned and flags, the frames of the peer
 * this side has received (what a notice of sleep is checked against), and this side's CPU + 1. */
static void header(fc_verbs *v, uint8_t *buf, uint32_t len, uint32_t flags)
{
    fc_put32(buf, v->seq);
    fc_put32(buf + 4, len);
    fc_put32(buf + 8, (v->owed & 0xffffu) | flags << 16); /* (owed <= FC_VERBS_RX_SLOTS) */
    fc_put32(buf + 12, v->expect);
    fc_put32(buf + 16, v->my_cpu);
}

/* Copy up to `room` bytes from the front of the send queue to dst (they are not taken yet). */
static uint32_t gather(fc_link *l, uint8_t *dst, uint32_t room)
{
    uint32_t n = 0;
    for (size_t i = 0; i < l->out_count && n < room; i++) {
        fc_frame *f = fc_link_frame(l, i);
        size_t done = f->done;
        if (done < f->head_len) {
            size_t k = f->head_len - done < room - n ? f->head_len - done : room - n;
            memcpy(dst + n, fc_frame_head(f) + done, k);
            n += (uint32_t)k;
            done += k;
        }
        size_t pdone = done - f->head_len;
        if (done >= f->head_len && pdone < f->payload_len && n < room) {
            size_t k = f->payload_len - pdone < room - n ? f->payload_len - pdone : room - n;
            memcpy(dst + n, f->payload + pdone, k);
            n += (uint32_t)k;
        }
    }
    return n;
}

/* A message went out: if the peer said it sleeps, wake it (once; it says so again next time).
 * The completions are taken first: a peer that fell asleep after looking for this message posted
 * its notice before, so it is seen here (as in the rings' sleep flags, one of the two sides sees
 * the other: the sleeper looks once more after its notice). */
static void sent_one(fc_link *l)
{
    fc_verbs *v = st(l);
    fc_verbs_drain(l);
    if (v->peer_asleep && say_on_socket(l, BELL_MAGIC, 0) == 0)
        v->peer_asleep = 0;
}

int fc_verbs_send_data(fc_link *l)
{
    fc_verbs *v = st(l);
    int sent = 0;
    while (l->out_count && v->credits >= 2 && v->tx_posted - v->tx_done < FC_VERBS_TX_SLOTS) {
        uint32_t idx = (uint32_t)(v->tx_posted % FC_VERBS_TX_SLOTS);
        uint8_t *buf = v->q.tx_mem + (size_t)idx * FC_VERBS_SLOT_BYTES;
        uint32_t n = gather(l, buf + FC_VERBS_HEAD, v->max_payload);
        if (!n)
            break;
        header(v, buf, n, 0);
        int rc = fc_verbs_post_send(&v->q, buf, FC_VERBS_HEAD + n, (uint64_t)FC_WR_SEND << 32 | idx);
        if (rc) {
            fc_verbs_fail(l, 1, EIO, "posting a send on the RDMA link failed (error %d)", rc);
            return -1;
        }
        v->seq++, v->credits--, v->owed = 0;
        v->tx_len[idx] = n;
        v->tx_posted++;
        fc_link_written(l, n);
        sent = 1;
    }
    if (sent)
        sent_one(l);
    return sent;
}

/* A credit-only message (with `flags`), if one can go now: 1 sent, 0 not. */
static int send_credit_frame(fc_link *l, uint32_t flags)
{
    fc_verbs *v = st(l);
    if (v->credits < 1 || v->cx_posted - v->cx_done >= FC_VERBS_CTL || l->send_errno)
        return 0;
    uint32_t idx = (uint32_t)(v->cx_posted % FC_VERBS_CTL);
    uint8_t *buf = v->q.tx_mem + (size_t)FC_VERBS_TX_SLOTS * FC_VERBS_SLOT_BYTES + (size_t)idx * FC_VERBS_CTL_BYTES;
    header(v, buf, 0, flags);
    int rc = fc_verbs_post_send(&v->q, buf, FC_VERBS_HEAD, (uint64_t)FC_WR_CTL << 32 | idx);
    if (rc) {
        fc_verbs_fail(l, 1, EIO, "posting a send on the RDMA link failed (error %d)", rc);
        return 0;
    }
    v->seq++, v->credits--, v->owed = 0;
    v->cx_posted++;
    sent_one(l);
    return 1;
}

void fc_verbs_settle(fc_link *l)
{
    fc_verbs *v = st(l);
    flush_socket(l);
    if (!v->owed || l->send_errno)
        return;
    int starving = v->count + v->owed + 2 > FC_VERBS_RX_SLOTS; /* the peer may hold fewer than 2 */
    /* Everything taken: the engine may make no call here for long, so the peer's window is left
     * short by no more than an eighth (a few credits still go with the next frame). */
    int idle = v->count == 0 && v->owed >= FC_VERBS_RX_SLOTS / 8;
    if (!starving && !idle && v->owed < FC_VERBS_RX_SLOTS / 2)
        return; /* they go with the next frame */
    if (!send_credit_frame(l, 0) && say_on_socket(l, CREDIT_MAGIC, v->owed) == 0)
        v->owed = 0;
}

void fc_verbs_announce_sleep(fc_link *l)
{
    fc_verbs *v = st(l);
    if (!v->announced && send_credit_frame(l, FC_VERBS_ASLEEP))
        v->announced = 1;
}

/* Bytes read from the socket: whole messages are taken (credits counted, bells only woke this
 * side). 0, or -1 (the link failed). */
static int socket_bytes(fc_link *l, const uint8_t *p, size_t n)
{
    fc_verbs *v = st(l);
    for (size_t i = 0; i < n; i++) {
        v->sock_in[v->sock_in_len++] = p[i];
        if (v->sock_in_len < SOCK_MSG)
            continue;
        v->sock_in_len = 0;
        uint32_t c = fc_get32(v->sock_in + 4);
        int bell = memcmp(v->sock_in, BELL_MAGIC, 4) == 0 && c == 0;
        if (!bell && (memcmp(v->sock_in, CREDIT_MAGIC, 4) != 0 || c > v->peer_slots - v->credits)) {
            fc_verbs_fail(l, 0, EPROTO, "the peer sent something other than credits or a bell on the RDMA link's "
                          "socket");
            return -1;
        }
        v->credits += c;
        v->sock_credits += !bell;
    }
    return 0;
}

int fc_verbs_read_socket(fc_link *l)
{
    uint8_t buf[256];
    for (;;) {
        ssize_t k = recv(l->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k > 0) {
            if (socket_bytes(l, buf, (size_t)k))
                return -1;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        fc_verbs_drain(l); /* (what the peer sent before it went is read first) */
        l->eof = 1;        /* an orderly end or a reset: the peer is gone either way */
        return -1;
    }
}
