/* A collective's fields and buffers from Python, checked before anything runs: every count,
 * bound and rank is held against the buffers it indexes, so no call can make the engine read or
 * write outside them. The fixed part (an OpSpec's fields: which collective, its signature, its
 * group) is checked apart from the buffers, once per OpSpec (py_spec.c), since a loop repeats
 * one OpSpec with new buffers. */
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

/* An int field of an OpSpec (its default where absent), or -1 with a TypeError naming it. */
static int int_field(PyObject *const *f, int i, long long dflt, long long *out)
{
    if (!f[i]) {
        *out = dflt;
        return 0;
    }
    long long v = PyLong_AsLongLong(f[i]);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "OpSpec field '%s' must be an int that fits 64 bits, not %.60s",
                     py_field_names[i], Py_TYPE(f[i])->tp_name);
        return -1;
    }
    *out = v;
    return 0;
}

/* A copy of a bytes-like argument (malloc'd: freed without the GIL). */
static void *copy_of(PyObject *arg, size_t item, size_t want_items, size_t *len)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS))
        return NULL;
    void *copy = NULL;
    if (want_items != SIZE_MAX && (size_t)v.len != want_items * item) {
        fail("OpSpec field 'ranks' must hold an int32 for every rank of the group");
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
            return fail("OpSpec field 'ranks': not distinct ranks of the job with this one at 'rank'");
    return 0;
}

/* The int fields, each range-checked where its value alone can be wrong. */
static int int_fields(py_op *o, PyObject *const *f)
{
    fc_op *op = &o->op;
    long long v[PF_COUNT];
    static const int ints[] = {PF_KIND, PF_ALGORITHM, PF_RANK, PF_SIZE, PF_PIECE_BYTES, PF_DTYPE, PF_REDUCE,
                               PF_ITEMSIZE, PF_ROOT};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (int_field(f, ints[i], 0, &v[ints[i]]))
            return -1;
    if (v[PF_KIND] < 0 || v[PF_KIND] >= FC_K_COUNT || v[PF_ALGORITHM] < 0 || v[PF_ALGORITHM] >= FC_A_COUNT)
        return fail("OpSpec field 'kind' or 'algorithm' is not a code of _native.KINDS or ALGORITHMS");
    if (v[PF_DTYPE] < 0 || v[PF_DTYPE] >= FC_DTYPE_COUNT || v[PF_REDUCE] < 0 || v[PF_REDUCE] >= FC_OP_COUNT)
        return fail("OpSpec field 'dtype' or 'reduce' is not a code of _native.DTYPES or OPS");
    if (v[PF_SIZE] < 1 || v[PF_SIZE] > INT32_MAX || v[PF_RANK] < 0 || v[PF_RANK] >= v[PF_SIZE])
        return fail("OpSpec field 'size' or 'rank' out of range (0 <= rank < size)");
    if (v[PF_ROOT] < 0 || v[PF_ROOT] >= v[PF_SIZE])
        return fail("OpSpec field 'root' is not a rank of the group");
    if (v[PF_PIECE_BYTES] < 1 || v[PF_ITEMSIZE] < 1)
        return fail("OpSpec field 'piece_bytes' or 'itemsize' is not positive");
    op->kind = (int)v[PF_KIND];
    op->algo = (int)v[PF_ALGORITHM];
    op->dtype = (int)v[PF_DTYPE];
    op->redop = (int)v[PF_REDUCE];
    op->root = (int)v[PF_ROOT];
    op->itemsize = (size_t)v[PF_ITEMSIZE];
    o->rank = (int)v[PF_RANK];
    o->size = (int)v[PF_SIZE];
    o->piece_bytes = (size_t)v[PF_PIECE_BYTES];
    return 0;
}

/* The signature (a str, copied as UTF-8) and the group's ranks (int32 for every rank). */
static int copies(py_op *o, PyObject *const *f)
{
    Py_ssize_t len;
    const char *sig = PyUnicode_Check(f[PF_SIG]) ? PyUnicode_AsUTF8AndSize(f[PF_SIG], &len) : NULL;
    if (!sig) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "OpSpec field 'sig' must be a str");
        return -1;
    }
    if (!(o->sig = malloc(len ? (size_t)len : 1))) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(o->sig, sig, (size_t)len);
    o->sig_len = (size_t)len;
    size_t n;
    if (!(o->ranks = copy_of(f[PF_RANKS], sizeof(int32_t), (size_t)o->size, &n)))
        return -1;
    return 0;
}

int py_op_fix(py_op *o, PyObject *const *f, int job_size, int job_rank)
{
    memset(o, 0, sizeof *o);
    fc_op *op = &o->op;
    if (int_fields(o, f))
        return -1;
    o->limit = PyFloat_AsDouble(f[PF_LIMIT]);
    if (o->limit == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "OpSpec field 'limit' must be a number of seconds");
        return -1;
    }
    int agree = f[PF_AGREE_COUNTS] ? PyObject_IsTrue(f[PF_AGREE_COUNTS]) : 0;
    if (agree < 0)
        return -1;
    op->agree_counts = agree && op->kind == FC_K_ALL_TO_ALL;
    if ((o->trace = f[PF_TRACE] ? PyObject_IsTrue(f[PF_TRACE]) : 0) < 0)
        return -1;
    if (!fc_can_run(op->algo, op->kind))
        return fail("OpSpec field 'algorithm' names no native schedule of this 'kind'");
    if (o->size > job_size)
        return fail("OpSpec field 'size' is larger than the job");
    if (op->itemsize != fc_itemsize(op->dtype))
        return fail("OpSpec field 'itemsize' is not the size of its 'dtype'");
    int reducing = op->kind == FC_K_ALL_REDUCE || op->kind == FC_K_REDUCE_SCATTER || op->kind == FC_K_REDUCE;
    if (reducing && !fc_reduction_valid(op->dtype, op->redop))
        return fail("OpSpec field 'reduce' does not apply to its 'dtype'");
    if ((op->kind == FC_K_SEND || op->kind == FC_K_RECV) && op->root == o->rank)
        return fail("OpSpec field 'root' names this rank itself as a message's peer");
    if (copies(o, f))
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
