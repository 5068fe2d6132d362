/* The Engine type: set up, abort, interrupt and close (py_close.c), and its three objects, each
 * a view of few methods over this one engine: its runner (py_runner.c), its links (py_links.c,
 * py_messages.c) and its gate (py_gate.c). */
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

/* ----- its three objects ----- */

static PyObject *facet(EngineObject *self, PyTypeObject *type)
{
    py_facet *f = PyObject_New(py_facet, type);
    if (f)
        f->engine = (EngineObject *)Py_NewRef((PyObject *)self);
    return (PyObject *)f;
}

void py_facet_dealloc(PyObject *self)
{
    Py_DECREF(FACET(self));
    PyObject_Free(self);
}

static PyObject *get_runner(EngineObject *self, void *unused)
{
    (void)unused;
    return facet(self, &py_runner_type);
}

static PyObject *get_links(EngineObject *self, void *unused)
{
    (void)unused;
    return facet(self, &py_links_type);
}

static PyObject *get_gate(EngineObject *self, void *unused)
{
    (void)unused;
    return facet(self, &py_gate_type);
}

static PyGetSetDef engine_getset[] = {
    {"runner", (getter)get_runner, NULL, "its collectives: a Runner (a new view each time: keep it)", NULL},
    {"links", (getter)get_links, NULL, "its links and their messages: a Links", NULL},
    {"gate", (getter)get_gate, NULL, "the fence gate's host half: a GateHost", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef engine_methods[] = {
    {"abort", (PyCFunction)py_engine_abort, METH_VARARGS, "abort(frame, seconds): only this notice goes out now"},
    {"interrupt", (PyCFunction)interrupt, METH_NOARGS, "end the call under way at its next wait"},
    {"close", (PyCFunction)py_engine_close, METH_VARARGS, "close(flush_seconds, linger_seconds)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_engine_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(rank, size, channels, spin_us, yield_us, main_thread, long_wait_us=0): this rank's data "
              "plane; its runner, links and gate do the work.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
};
