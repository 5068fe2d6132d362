/* The Engine type: set up, inline runs of a whole collective and queued ones; its links
 * (py_links.c), message calls (py_messages.c), gate (py_gate.c) and end (py_close.c) are methods
 * of their own files. */
#include "py_common.h"

#include <string.h>

/* Whether the engine takes calls: once closed, NativeError(FC_E_SHUT), which Python reports as
 * "this group was finalized" (a thread that passed its group's check as finalize() began). */
int py_usable(EngineObject *self)
{
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine is not set up");
        return 0;
    }
    if (py_forked(self)) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine belongs to the process this one was forked from");
        return 0;
    }
    if (atomic_load(&self->closed)) {
        fc_err err;
        fc_err_set(&err, FC_E_SHUT, -1);
        py_raise(&err);
        return 0;
    }
    return 1;
}

static int engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    int rank, size, channels;
    long long spin_us, yield_us, long_wait_us = 0;
    unsigned long main_thread;
    static char *kwlist[] = {"rank", "size", "channels", "spin_us", "yield_us", "main_thread", "long_wait_us", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiLLk|L", kwlist, &rank, &size, &channels, &spin_us, &yield_us,
                                     &main_thread, &long_wait_us))
        return -1;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "an Engine is set up once");
        return -1;
    }
    if (spin_us < 0 || yield_us < 0 || long_wait_us < 0 || spin_us > 10000000 || yield_us > 10000000 ||
        long_wait_us > 10000000 ||
        fc_engine_init(&self->engine, rank, size, channels, spin_us * 1000, yield_us * 1000, long_wait_us * 1000)) {
        PyErr_SetString(PyExc_ValueError, "bad rank, size, channels or wait settings");
        return -1;
    }
    if (pthread_mutex_init(&self->dead_lock, NULL) || fc_service_start(&self->service)) {
        fc_engine_free(&self->engine);
        PyErr_SetString(PyExc_RuntimeError, "could not start the native service thread");
        return -1;
    }
    self->main_thread = main_thread;
    self->generation = py_fork_generation;
    self->ready = 1;
    return 0;
}

static PyObject *set_failure_handler(EngineObject *self, PyObject *fn)
{
    Py_XSETREF(self->on_failure, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* claim_if_idle(): True, and the run lock is this thread's, if nothing is queued or running;
 * False once closed (the call then takes the ordinary way, which says the group was finalized). */
static PyObject *claim_if_idle(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (self->ready && atomic_load(&self->closed))
        Py_RETURN_FALSE;
    if (!py_usable(self))
        return NULL;
    py_reap(self);
    int r = fc_service_try_claim(&self->service);
    if (r < 0) { /* another thread runs a call inline: wait for it without the GIL */
        Py_BEGIN_ALLOW_THREADS
        r = fc_service_claim_if_idle(&self->service);
        Py_END_ALLOW_THREADS
    }
    if (r) /* close() ends such a call before it frees what the call uses (py_close.c) */
        atomic_store(&self->inline_call, 1);
    return PyBool_FromLong(r);
}

static PyObject *release(EngineObject *self, PyObject *unused)
{
    (void)unused;
    atomic_store(&self->inline_call, 0);
    fc_service_release(&self->service);
    Py_RETURN_NONE;
}

/* run(kind, algorithm, seq, sig, limit, rank, size, ranks, piece_bytes, dtype, reduce, itemsize,
 * src, dst, root, bounds, recv_bounds, agree_counts): run a collective on this thread, which
 * holds the run lock; NativeError if it fails. */
static PyObject *run(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != PY_OP_ARGS)
        return PyErr_Format(PyExc_TypeError, "run takes %d arguments", PY_OP_ARGS);
    if (!py_usable(self))
        return NULL;
    py_op o;
    if (py_op_parse(&o, args, self->engine.size, self->engine.rank)) {
        py_op_release(&o);
        return NULL;
    }
    fc_call c;
    fc_err err;
    py_op_call(&o, &self->engine, &c, &err);
    WAIT_BEGIN(self)
    int rc = fc_run(&c, &o.op);
    WAIT_END(self)
    py_op_release(&o);
    if (rc) {
        atomic_store(&self->failed, 1);
        return py_raise(&err);
    }
    Py_RETURN_NONE;
}

static PyObject *run_planned(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return py_usable(self) ? py_run_planned(self, args, nargs) : NULL;
}

static PyObject *submit(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return py_usable(self) ? py_submit_op(self, args, nargs) : NULL;
}

static PyObject *submit_call(EngineObject *self, PyObject *fn)
{
    return py_usable(self) ? py_submit_call(self, fn) : NULL;
}

/* ----- failure and the end (py_close.c) ----- */

static PyObject *interrupt(EngineObject *self, PyObject *unused)
{
    (void)unused;
    atomic_store(&self->engine.interrupted, FC_INTERRUPT_USER);
    Py_RETURN_NONE;
}

static void engine_dealloc(EngineObject *self)
{
    py_engine_end(self);
    Py_CLEAR(self->on_failure);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *graph_open(EngineObject *self, PyObject *args)
{
    return py_usable(self) ? py_graph_open(self, args) : NULL;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef engine_methods[] = {
    {"add_link", (PyCFunction)(void (*)(void))py_add_link, METH_VARARGS | METH_KEYWORDS,
     "add_link(peer, channel, fd, *, kind='tcp', segment=None, tx_offset=0, rx_offset=0, capacity=0, device=None, "
     "library=None, reliable=False, setup_timeout=10.0)"},
    {"link_info", (PyCFunction)py_link_info, METH_VARARGS,
     "link_info(peer, channel) -> (kind, detail): what carries that link (detail: e.g. 'mlx5_0, UC, MTU 1024')"},
    {"set_failure_handler", (PyCFunction)set_failure_handler, METH_O, "on_failure(task, work, info, waited)"},
    {"claim_if_idle", (PyCFunction)claim_if_idle, METH_NOARGS, "True: run the next call on this thread"},
    {"release", (PyCFunction)release, METH_NOARGS, "give back the run lock claim_if_idle took"},
    {"run", FASTCALL(run), METH_FASTCALL, "run a collective on this thread (18 arguments, see py_common.h)"},
    {"run_planned", FASTCALL(run_planned), METH_FASTCALL, "run_planned(plan, seq, src, dst): a planned call, here"},
    {"submit", FASTCALL(submit), METH_FASTCALL, "queue a collective (18 arguments, task, work): a Completion"},
    {"submit_call", (PyCFunction)submit_call, METH_O, "queue a Python function behind the queued calls"},
    {"send", (PyCFunction)py_send, METH_VARARGS, "send(peer, kind, seq, sig, chunk, payload)"},
    {"send_raw", (PyCFunction)py_send_raw, METH_VARARGS, "send_raw(peer, data): for tests, bytes as they are"},
    {"flush", (PyCFunction)py_flush, METH_O, "flush(seconds)"},
    {"next_header", (PyCFunction)py_next_header, METH_VARARGS, "next_header(peer, chunk, seconds)"},
    {"read_payload", (PyCFunction)py_read_payload, METH_VARARGS, "read_payload(peer, chunk, out, seconds)"},
    {"keep_unread", (PyCFunction)py_keep_unread, METH_VARARGS, "keep_unread(peer, chunk)"},
    {"abort", (PyCFunction)py_engine_abort, METH_VARARGS, "abort(frame, seconds)"},
    {"interrupt", (PyCFunction)interrupt, METH_NOARGS, "end the call under way at its next wait"},
    {"close", (PyCFunction)py_engine_close, METH_VARARGS, "close(flush_seconds, linger_seconds)"},
    {"attach_gate", (PyCFunction)py_attach_gate, METH_VARARGS, "the gate's control page and layout"},
    {"gate_release", (PyCFunction)py_gate_release, METH_VARARGS, "gate_release(seq, status)"},
    {"gate_stop", (PyCFunction)py_gate_stop, METH_NOARGS, "stop waiting for arrivals"},
    {"gate_outstanding", (PyCFunction)py_gate_outstanding, METH_NOARGS, "gates queued and not yet served"},
    {"gate_timings", (PyCFunction)py_gate_timings, METH_NOARGS, "the profile's new records"},
    {"gate_submit", FASTCALL(py_gate_submit), METH_FASTCALL, "queue a gate (seq, nbytes, 18 arguments, task, work)"},
    {"gate_submit_planned", FASTCALL(py_gate_submit_planned), METH_FASTCALL,
     "queue a gate (plan, call_seq, gate_seq, nbytes, task, work): the exchange planned"},
    {"graph_open", (PyCFunction)graph_open, METH_VARARGS,
     "graph_open(prefix, ranks, rank, limit, piece_bytes, all_reduce, all_gather, labels, dtype_names, op_names): "
     "the graph table"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_engine_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(rank, size, channels, spin_us, yield_us, main_thread, long_wait_us=0): this rank's data plane.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
};
