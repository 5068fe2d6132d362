/* The verbs link: an ordered, reliable byte stream over RDMA messages (fc_verbs.h says how), with
 * the TCP socket kept beside it for the job's life. It carries the credits that could not go as
 * messages, the bells that wake a side asleep in poll() (which nothing arriving over verbs can
 * do: a wait on this link naps 1 ms at most where no bell comes), and, when the peer exits, the
 * end of the stream, which is how its death is seen: an unreliable connection reports nothing
 * when its peer dies. */
#include "fc_verbs.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline fc_verbs *st(fc_link *l)
{
    return (fc_verbs *)l->state;
}

/* Post every receive, trade addresses with the peer, bring the queue pair up, and say ready. */
static int connect_peer(fc_link *l, fc_ns deadline, double secs, char *why, size_t why_len)
{
    fc_verbs *v = st(l);
    if (fc_verbs_qp_init(&v->q, why, why_len))
        return -1;
    for (uint32_t s = 0; s < FC_VERBS_RX_SLOTS; s++) {
        int rc = fc_verbs_post_recv(&v->q, s);
        if (rc) {
            snprintf(why, why_len, "could not post receives on the RDMA device %s (error %d)", v->q.device, rc);
            return -1;
        }
    }
    fc_verbs_addr peer;
    /* (the peer sends nothing before this side's ready, which follows RTR: no message is dropped
     * for want of a queue pair that can take it) */
    if (fc_verbs_exchange(l->fd, &v->q.me, &peer, deadline, secs, why, why_len) ||
        fc_verbs_qp_connect(&v->q, &peer, why, why_len) || fc_verbs_ready(l->fd, deadline, secs, why, why_len))
        return -1;
    uint32_t slot = peer.slot_bytes < FC_VERBS_SLOT_BYTES ? peer.slot_bytes : FC_VERBS_SLOT_BYTES;
    v->peer_slots = peer.slots;
    v->credits = peer.slots;
    v->max_payload = slot - FC_VERBS_HEAD;
    snprintf(v->detail, sizeof v->detail, "%s, %s, MTU %d", v->q.device, v->q.reliable ? "RC" : "UC",
             128 << v->q.path_mtu);
    return 0;
}

static int verbs_open(fc_link *l, const fc_link_params *p, char *why, size_t why_len)
{
    int one = 1; /* a bell must leave at once, not wait behind the last one's acknowledgement (Nagle) */
    (void)setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* (not TCP: nothing to do) */
    const fc_verbs_lib *lib = fc_verbs_load(p->library, why, why_len);
    if (!lib)
        return -1;
    fc_verbs *v = calloc(1, sizeof *v);
    if (!v) {
        snprintf(why, why_len, "out of memory for the RDMA link");
        return -1;
    }
    int64_t budget = p->setup_ns > 0 ? p->setup_ns : 0;
    fc_ns deadline = fc_now() + budget;
    if (fc_verbs_qp_open(&v->q, lib, p->device, p->reliable, why, why_len)) {
        free(v);
        return -1;
    }
    v->same_host = p->same_host;
    v->peer_cpu = -1;
    l->state = v;
    if (connect_peer(l, deadline, (double)budget / 1e9, why, why_len)) {
        fc_verbs_qp_close(&v->q);
        free(v);
        l->state = NULL;
        return -1;
    }
    return 0;
}

static void verbs_close(fc_link *l)
{
    fc_verbs *v = st(l);
    if (!v)
        return;
    fc_verbs_qp_close(&v->q); /* the queue pair first: nothing lands in the buffers after */
    free(v);
}

static int verbs_push(fc_link *l)
{
    fc_verbs *v = st(l);
    if (l->eof) {
        l->send_errno = EPIPE; /* the peer's end of the stream came: it reads no more */
        return -1;
    }
    fc_verbs_drain(l); /* (send slots and credits come back here) */
    if (v->credits < 2 && fc_verbs_read_socket(l) < 0 && !l->send_errno)
        l->send_errno = EPIPE;
    if (l->send_errno)
        return -1;
    return fc_verbs_send_data(l);
}

static int verbs_pull(fc_link *l)
{
    int got = fc_verbs_drain(l);
    fc_verbs_settle(l);
    return got < 0 ? -1 : got > 0;
}

static int verbs_wake(fc_link *l)
{
    if (fc_verbs_read_socket(l) == 0)
        return 0;
    if (l->out_count && !l->send_errno) { /* nobody will take what waits to go out */
        l->send_errno = EPIPE;
        fc_link_drop_all(l);
    }
    return -1;
}

static size_t verbs_have(fc_link *l)
{
    return st(l)->avail;
}

static const uint8_t *slot_data(const fc_verbs *v, uint32_t slot)
{
    return v->q.rx_mem + (size_t)slot * FC_VERBS_SLOT_BYTES + FC_VERBS_HEAD;
}

static void verbs_peek(fc_link *l, void *dst, size_t n, size_t off)
{
    fc_verbs *v = st(l);
    uint8_t *out = dst;
    size_t skip = off + v->first_off;
    for (uint32_t i = 0; i < v->count && n; i++) {
        uint32_t slot = v->arrived[(v->first + i) % FC_VERBS_RX_SLOTS];
        size_t len = v->arrived_len[slot];
        if (skip >= len) {
            skip -= len;
            continue;
        }
        size_t k = len - skip < n ? len - skip : n;
        memcpy(out, slot_data(v, slot) + skip, k);
        out += k;
        n -= k;
        skip = 0;
    }
}

static size_t verbs_take(fc_link *l, void *dst, size_t n)
{
    fc_verbs *v = st(l);
    uint8_t *out = dst;
    size_t got = 0;
    while (got < n && v->count) {
        uint32_t slot = v->arrived[v->first];
        size_t left = v->arrived_len[slot] - v->first_off;
        size_t k = left < n - got ? left : n - got;
        if (out)
            memcpy(out + got, slot_data(v, slot) + v->first_off, k);
        got += k;
        v->first_off += (uint32_t)k;
        v->avail -= k;
        if (v->first_off == v->arrived_len[slot]) { /* the slot is empty: it takes the next frame */
            v->first = (v->first + 1) % FC_VERBS_RX_SLOTS;
            v->count--;
            v->first_off = 0;
            fc_verbs_repost(l, slot);
        }
    }
    if (got)
        fc_verbs_settle(l);
    return got;
}

static int verbs_may_sleep(fc_link *l)
{
    fc_verbs_drain(l);
    fc_verbs_settle(l);
    if (st(l)->avail || l->recv_errno)
        return 0;
    fc_verbs_announce_sleep(l);
    fc_verbs_drain(l); /* (what came before the notice reached the peer rings no bell) */
    return st(l)->avail == 0 && !l->recv_errno;
}

static int can_send(const fc_verbs *v)
{
    return v->credits >= 2 && v->tx_posted - v->tx_done < FC_VERBS_TX_SLOTS;
}

static int verbs_wait_room(fc_link *l)
{
    fc_verbs_drain(l);
    fc_verbs_settle(l);
    if (can_send(st(l)) || l->send_errno)
        return 0;
    if (fc_verbs_read_socket(l) < 0)
        return 0; /* the peer is gone: the next push says so */
    if (can_send(st(l)))
        return 0;
    fc_verbs_announce_sleep(l); /* (the credits that come back ring) */
    return 1;
}

static size_t verbs_in_flight(fc_link *l)
{
    fc_verbs *v = st(l);
    fc_verbs_drain(l);
    size_t n = v->sock_out_len + (size_t)(v->cx_posted - v->cx_done) * FC_VERBS_HEAD;
    for (uint64_t i = v->tx_done; i < v->tx_posted; i++)
        n += FC_VERBS_HEAD + v->tx_len[i % FC_VERBS_TX_SLOTS];
    return n;
}

/* Only toward a peer on this machine: another machine's CPU 3 is not this one's. */
static void verbs_say_cpu(fc_link *l, int cpu)
{
    fc_verbs *v = st(l);
    if (v->same_host && cpu >= 0 && (uint32_t)cpu < FC_VERBS_MAX_CPU)
        v->my_cpu = (uint32_t)cpu + 1;
}

static int verbs_peer_cpu(fc_link *l)
{
    return st(l)->peer_cpu;
}

static void verbs_describe(fc_link *l, char *out, size_t len)
{
    snprintf(out, len, "%s", st(l)->detail);
}

const fc_link_kind fc_link_verbs = {
    .name = "verbs",
    .open = verbs_open,
    .close = verbs_close,
    .push = verbs_push,
    .pull = verbs_pull,
    .wake = verbs_wake,
    .have = verbs_have,
    .peek = verbs_peek,
    .take = verbs_take,
    .may_sleep = verbs_may_sleep,
    .wait_room = verbs_wait_room,
    .room_event = POLLIN, /* bells, credits that could not go as messages, the end of the stream */
    .nap_ms = 1,          /* an arrival whose bell did not come (a notice that crossed it) */
    .in_flight = verbs_in_flight,
    .say_cpu = verbs_say_cpu,
    .peer_cpu = verbs_peer_cpu,
    .describe = verbs_describe,
};
