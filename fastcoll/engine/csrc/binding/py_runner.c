/* The Runner: an Engine's collectives. The run lock (claim_if_idle, release), OpSpecs
 * (py_spec.c), a call run on the caller's thread or queued for the service thread (py_items.c),
 * a Python function queued behind them, the handler of a queued call's failure, and the graph
 * table MLX's evaluation thread calls (py_graph.c), as a GraphTable (py_graph_table.c). */
#include "py_common.h"

/* claim_if_idle(): True, and the run lock is this thread's, if nothing is queued or running;
 * False once closed (the call then takes the ordinary way, which says the group was finalized). */
static PyObject *claim_if_idle(PyObject *runner, PyObject *unused)
{
    (void)unused;
    EngineObject *self = FACET(runner);
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

static PyObject *release(PyObject *runner, PyObject *unused)
{
    (void)unused;
    EngineObject *self = FACET(runner);
    atomic_store(&self->inline_call, 0);
    fc_service_release(&self->service);
    Py_RETURN_NONE;
}

static PyObject *spec(PyObject *runner, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    EngineObject *self = FACET(runner);
    return py_usable(self) ? py_spec_new(self, args, nargs, kwnames) : NULL;
}

/* run(spec, seq, src, dst): the OpSpec's collective as call `seq` with these buffers, on this
 * thread, which holds the run lock; NativeError if it fails. A traced spec's run returns its
 * phases (py_trace.c), and a failed one's NativeError carries them. */
static PyObject *run(PyObject *runner, PyObject *const *args, Py_ssize_t nargs)
{
    EngineObject *self = FACET(runner);
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "run(spec, seq, src, dst)");
    if (!py_usable(self))
        return NULL;
    py_op o;
    if (py_spec_bind(args[0], &self->engine, args[1], args[2], args[3], &o))
        return NULL;
    fc_call c;
    fc_err err;
    py_trace pt;
    py_op_call(&o, &self->engine, &c, &err);
    if (o.trace && py_trace_begin(&pt)) {
        py_op_unbind(&o);
        return NULL;
    }
    c.trace = o.trace ? &pt.t : NULL;
    WAIT_BEGIN(self)
    int rc = fc_run(&c, &o.op);
    WAIT_END(self)
    py_op_unbind(&o);
    if (rc) {
        atomic_store(&self->failed, 1);
        return o.trace ? py_trace_raise(&pt, &err) : py_raise(&err);
    }
    return o.trace ? py_trace_end(&pt) : Py_NewRef(Py_None);
}

static PyObject *submit(PyObject *runner, PyObject *const *args, Py_ssize_t nargs)
{
    EngineObject *self = FACET(runner);
    return py_usable(self) ? py_submit_op(self, args, nargs) : NULL;
}

static PyObject *submit_call(PyObject *runner, PyObject *fn)
{
    EngineObject *self = FACET(runner);
    return py_usable(self) ? py_submit_call(self, fn) : NULL;
}

static PyObject *on_failure(PyObject *runner, PyObject *fn)
{
    EngineObject *self = FACET(runner);
    Py_XSETREF(self->on_failure, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *graph_open(PyObject *runner, PyObject *args, PyObject *kw)
{
    EngineObject *self = FACET(runner);
    PyObject *capsule = py_usable(self) ? py_graph_open(self, args, kw) : NULL;
    return capsule ? py_graph_table_new(self, capsule) : NULL;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef runner_methods[] = {
    {"claim_if_idle", claim_if_idle, METH_NOARGS, "True: the run lock is this thread's (nothing queued or running)"},
    {"release", release, METH_NOARGS, "give back the run lock claim_if_idle took"},
    {"spec", FASTCALL(spec), METH_FASTCALL | METH_KEYWORDS, "spec(**fields) -> OpSpec (see OpSpec)"},
    {"run", FASTCALL(run), METH_FASTCALL, "run(spec, seq, src, dst): the call on this thread, which holds the lock (a traced spec: its phases)"},
    {"submit", FASTCALL(submit), METH_FASTCALL, "submit(spec, seq, src, dst, task, work) -> Completion"},
    {"submit_call", submit_call, METH_O, "submit_call(fn) -> Completion: fn() behind the queued calls"},
    {"on_failure", on_failure, METH_O, "on_failure(fn): fn(task, work, info, waited) when a queued call fails"},
    {"graph_open", FASTCALL(graph_open), METH_VARARGS | METH_KEYWORDS,
     "graph_open(*, prefix, ranks, rank, limit, piece_bytes, all_reduce, all_gather, labels, dtype_names, "
     "op_names, trace_calls=0, trace_phases=0) -> GraphTable (its capsule; trace())"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_runner_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Runner",
    .tp_basicsize = sizeof(py_facet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An Engine's collectives (Engine.runner).",
    .tp_dealloc = py_facet_dealloc,
    .tp_methods = runner_methods,
};
