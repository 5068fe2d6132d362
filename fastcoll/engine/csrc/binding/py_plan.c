/* A Plan: the fixed part of a call that repeats (a training or decode loop makes the same call
 * with new buffers), parsed and checked once; Engine.run_planned then takes only the sequence
 * number and the buffers. */
#include "py_common.h"

/* Not tracked by the garbage collector (it holds no container that could make a cycle): a
 * group keeps a few of these for as long as it lives. */
typedef struct {
    PyObject_HEAD
    py_op fixed;
    PyObject *text; /* the signature as Python wrote it, for the errors a run may raise */
    int ready;
} PlanObject;

/* Plan(kind, algorithm, sig, limit, rank, size, ranks, piece_bytes, dtype, reduce, itemsize,
 * root, job_size, job_rank, text) */
static int plan_init(PlanObject *self, PyObject *args, PyObject *kw)
{
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Plan takes positional arguments only");
        return -1;
    }
    if (PyTuple_GET_SIZE(args) != 15 || !PyUnicode_Check(PyTuple_GET_ITEM(args, 14))) {
        PyErr_SetString(PyExc_TypeError, "Plan takes 15 arguments, the last a str");
        return -1;
    }
    PyObject *const *a = &PyTuple_GET_ITEM(args, 0);
    Py_XSETREF(self->text, Py_NewRef(a[14]));
    long job_size = PyLong_AsLong(a[12]), job_rank = PyLong_AsLong(a[13]);
    if (PyErr_Occurred())
        return -1;
    if (self->ready)
        py_op_release(&self->fixed);
    self->ready = 0;
    PyObject *zero = PyLong_FromLong(0);
    if (!zero)
        return -1;
    /* the fixed arguments in py_op_fix's order, with sequence number 0 (each run gives its own) */
    PyObject *fixed[13] = {a[0], a[1], zero, a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]};
    int rc = py_op_fix(&self->fixed, fixed, (int)job_size, (int)job_rank);
    Py_DECREF(zero);
    if (rc) {
        py_op_release(&self->fixed);
        return -1;
    }
    self->ready = 1;
    return 0;
}

static void plan_dealloc(PlanObject *self)
{
    if (self->ready)
        py_op_release(&self->fixed);
    Py_CLEAR(self->text);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *plan_sig(PlanObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(self->text ? self->text : Py_None);
}

static PyGetSetDef plan_getset[] = {
    {"sig", (getter)plan_sig, NULL, "the planned call's signature", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject py_plan_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(kind, algorithm, sig, limit, rank, size, ranks, piece_bytes, dtype, reduce, itemsize, "
              "root, job_size, job_rank, text): a call's fixed part, for Engine.run_planned.",
    .tp_getset = plan_getset,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)plan_init,
    .tp_dealloc = (destructor)plan_dealloc,
};

const py_op *py_plan_fixed(PyObject *obj, const fc_engine *e)
{
    if (!PyObject_TypeCheck(obj, &py_plan_type)) {
        PyErr_SetString(PyExc_TypeError, "expected a Plan");
        return NULL;
    }
    PlanObject *plan = (PlanObject *)obj;
    if (!plan->ready || plan->fixed.size > e->size) {
        PyErr_SetString(PyExc_ValueError, "a Plan that was not made for this engine");
        return NULL;
    }
    return &plan->fixed;
}

/* run_planned(plan, seq, src, dst): run the planned call with these buffers on this thread,
 * which holds the run lock (even bounds); NativeError if it fails. */
PyObject *py_run_planned(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "run_planned(plan, seq, src, dst)");
    const py_op *fixed = py_plan_fixed(args[0], &self->engine);
    long long seq = PyLong_AsLongLong(args[1]);
    if (!fixed || (seq == -1 && PyErr_Occurred()))
        return NULL;
    py_op o = *fixed; /* shares the plan's signature and ranks; owns only its buffers */
    o.seq = seq;
    o.held = 0;
    o.even[0] = o.even[1] = NULL;
    if (py_op_bind(&o, args[2], args[3], Py_None, Py_None)) {
        py_op_unbind(&o);
        return NULL;
    }
    fc_call c;
    fc_err err;
    py_op_call(&o, &self->engine, &c, &err);
    py_signals sigs;
    int main = PyThread_get_thread_ident() == self->main_thread;
    sigs.ts = PyEval_SaveThread();
    if (main) {
        self->engine.check_signals = py_check_signals;
        self->engine.signals_ctx = &sigs;
    }
    int rc = fc_run(&c, &o.op);
    self->engine.check_signals = NULL;
    self->engine.signals_ctx = NULL;
    PyEval_RestoreThread(sigs.ts);
    py_op_unbind(&o);
    if (rc) {
        atomic_store(&self->failed, 1);
        return py_raise(&err);
    }
    Py_RETURN_NONE;
}
