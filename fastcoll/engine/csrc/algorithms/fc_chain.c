/* A pipelined chain for large rooted reductions (the native engine's alone): root+1 -> root+2
 * -> ... -> root; each rank adds its contribution to a piece and forwards it at once. */
#include <stdlib.h>

#include "fc_algo.h"

static int reduce(fc_call *c, const fc_op *op)
{
    int n = c->size, r = c->rank, root = op->root;
    int pos = ((r - root - 1) % n + n) % n; /* 0 starts the chain, n - 1 is the root */
    int prev = (r - 1 + n) % n, next = (r + 1) % n;
    size_t step = fc_piece_items(c), isz = c->itemsize, count = op->src_count;
    size_t np = fc_piece_count(0, (int64_t)count, step);
    int64_t pa, pb;
    if (pos == 0) {
        for (size_t k = 0; k < np; k++) {
            fc_piece(0, (int64_t)count, step, k, &pa, &pb);
            if (fc_send(c, next, (int64_t)k, FC_AT(op->src, pa, isz), (size_t)(pb - pa)))
                return -1;
        }
        return fc_flush(c);
    }
    /* a piece sent on must stay unchanged until flushed: partial sums get a buffer of their own */
    uint8_t *acc = r == root ? op->dst : fc_scratch(c, count * isz);
    uint8_t *tmp = fc_scratch(c, (step < count ? step : (count ? count : 1)) * isz);
    int rc = !acc || !tmp;
    for (size_t k = 0; k < np && !rc; k++) {
        fc_piece(0, (int64_t)count, step, k, &pa, &pb);
        rc = fc_recv(c, prev, (int64_t)k, tmp, (size_t)(pb - pa));
        if (rc)
            break;
        fc_combine(c, op, tmp, FC_AT(op->src, pa, isz), FC_AT(acc, pa, isz), (size_t)(pb - pa));
        if (r != root)
            rc = fc_send(c, next, (int64_t)k, FC_AT(acc, pa, isz), (size_t)(pb - pa));
    }
    if (!rc)
        rc = fc_flush(c);
    if (r != root)
        fc_scratch_free(acc);
    fc_scratch_free(tmp);
    return rc ? -1 : 0;
}

const fc_algorithm fc_algo_chain = {"chain", {[FC_K_REDUCE] = reduce}};
