/* Direct exchange: one hop from every rank to every other, each buffer whole.
 * Latency-optimal for small messages; contributions are combined in rank order. */
#include <stdlib.h>
#include <string.h>

#include "fc_algo.h"

#define EACH_PEER(c, p) for (int p = 0; p < (c)->size; p++) if (p != (c)->rank)

/* Every rank's contribution of `count` elements, own at parts[rank] (not copied): receive
 * them (message 0 from each peer) into `store`. */
static int receive_all(fc_call *c, const uint8_t *own, size_t count, const uint8_t **parts, uint8_t *store)
{
    size_t bytes = count * c->itemsize;
    EACH_PEER(c, p) {
        parts[p] = store + (size_t)p * bytes;
        if (fc_recv(c, p, 0, store + (size_t)p * bytes, count))
            return -1;
    }
    parts[c->rank] = own;
    return 0;
}

/* out = parts[0] op parts[1] op ... in rank order. */
static void combine_in_order(fc_call *c, const fc_op *op, const uint8_t **parts, uint8_t *out, size_t count)
{
    if (c->size == 1) {
        memmove(out, parts[0], count * c->itemsize);
        return;
    }
    fc_combine(c, op, parts[0], parts[1], out, count);
    for (int p = 2; p < c->size; p++)
        fc_combine(c, op, out, parts[p], out, count);
}

/* Every rank's contribution (this rank's is `own`) received, then (with `flush`, once this rank's own sends have left)
 * combined in rank order into op->dst. */
static int combine_all(fc_call *c, const fc_op *op, const uint8_t *own, size_t count, int flush)
{
    const uint8_t **parts = calloc((size_t)c->size, sizeof *parts);
    uint8_t *store = fc_scratch(c, (size_t)c->size * count * c->itemsize);
    int rc = -1;
    if (parts && store && !receive_all(c, own, count, parts, store) && !(flush && fc_flush(c))) {
        combine_in_order(c, op, parts, op->dst, count);
        rc = 0;
    }
    if (!parts)
        fc_err_set(c->err, FC_E_NOMEM, -1);
    free(parts);
    fc_scratch_free(store);
    return rc;
}

static int all_reduce(fc_call *c, const fc_op *op)
{
    size_t count = op->src_count;
    EACH_PEER(c, p) if (fc_send(c, p, 0, op->src, count)) return -1;
    if (c->size == 2) { /* the common case: x0 op x1 on both ranks, without a stack */
        int peer = 1 - c->rank;
        if (fc_recv(c, peer, 0, op->dst, count) || fc_flush(c))
            return -1;
        if (c->rank == 0)
            fc_combine(c, op, op->src, op->dst, op->dst, count);
        else
            fc_combine(c, op, op->dst, op->src, op->dst, count);
        return 0;
    }
    return combine_all(c, op, op->src, count, 1);
}

static int all_gather(fc_call *c, const fc_op *op)
{
    const int64_t *b = op->bounds;
    int r = c->rank;
    EACH_PEER(c, p) {
        if (fc_send(c, p, 0, FC_AT(op->dst, b[2 * r], c->itemsize), (size_t)(b[2 * r + 1] - b[2 * r])))
            return -1;
    }
    EACH_PEER(c, p) {
        if (fc_recv(c, p, 0, FC_AT(op->dst, b[2 * p], c->itemsize), (size_t)(b[2 * p + 1] - b[2 * p])))
            return -1;
    }
    return fc_flush(c);
}

static int reduce_scatter(fc_call *c, const fc_op *op)
{
    const int64_t *b = op->bounds;
    int r = c->rank;
    EACH_PEER(c, p) {
        if (fc_send(c, p, 0, FC_AT(op->src, b[2 * p], c->itemsize), (size_t)(b[2 * p + 1] - b[2 * p])))
            return -1;
    }
    return combine_all(c, op, FC_AT(op->src, b[2 * r], c->itemsize), (size_t)(b[2 * r + 1] - b[2 * r]), 1);
}

static int broadcast(fc_call *c, const fc_op *op)
{
    if (c->rank != op->root)
        return fc_recv(c, op->root, 0, op->dst, op->dst_count);
    EACH_PEER(c, p) if (fc_send(c, p, 0, op->dst, op->dst_count)) return -1;
    return fc_flush(c);
}

static int barrier(fc_call *c, const fc_op *op)
{
    (void)op;
    EACH_PEER(c, p) if (fc_send(c, p, 0, NULL, 0)) return -1;
    EACH_PEER(c, p) if (fc_recv(c, p, 0, NULL, 0)) return -1;
    return fc_flush(c);
}

/* Block [a, b) of `buf` in pieces of piece_items, to or from `peer`, numbered from 0. */
static int send_pieces(fc_call *c, int peer, const uint8_t *buf, int64_t a, int64_t b)
{
    size_t step = fc_piece_items(c), n = fc_piece_count(a, b, step);
    for (size_t k = 0; k < n; k++) {
        int64_t pa, pb;
        fc_piece(a, b, step, k, &pa, &pb);
        if (fc_send(c, peer, (int64_t)k, FC_AT(buf, pa, c->itemsize), (size_t)(pb - pa)))
            return -1;
    }
    return 0;
}

static int recv_pieces(fc_call *c, int peer, uint8_t *buf, int64_t a, int64_t b)
{
    size_t step = fc_piece_items(c), n = fc_piece_count(a, b, step);
    for (size_t k = 0; k < n; k++) {
        int64_t pa, pb;
        fc_piece(a, b, step, k, &pa, &pb);
        if (fc_recv(c, peer, (int64_t)k, FC_AT(buf, pa, c->itemsize), (size_t)(pb - pa)))
            return -1;
    }
    return 0;
}

/* A rank's own block of an all_to_all stays here: it must be as long as what it "receives". */
static int keep_own(fc_call *c, const uint8_t *src, int64_t a, int64_t b, uint8_t *dst, int64_t ra, int64_t rb)
{
    if (b - a != rb - ra) {
        fc_err_set(c->err, FC_E_INTERNAL, -1);
        fc_err_text(c->err, "this rank's own block is not as long as the block it receives from itself", 73);
        return -1;
    }
    memmove(FC_AT(dst, ra, c->itemsize), FC_AT(src, a, c->itemsize), (size_t)(b - a) * c->itemsize);
    return 0;
}

static int all_to_all(fc_call *c, const fc_op *op)
{
    const int64_t *sb = op->bounds, *rb = op->recv_bounds;
    int r = c->rank;
    if (keep_own(c, op->src, sb[2 * r], sb[2 * r + 1], op->dst, rb[2 * r], rb[2 * r + 1]))
        return -1;
    EACH_PEER(c, p) if (send_pieces(c, p, op->src, sb[2 * p], sb[2 * p + 1])) return -1;
    EACH_PEER(c, p) if (recv_pieces(c, p, op->dst, rb[2 * p], rb[2 * p + 1])) return -1;
    return fc_flush(c);
}

static int gather(fc_call *c, const fc_op *op)
{
    const int64_t *b = op->bounds;
    if (c->rank != op->root)
        return send_pieces(c, op->root, op->src, 0, (int64_t)op->src_count) || fc_flush(c) ? -1 : 0;
    memcpy(FC_AT(op->dst, b[2 * op->root], c->itemsize), op->src, op->src_count * c->itemsize);
    EACH_PEER(c, p) if (recv_pieces(c, p, op->dst, b[2 * p], b[2 * p + 1])) return -1;
    return 0;
}

static int scatter(fc_call *c, const fc_op *op)
{
    const int64_t *b = op->bounds;
    if (c->rank != op->root)
        return recv_pieces(c, op->root, op->dst, 0, (int64_t)op->dst_count);
    EACH_PEER(c, p) if (send_pieces(c, p, op->src, b[2 * p], b[2 * p + 1])) return -1;
    int root = op->root;
    memcpy(op->dst, FC_AT(op->src, b[2 * root], c->itemsize), (size_t)(b[2 * root + 1] - b[2 * root]) * c->itemsize);
    return fc_flush(c);
}

static int reduce(fc_call *c, const fc_op *op)
{
    size_t count = op->src_count;
    if (c->rank != op->root)
        return fc_send(c, op->root, 0, op->src, count) || fc_flush(c) ? -1 : 0;
    return combine_all(c, op, op->src, count, 0);
}

static int send_p2p(fc_call *c, const fc_op *op)
{
    return send_pieces(c, op->root, op->src, 0, (int64_t)op->src_count) || fc_flush(c) ? -1 : 0;
}

static int recv_p2p(fc_call *c, const fc_op *op)
{
    return recv_pieces(c, op->root, op->dst, 0, (int64_t)op->dst_count);
}

const fc_algorithm fc_algo_direct = {
    "direct",
    {
        [FC_K_ALL_REDUCE] = all_reduce,
        [FC_K_ALL_GATHER] = all_gather,
        [FC_K_REDUCE_SCATTER] = reduce_scatter,
        [FC_K_BROADCAST] = broadcast,
        [FC_K_BARRIER] = barrier,
        [FC_K_ALL_TO_ALL] = all_to_all,
        [FC_K_GATHER] = gather,
        [FC_K_SCATTER] = scatter,
        [FC_K_REDUCE] = reduce,
        [FC_K_SEND] = send_p2p,
        [FC_K_RECV] = recv_p2p,
    },
};
