/* Ring algorithms (the native engine's alone), pipelined in pieces: bandwidth-optimal for large
 * messages. Each rank sends only to its right neighbour and receives only from its left one; a
 * piece is forwarded as soon as it has been received (and reduced). */
#include <stdlib.h>
#include <string.h>

#include "fc_algo.h"

typedef struct ring {
    fc_call *c;
    const fc_op *op;
    uint8_t *buf;       /* where blocks are reduced and gathered */
    const uint8_t *src; /* this rank's contribution (may be buf) */
    const int64_t *bounds;
    int nblocks;
    size_t piece;
    int n, r, right, left;
} ring;

static void ring_init(ring *g, fc_call *c, const fc_op *op, uint8_t *buf, const uint8_t *src,
                      const int64_t *bounds, int nblocks)
{
    g->c = c;
    g->op = op;
    g->buf = buf;
    g->src = src ? src : buf;
    g->bounds = bounds;
    g->nblocks = nblocks;
    g->piece = fc_piece_items(c);
    g->n = c->size;
    g->r = c->rank;
    g->right = (g->r + 1) % g->n;
    g->left = (g->r - 1 + g->n) % g->n;
}

/* Block `block` (mod the block count) as [*a, *b). */
static void block_of(const ring *g, int block, int64_t *a, int64_t *b)
{
    int i = ((block % g->nblocks) + g->nblocks) % g->nblocks;
    *a = g->bounds[2 * i];
    *b = g->bounds[2 * i + 1];
}

/* Elements [a, b) of `data` to the right neighbour, as its next message. */
static int send_right(ring *g, const uint8_t *data, int64_t a, int64_t b)
{
    return fc_send(g->c, g->right, g->c->sent++, FC_AT(data, a, g->c->itemsize), (size_t)(b - a));
}

/* `count` elements at `piece` to the right neighbour. */
static int send_piece(ring *g, const uint8_t *piece, size_t count)
{
    return fc_send(g->c, g->right, g->c->sent++, piece, count);
}

static int recv_left(ring *g, uint8_t *out, size_t count)
{
    return fc_recv(g->c, g->left, g->c->received++, out, count);
}

/* Where the piece [a, b) reduced at step s goes: buf, or reduce_scatter's result and its scratch,
 * which holds every partial sum forwarded: a piece sent on must stay unchanged until it has left,
 * and a rank waiting for that inside the ring waits for its right neighbour, which waits for its
 * own: nobody around the ring would receive. */
typedef struct placer {
    uint8_t *out; /* this rank's block of the result, from element lo */
    int64_t lo;
    uint8_t *scratch;
    size_t used; /* elements of scratch placed so far */
} placer;

static uint8_t *place(ring *g, placer *pl, int s, int64_t a, int64_t b)
{
    size_t isz = g->c->itemsize;
    if (!pl)
        return FC_AT(g->buf, a, isz);
    if (s == g->n - 2)
        return FC_AT(pl->out, a - pl->lo, isz);
    uint8_t *p = FC_AT(pl->scratch, pl->used, isz);
    pl->used += (size_t)(b - a);
    return p;
}

/* Afterwards block r holds the full reduction of block r (in buf, or through `pl`). */
static int reduce_scatter_steps(ring *g, int forward_last, placer *pl)
{
    size_t isz = g->c->itemsize;
    uint8_t *tmp = fc_scratch(g->c, g->piece * isz);
    if (!tmp)
        return -1;
    int64_t a, b, pa, pb;
    int failed = 0;
    block_of(g, g->r - 1, &a, &b);
    for (size_t k = 0, np = fc_piece_count(a, b, g->piece); k < np && !failed; k++) {
        fc_piece(a, b, g->piece, k, &pa, &pb);
        failed = send_right(g, g->src, pa, pb) != 0;
    }
    for (int s = 0; s < g->n - 1 && !failed; s++) {
        int last = s == g->n - 2;
        block_of(g, g->r - s - 2, &a, &b);
        for (size_t k = 0, np = fc_piece_count(a, b, g->piece); k < np && !failed; k++) {
            fc_piece(a, b, g->piece, k, &pa, &pb);
            if (recv_left(g, tmp, (size_t)(pb - pa))) {
                failed = 1;
                break;
            }
            uint8_t *dst = place(g, pl, s, pa, pb);
            /* each block meets this rank's contribution exactly once, on its way round */
            fc_combine(g->c, g->op, tmp, FC_AT(g->src, pa, isz), dst, (size_t)(pb - pa));
            if (!failed && (!last || forward_last))
                failed = send_piece(g, dst, (size_t)(pb - pa)) != 0;
        }
    }
    fc_scratch_free(tmp);
    return failed ? -1 : 0;
}

/* Block r of buf is this rank's; afterwards every block is everyone's. */
static int all_gather_steps(ring *g, int send_own)
{
    int64_t a, b, pa, pb;
    if (send_own) {
        block_of(g, g->r, &a, &b);
        for (size_t k = 0, np = fc_piece_count(a, b, g->piece); k < np; k++) {
            fc_piece(a, b, g->piece, k, &pa, &pb);
            if (send_right(g, g->buf, pa, pb))
                return -1;
        }
    }
    for (int s = 0; s < g->n - 1; s++) {
        block_of(g, g->r - s - 1, &a, &b);
        for (size_t k = 0, np = fc_piece_count(a, b, g->piece); k < np; k++) {
            fc_piece(a, b, g->piece, k, &pa, &pb);
            if (recv_left(g, FC_AT(g->buf, pa, g->c->itemsize), (size_t)(pb - pa)))
                return -1;
            if (s < g->n - 2 && send_right(g, g->buf, pa, pb))
                return -1;
        }
    }
    return 0;
}

/* The blocks of `count` elements among n ranks, as fastcoll.algorithms.blocks gives them. */
static int64_t *even_blocks(fc_call *c, size_t count)
{
    int64_t *bounds = fc_scratch(c, 2 * (size_t)c->size * sizeof *bounds);
    for (int i = 0; bounds && i < c->size; i++)
        fc_block(count, c->size, i, &bounds[2 * i], &bounds[2 * i + 1]);
    return bounds;
}

static int all_reduce(fc_call *c, const fc_op *op)
{
    int64_t *bounds = even_blocks(c, op->dst_count);
    if (!bounds)
        return -1;
    ring g;
    ring_init(&g, c, op, op->dst, op->src, bounds, c->size);
    int rc = reduce_scatter_steps(&g, 1, NULL) || all_gather_steps(&g, 0) || fc_flush(c);
    fc_scratch_free(bounds);
    return rc ? -1 : 0;
}

static int reduce_scatter(fc_call *c, const fc_op *op)
{
    ring g;
    ring_init(&g, c, op, (uint8_t *)op->src, op->src, op->bounds, c->size); /* buf is src: only read */
    size_t forwarded = 0; /* the elements of the blocks of steps 0 .. n - 3 */
    for (int s = 0; s < c->size - 2; s++) {
        int64_t a, b;
        block_of(&g, c->rank - s - 2, &a, &b);
        forwarded += (size_t)(b - a);
    }
    placer pl = {op->dst, op->bounds[2 * c->rank], NULL, 0};
    if (forwarded && !(pl.scratch = fc_scratch(c, forwarded * c->itemsize)))
        return -1;
    int rc = reduce_scatter_steps(&g, 0, &pl) || fc_flush(c);
    fc_scratch_free(pl.scratch);
    return rc ? -1 : 0;
}

static int all_gather(fc_call *c, const fc_op *op)
{
    ring g;
    ring_init(&g, c, op, op->dst, NULL, op->bounds, c->size);
    return all_gather_steps(&g, 1) || fc_flush(c) ? -1 : 0;
}

/* Root's buffer flows down the chain root, root+1, ...; each rank forwards pieces as they land. */
static int broadcast(fc_call *c, const fc_op *op)
{
    int64_t whole[2] = {0, (int64_t)op->dst_count};
    ring g;
    ring_init(&g, c, op, op->dst, NULL, whole, 1);
    int is_last = ((c->rank - op->root) % c->size + c->size) % c->size == c->size - 1;
    for (size_t k = 0, np = fc_piece_count(0, whole[1], g.piece); k < np; k++) {
        int64_t pa, pb;
        fc_piece(0, whole[1], g.piece, k, &pa, &pb);
        if (c->rank != op->root && recv_left(&g, FC_AT(op->dst, pa, c->itemsize), (size_t)(pb - pa)))
            return -1;
        if (!is_last && send_right(&g, op->dst, pa, pb))
            return -1;
    }
    return fc_flush(c);
}

const fc_algorithm fc_algo_ring = {
    "ring",
    {
        [FC_K_ALL_REDUCE] = all_reduce,
        [FC_K_ALL_GATHER] = all_gather,
        [FC_K_REDUCE_SCATTER] = reduce_scatter,
        [FC_K_BROADCAST] = broadcast,
    },
};
