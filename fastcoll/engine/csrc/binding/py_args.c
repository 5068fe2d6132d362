/* A collective's arguments from Python, checked before anything runs: every count, bound and
 * rank is held against the buffers it indexes, so no call can make the engine read or write
 * outside them. The call's fixed part (which collective, its signature, its group) is parsed
 * apart from its buffers, so that a Plan can fix it once for calls that repeat (py_plan.c). */
#include "py_common.h"

#include <stdlib.h>
#include <string.h>

#include "reduce/fc_reduce.h"

enum { H_SRC = 1, H_DST = 2, H_BOUNDS = 4, H_RECV = 8 };

static int fail(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

static long long as_ll(PyObject *arg, int *bad)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        *bad = 1;
    return v;
}

/* A copy of a bytes-like argument (malloc'd: freed without the GIL). */
static void *copy_of(PyObject *arg, size_t item, size_t want_items, size_t *len)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS))
        return NULL;
    void *copy = NULL;
    if (want_items != SIZE_MAX && (size_t)v.len != want_items * item) {
        fail("ranks must hold an int32 for every rank of the group");
    } else if (!(copy = malloc(v.len ? (size_t)v.len : 1))) {
        PyErr_NoMemory();
    } else {
        if (v.len)
            memcpy(copy, v.buf, (size_t)v.len);
        *len = (size_t)v.len;
    }
    PyBuffer_Release(&v);
    return copy;
}

static int check_ranks(py_op *o, int job_size, int job_rank)
{
    for (int i = 0; i < o->size; i++)
        if (o->ranks[i] < 0 || o->ranks[i] >= job_size || (o->ranks[i] == job_rank) != (i == o->rank))
            return fail("the group's ranks are not distinct ranks of the job with this one at its rank");
    return 0;
}

int py_op_fix(py_op *o, PyObject *const *a, int job_size, int job_rank)
{
    memset(o, 0, sizeof *o);
    fc_op *op = &o->op;
    int bad = 0;
    op->kind = (int)as_ll(a[0], &bad);
    op->algo = (int)as_ll(a[1], &bad);
    o->seq = as_ll(a[2], &bad);
    o->limit = PyFloat_AsDouble(a[4]);
    bad |= o->limit == -1.0 && PyErr_Occurred();
    o->rank = (int)as_ll(a[5], &bad);
    o->size = (int)as_ll(a[6], &bad);
    o->piece_bytes = (size_t)as_ll(a[8], &bad);
    op->dtype = (int)as_ll(a[9], &bad);
    op->redop = (int)as_ll(a[10], &bad);
    op->itemsize = (size_t)as_ll(a[11], &bad);
    op->root = (int)as_ll(a[12], &bad);
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
    if ((op->kind == FC_K_SEND || op->kind == FC_K_RECV) && op->root == o->rank)
        return fail("a message to or from this rank itself");
    size_t n;
    if (!(o->sig = copy_of(a[3], 1, SIZE_MAX, &o->sig_len)) ||
        !(o->ranks = copy_of(a[7], sizeof(int32_t), (size_t)o->size, &n)))
        return -1;
    return check_ranks(o, job_size, job_rank);
}

/* A buffer argument (None allowed): held with bit `bit`; *data and *count (in items). */
static int get_buffer(py_op *o, PyObject *arg, Py_buffer *view, int bit, int writable, uint8_t **data,
                      size_t *count)
{
    *data = NULL;
    *count = 0;
    if (arg == Py_None)
        return 0;
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    o->held |= bit;
    if ((size_t)view->len % o->op.itemsize)
        return fail("a buffer's length is not a whole number of items");
    *data = view->buf;
    *count = (size_t)view->len / o->op.itemsize;
    return 0;
}

/* (start, end) pairs for every rank: from Python (int64), or even blocks of `total` items. */
static int get_bounds(py_op *o, PyObject *arg, Py_buffer *view, int bit, int slot, size_t total,
                      const int64_t **out)
{
    int n = o->size;
    if (arg == Py_None) {
        o->even[slot] = malloc(2 * (size_t)n * sizeof(int64_t));
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
    for (int i = 0; i < n; i++)
        if (b[2 * i] < 0 || b[2 * i] > b[2 * i + 1] || (size_t)b[2 * i + 1] > limit)
            return fail("a rank's bounds lie outside its buffer");
    if (own >= 0 && b[2 * rank + 1] - b[2 * rank] != own)
        return fail("this rank's bounds do not match its buffer");
    return 0;
}

/* What each kind needs of its buffers and bounds. */
static int check_kind(py_op *o, PyObject *ab, PyObject *arb)
{
    fc_op *op = &o->op;
    int k = op->kind, n = o->size, r = o->rank, root_here = op->root == r;
    size_t sc = op->src_count, dc = op->dst_count;
    int need_src = k != FC_K_ALL_GATHER && k != FC_K_BROADCAST && k != FC_K_BARRIER && k != FC_K_RECV &&
                   !(k == FC_K_SCATTER && !root_here);
    int need_dst = k != FC_K_BARRIER && k != FC_K_SEND && !((k == FC_K_GATHER || k == FC_K_REDUCE) && !root_here) &&
                   !(k == FC_K_BROADCAST && root_here);
    if ((need_src && !op->src) || (need_dst && !op->dst) || (k == FC_K_BROADCAST && !op->src && !op->dst))
        return fail("a buffer this collective needs is missing");
    if ((k == FC_K_ALL_REDUCE || (k == FC_K_REDUCE && root_here)) && sc != dc)
        return fail("the result buffer is not as long as the contribution");
    if (k == FC_K_BROADCAST && op->src && op->dst && sc != dc)
        return fail("a broadcast's two buffers differ in length");
    const int64_t **b = &op->bounds, **rb = &op->recv_bounds;
    switch (k) {
    case FC_K_ALL_GATHER:
        return get_bounds(o, ab, &o->bounds, H_BOUNDS, 0, dc, b) ||
               check_bounds(*b, n, dc, r, op->src ? (long long)sc : -1);
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

int py_op_bind(py_op *o, PyObject *src, PyObject *dst, PyObject *bounds, PyObject *recv_bounds)
{
    uint8_t *s;
    if (get_buffer(o, src, &o->src, H_SRC, 0, &s, &o->op.src_count) ||
        get_buffer(o, dst, &o->dst, H_DST, 1, &o->op.dst, &o->op.dst_count))
        return -1;
    o->op.src = s;
    return check_kind(o, bounds, recv_bounds);
}

int py_op_bind_into(py_op *o, uint8_t *dst, size_t nbytes)
{
    if (nbytes % o->op.itemsize)
        return fail("a buffer's length is not a whole number of items");
    o->op.src = NULL;
    o->op.src_count = 0;
    o->op.dst = dst;
    o->op.dst_count = nbytes / o->op.itemsize;
    return check_kind(o, Py_None, Py_None);
}

int py_op_parse(py_op *o, PyObject *const *a, int job_size, int job_rank)
{
    PyObject *fixed[13] = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[14]};
    if (py_op_fix(o, fixed, job_size, job_rank))
        return -1;
    int agree = PyObject_IsTrue(a[17]);
    if (agree < 0)
        return -1;
    o->op.agree_counts = agree && o->op.kind == FC_K_ALL_TO_ALL;
    return py_op_bind(o, a[12], a[13], a[15], a[16]);
}

void py_op_unbind(py_op *o)
{
    Py_buffer *views[] = {&o->src, &o->dst, &o->bounds, &o->recv_bounds};
    for (int i = 0; i < 4; i++)
        if (o->held & (1 << i))
            PyBuffer_Release(views[i]);
    o->held = 0;
    free(o->even[0]);
    free(o->even[1]);
    o->even[0] = o->even[1] = NULL;
    o->op.bounds = o->op.recv_bounds = NULL;
}

void py_op_release(py_op *o)
{
    py_op_unbind(o);
    free(o->sig);
    free(o->ranks);
    o->sig = NULL;
    o->ranks = NULL;
}

void py_op_call(py_op *o, fc_engine *e, fc_call *c, fc_err *err)
{
    memset(c, 0, sizeof *c);
    c->e = e;
    c->seq = o->seq;
    c->sig = o->sig;
    c->sig_len = o->sig_len;
    c->deadline = fc_deadline_in(o->limit);
    c->rank = o->rank;
    c->size = o->size;
    c->ranks = o->ranks;
    c->piece_bytes = o->piece_bytes;
    c->itemsize = o->op.itemsize;
    c->err = err;
    fc_err_set(err, FC_OK, -1);
}
