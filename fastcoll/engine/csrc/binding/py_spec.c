/* An OpSpec: a collective's fixed part by name (which collective and algorithm, its signature,
 * its group, its dtype and reduction, its root and bounds), checked once as it is made
 * (Runner.spec); each run or submit then takes only the call's sequence number and buffers. A
 * loop that repeats a call repeats one OpSpec (a plan), so its checks cost nothing per call. */
#include "py_common.h"

#include <structmember.h>
#include <string.h>

const char *const py_field_names[PF_COUNT] = {
    "kind", "algorithm", "sig", "limit", "rank", "size", "ranks", "piece_bytes", "dtype", "itemsize",
    "reduce", "root", "bounds", "recv_bounds", "agree_counts", "trace"};

/* Not tracked by the garbage collector (it holds no container that could make a cycle): a
 * group keeps a few of these for as long as it lives. */
typedef struct {
    PyObject_HEAD
    py_op fixed;
    PyObject *sig;                 /* the signature as Python wrote it, for the errors a run raises */
    PyObject *bounds, *recv_bounds; /* None (even blocks) or int64 pairs, bound at each run */
    int job_size, job_rank;        /* the job it was checked against */
} SpecObject;

/* Match the keywords to the fields: f[i] (borrowed) is field i's value or NULL. A caller that
 * names them in order matches each at its first comparison. 0, or -1 with a TypeError naming
 * an unknown, repeated or missing field. */
static int fields_of(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **f)
{
    memset(f, 0, PF_COUNT * sizeof *f);
    Py_ssize_t n = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs) {
        PyErr_SetString(PyExc_TypeError, "an OpSpec takes its fields by name (spec(kind=..., ...))");
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = k < PF_COUNT && PyUnicode_CompareWithASCIIString(name, py_field_names[k]) == 0 ? (int)k : -1;
        for (int j = 0; i < 0 && j < PF_COUNT; j++)
            if (PyUnicode_CompareWithASCIIString(name, py_field_names[j]) == 0)
                i = j;
        if (i < 0 || f[i]) {
            PyErr_Format(PyExc_TypeError, "OpSpec has %s field %R", i < 0 ? "no" : "a repeated", name);
            return -1;
        }
        f[i] = args[k];
    }
    for (int i = 0; i < PF_REQUIRED; i++)
        if (!f[i]) {
            PyErr_Format(PyExc_TypeError, "OpSpec needs field '%s'", py_field_names[i]);
            return -1;
        }
    return 0;
}

static int pairs_or_none(PyObject *v, int field)
{
    if (v == Py_None || PyObject_CheckBuffer(v))
        return 0;
    PyErr_Format(PyExc_TypeError, "OpSpec field '%s' must be None or a buffer of int64 pairs, not %.60s",
                 py_field_names[field], Py_TYPE(v)->tp_name);
    return -1;
}

PyObject *py_spec_new(EngineObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *f[PF_COUNT];
    if (fields_of(args, nargs, kwnames, f))
        return NULL;
    PyObject *bounds = f[PF_BOUNDS] ? f[PF_BOUNDS] : Py_None, *recv = f[PF_RECV_BOUNDS] ? f[PF_RECV_BOUNDS] : Py_None;
    if (pairs_or_none(bounds, PF_BOUNDS) || pairs_or_none(recv, PF_RECV_BOUNDS))
        return NULL;
    SpecObject *s = PyObject_New(SpecObject, &py_spec_type);
    if (!s)
        return NULL;
    s->sig = s->bounds = s->recv_bounds = NULL;
    if (py_op_fix(&s->fixed, f, self->engine.size, self->engine.rank)) {
        py_op_release(&s->fixed);
        Py_DECREF(s); /* (its sig is NULL: nothing is released twice) */
        return NULL;
    }
    s->sig = Py_NewRef(f[PF_SIG]);
    s->bounds = Py_NewRef(bounds);
    s->recv_bounds = Py_NewRef(recv);
    s->job_size = self->engine.size;
    s->job_rank = self->engine.rank;
    return (PyObject *)s;
}

static void spec_dealloc(SpecObject *self)
{
    if (self->sig)
        py_op_release(&self->fixed);
    Py_XDECREF(self->sig);
    Py_XDECREF(self->bounds);
    Py_XDECREF(self->recv_bounds);
    PyObject_Free(self);
}

/* o = the spec's fixed part as call seq, its buffers not yet bound. */
static const SpecObject *take(PyObject *obj, const fc_engine *e, long long seq, py_op *o)
{
    if (Py_TYPE(obj) != &py_spec_type) {
        PyErr_Format(PyExc_TypeError, "expected an OpSpec (Runner.spec), not %.60s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    const SpecObject *s = (const SpecObject *)obj;
    if (s->job_size != e->size || s->job_rank != e->rank) {
        PyErr_SetString(PyExc_ValueError, "an OpSpec made for another job's engine");
        return NULL;
    }
    *o = s->fixed; /* shares the spec's signature and ranks; owns only its buffers */
    o->seq = seq;
    o->held = 0;
    o->even[0] = o->even[1] = NULL;
    return s;
}

int py_spec_bind(PyObject *spec, const fc_engine *e, PyObject *seq, PyObject *src, PyObject *dst, py_op *o)
{
    long long n = PyLong_AsLongLong(seq);
    if (n == -1 && PyErr_Occurred())
        return -1;
    const SpecObject *s = take(spec, e, n, o);
    if (!s)
        return -1;
    if (py_op_bind(o, src, dst, s->bounds, s->recv_bounds)) {
        py_op_unbind(o);
        return -1;
    }
    return 0;
}

int py_spec_bind_into(PyObject *spec, const fc_engine *e, long long seq, uint8_t *dst, size_t nbytes, py_op *o)
{
    if (!take(spec, e, seq, o))
        return -1;
    if (py_op_bind_into(o, dst, nbytes)) {
        py_op_unbind(o);
        return -1;
    }
    return 0;
}

#define FIELD(name, type, member) {name, type, offsetof(SpecObject, member), READONLY, NULL}

/* Its fields, read back by name (the codes as given). */
static PyMemberDef spec_members[] = {
    FIELD("kind", T_INT, fixed.op.kind),
    FIELD("algorithm", T_INT, fixed.op.algo),
    FIELD("sig", T_OBJECT, sig),
    FIELD("limit", T_DOUBLE, fixed.limit),
    FIELD("rank", T_INT, fixed.rank),
    FIELD("size", T_INT, fixed.size),
    FIELD("piece_bytes", T_PYSSIZET, fixed.piece_bytes),
    FIELD("dtype", T_INT, fixed.op.dtype),
    FIELD("itemsize", T_PYSSIZET, fixed.op.itemsize),
    FIELD("reduce", T_INT, fixed.op.redop),
    FIELD("root", T_INT, fixed.op.root),
    FIELD("bounds", T_OBJECT, bounds),
    FIELD("recv_bounds", T_OBJECT, recv_bounds),
    FIELD("agree_counts", T_INT, fixed.op.agree_counts),
    FIELD("trace", T_INT, fixed.trace),
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject py_spec_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.OpSpec",
    .tp_basicsize = sizeof(SpecObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A collective's fixed part, by name, checked once: made by Runner.spec(kind=..., algorithm=..., "
              "sig=..., limit=..., rank=..., size=..., ranks=..., piece_bytes=..., dtype=..., itemsize=..., "
              "reduce=0, root=0, bounds=None, recv_bounds=None, agree_counts=False, trace=False).",
    .tp_members = spec_members,
    .tp_dealloc = (destructor)spec_dealloc,
};
