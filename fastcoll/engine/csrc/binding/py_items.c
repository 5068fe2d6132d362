/* What the service thread runs for Python: queued collectives, Python functions queued behind
 * them, and gates; the completions Python waits on; and the
 * graveyard, where finished items leave their Python references until a thread holding the GIL
 * releases them (the service thread takes the GIL only to run Python or to report a failure). */
#include "py_common.h"

#include <stdlib.h>
#include <string.h>

enum { ITEM_OP, ITEM_GATE, ITEM_CALL };

struct py_item {
    fc_item base;
    EngineObject *owner;
    int type;
    int has_op; /* op's signature and ranks are an OpSpec's (held in fn), its buffers its own */
    py_op op;
    uint32_t gate_seq;
    size_t gate_nbytes;
    PyObject *fn, *task, *work;
    fc_done *done;
    fc_ns started;
    fc_err err;
    py_item *dead_next;
};

/* ----- completions ----- */

typedef struct {
    PyObject_HEAD
    fc_done *done;
} CompletionObject;

PyObject *py_completion_new(fc_done *d)
{
    CompletionObject *c = PyObject_New(CompletionObject, &py_completion_type);
    if (c) {
        fc_done_ref(d);
        c->done = d;
    }
    return (PyObject *)c;
}

static void completion_dealloc(CompletionObject *self)
{
    fc_done_unref(self->done);
    PyObject_Free(self);
}

/* wait(timeout=None) -> bool: until the call has finished (False if the timeout came first),
 * without the GIL, running signal handlers between slices (a Ctrl-C raises here). */
static PyObject *completion_wait(CompletionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    fc_ns until = FC_FOREVER;
    if (nargs > 1)
        return PyErr_Format(PyExc_TypeError, "wait takes at most one argument");
    if (nargs == 1 && args[0] != Py_None) {
        double t = PyFloat_AsDouble(args[0]);
        if (t == -1.0 && PyErr_Occurred())
            return NULL;
        until = fc_deadline_in(t);
    }
    for (;;) {
        fc_ns slice = fc_deadline_in(0.05);
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = fc_done_wait(self->done, slice < until ? slice : until);
        Py_END_ALLOW_THREADS
        if (done)
            Py_RETURN_TRUE;
        if (fc_now() >= until)
            Py_RETURN_FALSE;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

static PyObject *completion_done(CompletionObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(fc_done_finished(self->done));
}

static PyObject *completion_code(CompletionObject *self, PyObject *unused)
{
    (void)unused;
    pthread_mutex_lock(&self->done->lock);
    int code = self->done->code;
    pthread_mutex_unlock(&self->done->lock);
    return PyLong_FromLong(code);
}

static PyMethodDef completion_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))completion_wait, METH_FASTCALL, "wait(timeout=None) -> finished"},
    {"done", (PyCFunction)completion_done, METH_NOARGS, "whether the call has finished"},
    {"code", (PyCFunction)completion_code, METH_NOARGS, "0, or the fc_code it failed with"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_completion_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Completion",
    .tp_basicsize = sizeof(CompletionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A queued call's completion.",
    .tp_dealloc = (destructor)completion_dealloc,
    .tp_methods = completion_methods,
};

/* ----- the graveyard ----- */

/* Free an item that holds no GIL-free state any more (holds the GIL). */
static void free_item(py_item *it)
{
    if (it->has_op)
        py_op_unbind(&it->op);
    Py_XDECREF(it->fn);
    Py_XDECREF(it->task);
    Py_XDECREF(it->work);
    fc_done_unref(it->done);
    free(it);
}

static void bury(py_item *it)
{
    EngineObject *o = it->owner;
    pthread_mutex_lock(&o->dead_lock);
    it->dead_next = o->dead;
    o->dead = it;
    pthread_mutex_unlock(&o->dead_lock);
}

void py_reap(EngineObject *self)
{
    pthread_mutex_lock(&self->dead_lock);
    py_item *it = self->dead;
    self->dead = NULL;
    pthread_mutex_unlock(&self->dead_lock);
    while (it) {
        py_item *next = it->dead_next;
        free_item(it);
        it = next;
    }
}

/* ----- running ----- */

/* A queued call failed (err), or the job had failed before it ran (err NULL): tell Python, which
 * breaks the job and hands the caller's Work its error. Runs with the GIL taken for it. */
static void report(py_item *it, const fc_err *err)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *handler = it->owner->on_failure;
    PyObject *info = err ? py_err_info(err) : Py_NewRef(Py_None);
    if (info && handler) {
        double waited = (double)(fc_now() - it->started) / 1e9;
        PyObject *r = PyObject_CallFunction(handler, "OOOd", it->task, it->work, info, waited);
        Py_XDECREF(r);
    }
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(handler ? handler : Py_None);
    Py_XDECREF(info);
    PyGILState_Release(g);
}

static void finish(py_item *it, int code)
{
    if (it->type == ITEM_GATE)
        atomic_fetch_sub(&it->owner->gate.outstanding, 1);
    fc_done_finish(it->done, code);
    bury(it);
}

static void run_op(fc_item *base)
{
    py_item *it = (py_item *)base;
    EngineObject *o = it->owner;
    it->started = fc_now();
    if (atomic_load(&o->failed)) {
        if (it->type == ITEM_GATE)
            fc_gate_release_submitted(&o->gate, o->gate.l.error);
        report(it, NULL);
        finish(it, FC_E_INTERRUPTED);
        return;
    }
    fc_call c;
    py_op_call(&it->op, &o->engine, &c, &it->err);
    int rc = it->type == ITEM_GATE
                 ? fc_gate_serve(&o->gate, &c, &it->op.op, it->gate_seq, it->gate_nbytes, it->op.limit)
                 : fc_run(&c, &it->op.op);
    if (rc) {
        atomic_store(&o->failed, 1);
        if (it->type == ITEM_GATE) /* the GPU is never left waiting */
            fc_gate_release_submitted(&o->gate, it->err.code == FC_E_GATE_CLOSED ? o->gate.l.closed : o->gate.l.error);
        report(it, &it->err);
    }
    finish(it, rc ? (it->err.code ? it->err.code : FC_E_INTERNAL) : FC_OK);
}

static void run_call(fc_item *base)
{
    py_item *it = (py_item *)base;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(it->fn); /* it finishes its own Work */
    if (!r)
        PyErr_WriteUnraisable(it->fn);
    Py_XDECREF(r);
    PyGILState_Release(g);
    finish(it, FC_OK);
}

/* Never run: the service stopped first. */
static void drop(fc_item *base)
{
    py_item *it = (py_item *)base;
    if (it->type == ITEM_GATE)
        fc_gate_release_submitted(&it->owner->gate, it->owner->gate.l.closed);
    finish(it, FC_E_INTERRUPTED);
}

/* ----- submitting ----- */

static py_item *new_item(EngineObject *self, int type)
{
    py_item *it = calloc(1, sizeof *it);
    if (!it) {
        PyErr_NoMemory();
        return NULL;
    }
    it->owner = self;
    it->type = type;
    it->base.run = type == ITEM_CALL ? run_call : run_op;
    it->base.drop = drop;
    if (!(it->done = fc_done_new())) {
        free(it);
        PyErr_NoMemory();
        return NULL;
    }
    return it;
}

/* Queue `it` and give Python its completion (or NULL, with `it` freed). */
static PyObject *queue(EngineObject *self, py_item *it)
{
    PyObject *completion = py_completion_new(it->done);
    if (!completion) {
        free_item(it);
        return NULL;
    }
    fc_service_submit(&self->service, &it->base, 0);
    return completion;
}

/* An item whose OpSpec was bound (`failed` 0) holds the spec, task and work of a submit's
 * arguments (args[0], args[4], args[5]) until it has run; one that failed is freed (-1). */
static int hold_op(py_item *it, int failed, PyObject *const *args)
{
    if (!failed && it->op.trace) { /* its phases come back through run()'s result, which a queue has not */
        py_op_unbind(&it->op);
        PyErr_SetString(PyExc_ValueError, "a traced OpSpec (trace=True) runs through Runner.run, not queued");
        failed = 1;
    }
    if (failed) {
        fc_done_unref(it->done);
        free(it);
        return -1;
    }
    it->has_op = 1;
    it->fn = Py_NewRef(args[0]); /* keeps the signature and ranks alive */
    it->task = Py_NewRef(args[4]);
    it->work = Py_NewRef(args[5]);
    return 0;
}

/* submit(spec, seq, src, dst, task, work): the item borrows the OpSpec's fixed part (it holds
 * the spec) and holds the buffers until it has run. */
PyObject *py_submit_op(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "submit(spec, seq, src, dst, task, work)");
    py_reap(self);
    py_item *it = new_item(self, ITEM_OP);
    if (!it)
        return NULL;
    int failed = py_spec_bind(args[0], &self->engine, args[1], args[2], args[3], &it->op);
    return hold_op(it, failed, args) ? NULL : queue(self, it);
}

/* Check a gate item's exchange (it must gather nbytes from every rank into the receive mailbox)
 * and queue it; frees it and raises on a bad one. */
static PyObject *queue_gate(EngineObject *self, py_item *it, unsigned long seq, Py_ssize_t nbytes)
{
    fc_gate *g = &self->gate;
    uint8_t *recv = (uint8_t *)self->page.buf + g->l.recv_offset;
    if (seq > 0xffffffffUL || nbytes < 0 || (size_t)nbytes > g->l.mailbox_bytes || it->op.op.kind != FC_K_ALL_GATHER ||
        it->op.op.itemsize != 1 || it->op.op.dst != recv || it->op.op.dst_count != (size_t)g->l.ranks * (size_t)nbytes ||
        it->op.size != g->l.ranks) {
        free_item(it);
        return PyErr_Format(PyExc_ValueError, "a gate's exchange must gather bytes of its size into the receive mailbox");
    }
    it->gate_seq = (uint32_t)seq;
    it->gate_nbytes = (size_t)nbytes;
    fc_gate_submitted(g, (uint32_t)seq);
    atomic_fetch_add(&g->outstanding, 1);
    return queue(self, it);
}

/* gate.submit(spec, call_seq, gate_seq, nbytes, task, work): the spec's exchange (an all_gather
 * of bytes) into the receive mailbox, bound here, once the GPU has arrived at gate_seq. */
PyObject *py_submit_gate(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "submit(spec, call_seq, gate_seq, nbytes, task, work)");
    long long call_seq = PyLong_AsLongLong(args[1]);
    unsigned long seq = PyLong_AsUnsignedLong(args[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (nbytes < 0 || (size_t)nbytes > self->gate.l.mailbox_bytes)
        return PyErr_Format(PyExc_ValueError, "a gate of %zd bytes does not fit its mailbox", nbytes);
    py_reap(self);
    py_item *it = new_item(self, ITEM_GATE);
    if (!it)
        return NULL;
    uint8_t *recv = (uint8_t *)self->page.buf + self->gate.l.recv_offset;
    int failed = py_spec_bind_into(args[0], &self->engine, call_seq, recv,
                                   (size_t)self->gate.l.ranks * (size_t)nbytes, &it->op);
    return hold_op(it, failed, args) ? NULL : queue_gate(self, it, seq, nbytes);
}

PyObject *py_submit_call(EngineObject *self, PyObject *fn)
{
    py_reap(self);
    py_item *it = new_item(self, ITEM_CALL);
    if (!it)
        return NULL;
    it->fn = Py_NewRef(fn);
    return queue(self, it);
}

