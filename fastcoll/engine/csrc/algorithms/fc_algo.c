/* The algorithm registry, the call primitives the algorithms share, and block arithmetic. */
#include "fc_algo.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "reduce/fc_reduce.h"

/* The registry: one entry an algorithm, indexed by enum fc_algo_id. */
static const fc_algorithm *const ALGORITHMS[FC_A_COUNT] = {
    [FC_A_DIRECT] = &fc_algo_direct,
    [FC_A_DOUBLING] = &fc_algo_doubling,
    [FC_A_RING] = &fc_algo_ring,
    [FC_A_PAIRWISE] = &fc_algo_pairwise,
    [FC_A_CHAIN] = &fc_algo_chain,
};

/* The largest piece any message carries (fastcoll/wire.py's MAX_PIECE_BYTES). */
#define MAX_PIECE_BYTES ((size_t)4 << 20)

int fc_can_run(int algo, int kind)
{
    return algo >= 0 && algo < FC_A_COUNT && kind >= 0 && kind < FC_K_COUNT && ALGORITHMS[algo]->run[kind];
}

/* The bytes a call moves, as the engine's waits weigh it (fc_engine.h: call_bytes). */
static size_t op_bytes(const fc_op *op)
{
    size_t items = op->src_count > op->dst_count ? op->src_count : op->dst_count;
    size_t size = op->itemsize ? op->itemsize : 1;
    return items > SIZE_MAX / size ? SIZE_MAX : items * size;
}

int fc_run(fc_call *c, const fc_op *op)
{
    if (!fc_can_run(op->algo, op->kind)) {
        fc_err_set(c->err, FC_E_INTERNAL, -1);
        fc_err_text(c->err, "no such algorithm for this collective", 37);
        return -1;
    }
    c->itemsize = op->itemsize ? op->itemsize : 1;
    fc_op local = *op;
    if (op->kind == FC_K_ALL_GATHER && op->src && op->src_count) /* this rank's block, in place */
        memcpy(FC_AT(op->dst, op->bounds[2 * c->rank], c->itemsize), op->src, op->src_count * c->itemsize);
    if (op->kind == FC_K_BROADCAST && !op->dst) { /* the root only reads its buffer */
        local.dst = (uint8_t *)op->src;
        local.dst_count = op->src_count;
    }
    fc_engine_call_begin(c->e, op->kind, op_bytes(&local));
    int agreeing = fc_agree_needed(op);
    int rc = agreeing && fc_agree_begin(c, &local) ? -1 : ALGORITHMS[op->algo]->run[op->kind](c, &local);
    if (agreeing && fc_agree_end(c, !rc))
        rc = -1;
    fc_engine_call_end(c->e);
    if (rc)
        return -1;
    int reduced = op->kind == FC_K_ALL_REDUCE || op->kind == FC_K_REDUCE_SCATTER || op->kind == FC_K_REDUCE;
    if (reduced && op->redop == FC_MEAN && op->dst)
        fc_finish_mean(op->dtype, op->dst, op->dst_count, c->size);
    return 0;
}

int fc_send(fc_call *c, int peer, int64_t chunk, const uint8_t *p, size_t count)
{
    if (c->trace)
        return fc_trace_send(c, peer, chunk, p, count);
    return fc_engine_send(c->e, c->ranks[peer], FC_DATA, c->seq, c->sig, c->sig_len, chunk, p,
                          count * c->itemsize, c->err);
}

int fc_recv(fc_call *c, int peer, int64_t chunk, uint8_t *p, size_t count)
{
    /* every peer's agreement before this rank waits on any: one left unread would be held ahead of
     * what that peer says next, a timeout's notice included, while this rank waits on another */
    if (c->owed && fc_agree_take_all(c))
        return -1;
    if (c->trace)
        return fc_trace_recv(c, c->ranks[peer], c->sig, c->sig_len, chunk, p, count * c->itemsize);
    return fc_engine_recv(c->e, c->ranks[peer], c->seq, c->sig, c->sig_len, chunk, p, count * c->itemsize,
                          c->deadline, c->err);
}

int fc_flush(fc_call *c)
{
    /* every peer's agreement first: two ranks that both think themselves a broadcast's root
     * would otherwise wait for each other to take more than a link holds */
    if (c->owed && fc_agree_take_all(c)) {
        /* a peer that neither said what it calls nor took this rank's data: the stuck send is
         * the news (a broadcast's root with a receiver that stopped) */
        if (c->err->code == FC_E_TIMEOUT_WAIT) {
            int peer = c->err->peer;
            int64_t idle = c->err->n[0];
            if (!fc_engine_flush(c->e, c->deadline, c->err)) {
                fc_err_set(c->err, FC_E_TIMEOUT_WAIT, peer);
                c->err->n[0] = idle;
            }
        }
        return -1;
    }
    return c->trace ? fc_trace_flush(c) : fc_engine_flush(c->e, c->deadline, c->err);
}

size_t fc_piece_items(const fc_call *c)
{
    size_t bytes = c->piece_bytes < MAX_PIECE_BYTES ? c->piece_bytes : MAX_PIECE_BYTES;
    size_t items = bytes / (c->itemsize ? c->itemsize : 1);
    return items ? items : 1;
}

/* out = a op b through a user op, which reduces in place: into whichever of a and b is out. */
static void combine_user(const fc_op *op, const uint8_t *a, const uint8_t *b, uint8_t *out, size_t count)
{
    size_t size = op->itemsize ? op->itemsize : 1;
    const uint8_t *in = a;
    if (out == a) /* commutative: a op b == b op a */
        in = b;
    else if (out != b)
        memmove(out, b, count * size);
    for (size_t done = 0; done < count;) { /* the op counts in int */
        size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        int len = (int)n;
        void *type = op->user_type;
        op->user((void *)FC_AT(in, done, size), FC_AT(out, done, size), &len, &type);
        done += n;
    }
}

void fc_combine(fc_call *c, const fc_op *op, const uint8_t *a, const uint8_t *b, uint8_t *out, size_t count)
{
    fc_ns start = c->trace ? fc_now() : 0;
    if (op->user)
        combine_user(op, a, b, out, count);
    else
        fc_reduce(op->dtype, op->redop, a, b, out, count);
    if (c->trace)
        fc_trace_note(c->trace, FC_P_REDUCE, -1, count * c->itemsize, start);
}

void *fc_scratch(fc_call *c, size_t bytes)
{
    void *p = fc_scratch_alloc(bytes ? bytes : 1);
    if (!p)
        fc_err_set(c->err, FC_E_NOMEM, -1);
    return p;
}

void fc_block(size_t n, int parts, int i, int64_t *a, int64_t *b)
{
    size_t base = n / (size_t)parts, extra = n % (size_t)parts, k = (size_t)i;
    *a = (int64_t)(k * base + (k < extra ? k : extra));
    *b = *a + (int64_t)(base + (k < extra ? 1 : 0));
}

size_t fc_piece_count(int64_t a, int64_t b, size_t step)
{
    size_t n = (size_t)(b - a);
    return n ? (n + step - 1) / step : 1;
}

void fc_piece(int64_t a, int64_t b, size_t step, size_t k, int64_t *pa, int64_t *pb)
{
    *pa = a + (int64_t)(k * step);
    *pb = *pa + (int64_t)step < b ? *pa + (int64_t)step : b;
    if (*pa > b)
        *pa = *pb = b;
}
