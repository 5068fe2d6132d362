/* Pairwise exchange for large all_to_all (the native engine's alone): n - 1 steps; at step
 * s rank r sends its block for r + s and receives the block of r - s, piece by piece, interleaved.
 * The messages are the direct exchange's (each block in pieces numbered from 0). */
#include <string.h>

#include "fc_algo.h"

static int step_pieces(fc_call *c, const fc_op *op, int dst, int from)
{
    size_t step = fc_piece_items(c), isz = c->itemsize;
    const int64_t *sb = op->bounds + 2 * dst, *rb = op->recv_bounds + 2 * from;
    size_t out = fc_piece_count(sb[0], sb[1], step), in = fc_piece_count(rb[0], rb[1], step);
    for (size_t k = 0; k < out || k < in; k++) {
        int64_t pa, pb;
        if (k < out) {
            fc_piece(sb[0], sb[1], step, k, &pa, &pb);
            if (fc_send(c, dst, (int64_t)k, FC_AT(op->src, pa, isz), (size_t)(pb - pa)))
                return -1;
        }
        if (k < in) {
            fc_piece(rb[0], rb[1], step, k, &pa, &pb);
            if (fc_recv(c, from, (int64_t)k, FC_AT(op->dst, pa, isz), (size_t)(pb - pa)))
                return -1;
        }
    }
    return 0;
}

static int all_to_all(fc_call *c, const fc_op *op)
{
    int n = c->size, r = c->rank;
    const int64_t *sb = op->bounds, *rb = op->recv_bounds;
    if (sb[2 * r + 1] - sb[2 * r] != rb[2 * r + 1] - rb[2 * r]) {
        fc_err_set(c->err, FC_E_INTERNAL, -1);
        fc_err_text(c->err, "this rank's own block is not as long as the block it receives from itself", 73);
        return -1;
    }
    memmove(FC_AT(op->dst, rb[2 * r], c->itemsize), FC_AT(op->src, sb[2 * r], c->itemsize),
            (size_t)(sb[2 * r + 1] - sb[2 * r]) * c->itemsize);
    for (int s = 1; s < n; s++)
        if (step_pieces(c, op, (r + s) % n, (r - s + n) % n))
            return -1;
    return fc_flush(c);
}

const fc_algorithm fc_algo_pairwise = {"pairwise", {[FC_K_ALL_TO_ALL] = all_to_all}};
