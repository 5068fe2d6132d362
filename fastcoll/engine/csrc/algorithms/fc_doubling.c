/* Recursive doubling and halving (the native engine's alone) for 4, 8, 16 ... ranks:
 * log2(n) exchanges with one partner each; contributions combined lower block first. */
#include <stdlib.h>
#include <string.h>

#include "fc_algo.h"

/* The element range of blocks first .. first + count - 1. */
static void span(const int64_t *bounds, int first, int count, int64_t *a, int64_t *b)
{
    *a = bounds[2 * first];
    *b = bounds[2 * (first + count - 1) + 1];
}

static int all_reduce(fc_call *c, const fc_op *op)
{
    size_t count = op->src_count, bytes = count * c->itemsize;
    int r = c->rank;
    memcpy(op->dst, op->src, bytes);
    uint8_t *theirs = fc_scratch(c, bytes);
    if (!theirs)
        return -1;
    int rc = 0;
    for (int d = 1, step = 0; d < c->size && !rc; d <<= 1, step++) {
        int p = r ^ d;
        rc = fc_send(c, p, step, op->dst, count) || fc_recv(c, p, step, theirs, count) || fc_flush(c);
        if (!rc && r < p)
            fc_combine(c, op, op->dst, theirs, op->dst, count);
        else if (!rc)
            fc_combine(c, op, theirs, op->dst, op->dst, count);
    }
    fc_scratch_free(theirs);
    return rc ? -1 : 0;
}

static int all_gather(fc_call *c, const fc_op *op)
{
    int r = c->rank;
    for (int d = 1, step = 0; d < c->size; d <<= 1, step++) {
        int p = r ^ d;
        int64_t a, b, pa, pb;
        span(op->bounds, r & ~(d - 1), d, &a, &b);
        span(op->bounds, p & ~(d - 1), d, &pa, &pb);
        if (fc_send(c, p, step, FC_AT(op->dst, a, c->itemsize), (size_t)(b - a)) ||
            fc_recv(c, p, step, FC_AT(op->dst, pa, c->itemsize), (size_t)(pb - pa)))
            return -1;
    }
    return fc_flush(c);
}

/* Recursive halving: at each step keep the half of the range that holds this rank's block, send
 * the other half, and combine the partner's copy of the kept half into a buffer of its own. */
static int reduce_scatter(fc_call *c, const fc_op *op)
{
    int r = c->rank, first = 0;
    int64_t base = 0, ka, kb, ga, gb;
    span(op->bounds, 0, c->size / 2, &ka, &kb);
    span(op->bounds, c->size / 2, c->size / 2, &ga, &gb);
    size_t most = (size_t)((kb - ka) > (gb - ga) ? (kb - ka) : (gb - ga)) * c->itemsize;
    uint8_t *theirs = fc_scratch(c, most), *kept[2] = {fc_scratch(c, most), fc_scratch(c, most)};
    const uint8_t *work = op->src;
    int rc = !theirs || !kept[0] || !kept[1];
    for (int d = c->size >> 1, step = 0; d && !rc; d >>= 1, step++) {
        int p = r ^ d;
        int keep = (r & d) == 0 ? first : first + d, give = keep == first ? first + d : first;
        span(op->bounds, keep, d, &ka, &kb);
        span(op->bounds, give, d, &ga, &gb);
        size_t n = (size_t)(kb - ka);
        rc = fc_send(c, p, step, FC_AT(work, ga - base, c->itemsize), (size_t)(gb - ga)) ||
             fc_recv(c, p, step, theirs, n) || fc_flush(c);
        if (rc)
            break;
        const uint8_t *mine = FC_AT(work, ka - base, c->itemsize);
        uint8_t *into = kept[step & 1];
        if (r < p)
            fc_combine(c, op, mine, theirs, into, n);
        else
            fc_combine(c, op, theirs, mine, into, n);
        work = into;
        base = ka;
        first = keep;
    }
    if (!rc)
        memcpy(op->dst, work, op->dst_count * c->itemsize);
    fc_scratch_free(theirs);
    fc_scratch_free(kept[0]);
    fc_scratch_free(kept[1]);
    return rc ? -1 : 0;
}

const fc_algorithm fc_algo_doubling = {
    "doubling",
    {
        [FC_K_ALL_REDUCE] = all_reduce,
        [FC_K_ALL_GATHER] = all_gather,
        [FC_K_REDUCE_SCATTER] = reduce_scatter,
    },
};
