/* The engine's messages: send, flush, and receive with the pure-Python transport's checks. */
#include "fc_engine.h"

#include <errno.h>
#include <string.h>

/* What the link said of its failure, where it says more than an errno (a frame lost on RDMA). */
static void link_why(fc_err *err, const fc_link *l)
{
    if (l->why[0])
        fc_err_text(err, l->why, strnlen(l->why, sizeof l->why));
}

/* A failed link's error: EBADMSG is a peer that wrote something malformed where the link reads
 * it (a shared-memory ring's counters), the rest a connection that failed; the link's why says
 * how. */
static int failure(fc_err *err, const fc_link *l, int err_no, int code, int peer)
{
    fc_err_set(err, err_no == EBADMSG ? FC_E_MALFORMED : code, peer);
    err->sys_errno = err_no;
    link_why(err, l);
    return -1;
}

/* ----- sending ----- */

int fc_engine_send(fc_engine *e, int peer, int kind, int64_t seq, const uint8_t *sig, size_t sig_len,
                   int64_t chunk, const void *payload, size_t n, fc_err *err)
{
    fc_chan *c = fc_chan_of(e, peer, chunk);
    if (!c->open) {
        fc_err_no_link(err, fc_chan_peer(e, c), (int)(c - e->chans) % e->channels);
        return -1;
    }
    if (c->link.send_errno)
        return 0; /* broken: fc_engine_flush reports it, once what the peer said is read */
    uint8_t head[FC_PREFIX + FC_MAX_HEADER];
    size_t len = fc_wire_pack(head, sizeof head, kind, seq, sig, sig_len, chunk, (int64_t)n);
    if (!len) {
        fc_err_set(err, FC_E_INTERNAL, peer);
        fc_err_text(err, "a frame header longer than 4096 bytes", 37);
        return -1;
    }
    if (fc_link_queue(&c->link, head, len, n ? payload : NULL, n)) {
        fc_err_set(err, FC_E_NOMEM, peer);
        return -1;
    }
    fc_link_push(&c->link);
    return 0;
}

static int flushed(fc_engine *e, void *ctx, int *moved, fc_err *err)
{
    (void)ctx, (void)moved, (void)err;
    for (int i = 0; i < e->size * e->channels; i++)
        if (e->chans[i].link.out_count)
            return 0;
    return 1;
}

/* How long (in us) since data last moved both ways between this rank and c's peer: c's bytes
 * going out, and the peer's arriving on any of its channels; -1 where either never moved. Bytes
 * that leave prove nothing by themselves: the kernel's buffers take them from a stopped peer. */
static int64_t both_ways_idle(fc_engine *e, fc_chan *c)
{
    int peer = fc_chan_peer(e, c);
    fc_ns heard = 0;
    for (int ch = 0; ch < e->channels; ch++) {
        fc_ns t = e->chans[peer * e->channels + ch].recv_at;
        heard = t > heard ? t : heard;
    }
    if (!heard || !c->sent_at)
        return -1;
    return (fc_now() - (heard < c->sent_at ? heard : c->sent_at)) / 1000;
}

int fc_engine_flush(fc_engine *e, fc_ns deadline, fc_err *err)
{
    int r = fc_engine_wait(e, flushed, NULL, NULL, deadline, err);
    if (r < 0)
        return -1;
    int n = e->size * e->channels;
    if (r > 0) {
        fc_chan *stuck = NULL;
        for (int i = 0; i < n && !stuck; i++)
            if (e->chans[i].link.out_count)
                stuck = &e->chans[i];
        fc_err_set(err, FC_E_TIMEOUT_SEND, stuck ? fc_chan_peer(e, stuck) : -1);
        err->n[0] = stuck ? both_ways_idle(e, stuck) : -1;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        fc_link *l = &e->chans[i].link;
        if (l->send_errno)
            return failure(err, l, l->send_errno, FC_E_BROKEN, fc_chan_peer(e, &e->chans[i]));
    }
    return 0;
}

/* ----- receiving ----- */

/* The header c->header as the receiver takes it: an ABORT or a CLOSE is an error. */
static int take(fc_engine *e, fc_chan *c, fc_header *h, fc_err *err)
{
    int peer = fc_chan_peer(e, c);
    *h = c->header;
    if (h->kind == FC_ABORT) {
        e->gave_up[peer] = 1;
        fc_err_set(err, FC_E_ABORT, peer);
        err->waiting_for = peer;
        err->n[0] = h->chunk;
        fc_err_text(err, h->sig, h->sig_len);
        return -1;
    }
    if (h->kind == FC_CLOSE) {
        e->finalized[peer] = 1;
        c->watched = 0;
        fc_err_set(err, FC_E_FINALIZED, peer);
        return -1;
    }
    return 0;
}

void fc_chan_lost(fc_engine *e, fc_chan *c, int mid, fc_err *err)
{
    fc_link *l = &c->link;
    int peer = fc_chan_peer(e, c);
    if (l->recv_errno)
        failure(err, l, l->recv_errno, FC_E_CONN, peer);
    else
        fc_err_set(err, mid ? FC_E_CLOSED_MID : FC_E_CLOSED, peer);
}

static int header_step(fc_engine *e, void *ctx, int *moved, fc_err *err)
{
    fc_chan *c = ctx;
    int got = fc_chan_parse(e, c, err);
    if (got)
        return got;
    int pulled = fc_link_pull(&c->link);
    if (pulled > 0) {
        *moved = 1;
        return fc_chan_parse(e, c, err);
    }
    if (pulled < 0) { /* what the peer sent before it closed (an ABORT, a CLOSE) is read first */
        got = fc_chan_parse(e, c, err);
        if (!got)
            fc_chan_lost(e, c, 0, err);
        return got ? got : -1;
    }
    return 0;
}

int fc_engine_next_header(fc_engine *e, int peer, int64_t chunk, fc_ns deadline, fc_header *h, fc_err *err)
{
    fc_chan *c = fc_chan_of(e, peer, chunk);
    if (!c->open) {
        fc_err_no_link(err, fc_chan_peer(e, c), (int)(c - e->chans) % e->channels);
        return -1;
    }
    if (c->lost) { /* (the link's state says how) */
        fc_chan_lost(e, c, 0, err);
        return -1;
    }
    if (c->held) {
        c->held = 0;
        c->watched = 1;
        return take(e, c, h, err);
    }
    if (e->finalized[peer]) {
        fc_err_set(err, FC_E_FINALIZED, peer);
        return -1;
    }
    /* Past the call's limit nothing more is read, ready or not: a call whose every piece is
     * there at once would otherwise never look at the clock. */
    int r = fc_now() >= deadline ? 1 : fc_engine_wait(e, header_step, c, c, deadline, err);
    if (r > 0) {
        fc_err_set(err, FC_E_TIMEOUT_WAIT, peer);
        err->n[0] = c->recv_at ? (fc_now() - c->recv_at) / 1000 : -1; /* since a payload last moved, in us */
        return -1;
    }
    return r < 0 ? -1 : take(e, c, h, err);
}

typedef struct {
    fc_chan *c;
    uint8_t *dst;
    size_t n, done;
    fc_ns moved_at; /* when payload bytes last arrived (or the read began) */
} payload_read;

/* Below this many bytes a payload's rest is read through the buffer (with the next header, in
 * one system call); above it straight into its place. */
#define DIRECT_BYTES 4096

static int payload_step(fc_engine *e, void *ctx, int *moved, fc_err *err)
{
    payload_read *p = ctx;
    fc_link *l = &p->c->link;
    while (p->done < p->n) {
        size_t k = fc_link_take(l, p->dst + p->done, p->n - p->done);
        if (k) {
            p->done += k;
            p->moved_at = p->c->recv_at = fc_now();
            *moved = 1;
            continue;
        }
        ssize_t got; /* nothing buffered: read more (where the data is not on the link's socket,
                        the end of the stream is seen by the sleep's poll and the kind's wake) */
        if (p->n - p->done >= DIRECT_BYTES) {
            got = fc_link_recv_direct(l, p->dst + p->done, p->n - p->done);
        } else {
            int pulled = fc_link_pull(l);
            if (pulled > 0)
                continue;
            got = pulled;
        }
        if (got == 0)
            return 0;
        if (got < 0) {
            fc_chan_lost(e, p->c, 1, err);
            return -1;
        }
        p->done += (size_t)got;
        p->moved_at = p->c->recv_at = fc_now();
        *moved = 1;
    }
    return 1;
}

int fc_engine_read_payload(fc_engine *e, int peer, int64_t chunk, void *dst, size_t n, fc_ns deadline, fc_err *err)
{
    payload_read p = {fc_chan_of(e, peer, chunk), dst, n, 0, fc_now()};
    int r = p.moved_at >= deadline ? 1 : fc_engine_wait(e, payload_step, &p, p.c, deadline, err);
    if (r > 0) {
        fc_err_set(err, FC_E_TIMEOUT_PAYLOAD, peer);
        err->n[0] = (int64_t)p.done;
        err->n[1] = (int64_t)n;
        err->n[2] = (fc_now() - p.moved_at) / 1000; /* how long nothing had arrived, in us */
        return -1;
    }
    return r;
}

void fc_engine_keep_unread(fc_engine *e, int peer, int64_t chunk)
{
    fc_chan *c = fc_chan_of(e, peer, chunk);
    c->held = 1; /* its payload, if any, is the link's next bytes */
    c->watched = 0;
}

int fc_engine_recv_header(fc_engine *e, int peer, int64_t seq, const uint8_t *sig, size_t sig_len, int64_t chunk,
                          size_t n, fc_ns deadline, fc_err *err)
{
    fc_header h;
    if (fc_engine_next_header(e, peer, chunk, deadline, &h, err))
        return -1;
    if (h.seq != seq || h.sig_len != sig_len || (sig_len && memcmp(h.sig, sig, sig_len))) {
        fc_err_set(err, FC_E_MISMATCH_CALL, peer);
        err->n[0] = h.seq;
        fc_err_text(err, h.sig, h.sig_len);
        return -1;
    }
    if (h.chunk != chunk || h.nbytes != (int64_t)n) {
        fc_err_set(err, FC_E_MISMATCH_CHUNK, peer);
        err->n[0] = chunk;
        err->n[1] = (int64_t)n;
        err->n[2] = h.chunk;
        err->n[3] = h.nbytes;
        return -1;
    }
    return 0;
}

int fc_engine_recv(fc_engine *e, int peer, int64_t seq, const uint8_t *sig, size_t sig_len, int64_t chunk,
                   void *dst, size_t n, fc_ns deadline, fc_err *err)
{
    if (fc_engine_recv_header(e, peer, seq, sig, sig_len, chunk, n, deadline, err))
        return -1;
    return n ? fc_engine_read_payload(e, peer, chunk, dst, n, deadline, err) : 0;
}
