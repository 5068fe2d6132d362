/* A collective's arguments from Python, checked before anything runs: every count, bound and
 * rank is held against the buffers it indexes, so no call can make the engine read or write
 * outside them. */
#include "py_common.h"

#include <string.h>

#include "fc_reduce.h"

enum { H_SIG = 1, H_RANKS = 2, H_SRC = 4, H_DST = 8, H_BOUNDS = 16, H_RECV = 32 };

static int fail(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

/* A buffer argument (None allowed): held in *view with bit `bit`; *data and *count (in items). */
static int get_buffer(py_op *o, PyObject *arg, Py_buffer *view, int bit, int writable, size_t itemsize,
                      uint8_t **data, size_t *count)
{
    *data = NULL;
    *count = 0;
    if (arg == Py_None)
        return 0;
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    o->held |= bit;
    if ((size_t)view->len % itemsize)
        return fail("a buffer's length is not a whole number of items");
    *data = view->buf;
    *count = (size_t)view->len / itemsize;
    return 0;
}

static long long as_ll(PyObject *arg, int *bad)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        *bad = 1;
    return v;
}

/* (start, end) pairs for every rank: from Python (int64), or even blocks of `total` items. */
static int get_bounds(py_op *o, PyObject *arg, Py_buffer *view, int bit, int slot, size_t total,
                      const int64_t **out)
{
    int n = o->size;
    if (arg == Py_None) {
        o->even[slot] = PyMem_Malloc(2 * (size_t)n * sizeof(int64_t));
        if (!o->even[slot]) {
            PyErr_NoMemory();
            return -1;
        }
        for (int i = 0; i < n; i++)
            fc_block(total, n, i, &o->even[slot][2 * i], &o->even[slot][2 * i + 1]);
        *out = o->even[slot];
        return 0;
    }
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS))
        return -1;
    o->held |= bit;
    if ((size_t)view->len != 2 * (size_t)n * sizeof(int64_t))
        return fail("bounds must hold a (start, end) pair of int64 for every rank");
    *out = view->buf;
    return 0;
}

/* Every pair within 0..limit (a rank's own pair checked against `own` items, if >= 0). */
static int check_bounds(const int64_t *b, int n, size_t limit, int rank, long long own)
{
    if (!b)
        return 0;
    for (int i = 0; i < n; i++)
        if (b[2 * i] < 0 || b[2 * i] > b[2 * i + 1] || (size_t)b[2 * i + 1] > limit)
            return fail("a rank's bounds lie outside its buffer");
    if (own >= 0 && b[2 * rank + 1] - b[2 * rank] != own)
        return fail("this rank's bounds do not match its buffer");
    return 0;
}

/* What each kind needs of its buffers and bounds. */
static int check_kind(py_op *o, PyObject *const *args)
{
    fc_op *op = &o->op;
    int k = op->kind, n = o->size, r = o->rank, root_here = op->root == r;
    size_t sc = op->src_count, dc = op->dst_count;
    int need_src = k != FC_K_ALL_GATHER && k != FC_K_BROADCAST && k != FC_K_BARRIER && k != FC_K_RECV &&
                   !(k == FC_K_SCATTER && !root_here);
    int need_dst = k != FC_K_BARRIER && k != FC_K_SEND && !((k == FC_K_GATHER || k == FC_K_REDUCE) && !root_here);
    if ((need_src && !op->src) || (need_dst && !op->dst))
        return fail("a buffer this collective needs is missing");
    if ((k == FC_K_ALL_REDUCE || (k == FC_K_REDUCE && root_here)) && sc != dc)
        return fail("the result buffer is not as long as the contribution");
    if ((k == FC_K_SEND || k == FC_K_RECV) && root_here)
        return fail("a message to or from this rank itself");
    const int64_t **b = &op->bounds, **rb = &op->recv_bounds;
    PyObject *ab = args[15], *arb = args[16];
    switch (k) {
    case FC_K_ALL_GATHER:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, dc, b) || check_bounds(*b, n, dc, r, -1);
    case FC_K_REDUCE_SCATTER:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, sc, b) || check_bounds(*b, n, sc, r, (long long)dc);
    case FC_K_ALL_TO_ALL:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, sc, b) || check_bounds(*b, n, sc, r, -1) ||
               get_bounds(o, arb, &o->recv_bounds, H_RECV, 1, sc, rb) || check_bounds(*rb, n, dc, r, -1);
    case FC_K_GATHER:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, (size_t)n * sc, b) ||
               check_bounds(*b, n, root_here ? dc : (size_t)n * sc, r, (long long)sc);
    case FC_K_SCATTER:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, (size_t)n * dc, b) ||
               check_bounds(*b, n, root_here ? sc : (size_t)n * dc, r, (long long)dc);
    default:
        return 0;
    }
}

static int check_ranks(py_op *o, int job_size, int job_rank)
{
    if ((size_t)o->ranks.len != (size_t)o->size * sizeof(int32_t))
        return fail("ranks must hold an int32 for every rank of the group");
    const int32_t *ranks = o->ranks.buf;
    for (int i = 0; i < o->size; i++)
        if (ranks[i] < 0 || ranks[i] >= job_size || (ranks[i] == job_rank) != (i == o->rank))
            return fail("the group's ranks are not distinct ranks of the job with this one at its rank");
    return 0;
}

int py_op_parse(py_op *o, PyObject *const *args, int job_size, int job_rank)
{
    memset(o, 0, sizeof *o);
    fc_op *op = &o->op;
    int bad = 0;
    op->kind = (int)as_ll(args[0], &bad);
    op->algo = (int)as_ll(args[1], &bad);
    o->seq = as_ll(args[2], &bad);
    o->limit = PyFloat_AsDouble(args[4]);
    bad |= o->limit == -1.0 && PyErr_Occurred();
    o->rank = (int)as_ll(args[5], &bad);
    o->size = (int)as_ll(args[6], &bad);
    o->piece_bytes = (size_t)as_ll(args[8], &bad);
    op->dtype = (int)as_ll(args[9], &bad);
    op->redop = (int)as_ll(args[10], &bad);
    op->itemsize = (size_t)as_ll(args[11], &bad);
    op->root = (int)as_ll(args[14], &bad);
    if (bad)
        return -1;
    if (!fc_can_run(op->algo, op->kind))
        return fail("no native algorithm runs this collective");
    if (o->size < 1 || o->size > job_size || o->rank < 0 || o->rank >= o->size || o->piece_bytes < 1)
        return fail("rank, size or piece size out of range");
    if (op->dtype < 0 || op->dtype >= FC_DTYPE_COUNT || op->itemsize != fc_itemsize(op->dtype))
        return fail("unknown dtype, or an item size that is not the dtype's");
    int reducing = op->kind == FC_K_ALL_REDUCE || op->kind == FC_K_REDUCE_SCATTER || op->kind == FC_K_REDUCE;
    if (reducing && !fc_reduction_valid(op->dtype, op->redop))
        return fail("this reduction does not apply to this dtype");
    if (op->root < 0 || op->root >= o->size)
        return fail("root or peer is not a rank of the group");
    if (PyObject_GetBuffer(args[3], &o->sig, PyBUF_SIMPLE))
        return -1;
    o->held |= H_SIG;
    if (PyObject_GetBuffer(args[7], &o->ranks, PyBUF_C_CONTIGUOUS))
        return -1;
    o->held |= H_RANKS;
    uint8_t *src;
    if (check_ranks(o, job_size, job_rank) ||
        get_buffer(o, args[12], &o->src, H_SRC, 0, op->itemsize, &src, &op->src_count) ||
        get_buffer(o, args[13], &o->dst, H_DST, 1, op->itemsize, &op->dst, &op->dst_count))
        return -1;
    op->src = src;
    return check_kind(o, args);
}

void py_op_release(py_op *o)
{
    Py_buffer *views[] = {&o->sig, &o->ranks, &o->src, &o->dst, &o->bounds, &o->recv_bounds};
    for (int i = 0; i < 6; i++)
        if (o->held & (1 << i))
            PyBuffer_Release(views[i]);
    o->held = 0;
    PyMem_Free(o->even[0]);
    PyMem_Free(o->even[1]);
    o->even[0] = o->even[1] = NULL;
}

void py_op_call(py_op *o, fc_engine *e, fc_call *c, fc_err *err)
{
    memset(c, 0, sizeof *c);
    c->e = e;
    c->seq = o->seq;
    c->sig = o->sig.buf;
    c->sig_len = (size_t)o->sig.len;
    c->deadline = fc_deadline_in(o->limit);
    c->rank = o->rank;
    c->size = o->size;
    c->ranks = o->ranks.buf;
    c->piece_bytes = o->piece_bytes;
    c->itemsize = o->op.itemsize;
    c->err = err;
    fc_err_set(err, FC_OK, -1);
}
