/* The GateHost: an Engine's half of the fence gate's host mode (Engine.gate): the control page
 * attached, releases, the profile's records, gates queued for the service thread (fc_gate.c
 * does the work). */
#include "py_common.h"

/* attach(page, arrival, release, status, ack, spin_iters, spin_failed, send_offset,
 * recv_offset, mailbox_bytes, ranks, ok, error, closed, start_seq, profile) */
static PyObject *attach(PyObject *gate, PyObject *args)
{
    EngineObject *self = FACET(gate);
    fc_gate_layout l;
    Py_ssize_t w[6], off[3];
    unsigned int ok, error, closed, start;
    int ranks, profile;
    PyObject *page;
    if (!py_usable(self) ||
        !PyArg_ParseTuple(args, "Onnnnnnnnniiiiip", &page, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &off[0],
                          &off[1], &off[2], &ranks, &ok, &error, &closed, &start, &profile))
        return NULL;
    if (self->gated)
        return PyErr_Format(PyExc_RuntimeError, "a gate is attached already");
    if (PyObject_GetBuffer(page, &self->page, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        return NULL;
    Py_ssize_t most = 0;
    for (int i = 0; i < 6; i++)
        most = w[i] > most ? w[i] : most;
    int bad = ranks < 1 || off[2] < 0 || (uintptr_t)self->page.buf % 4 || 4 * most + 4 > self->page.len ||
              off[0] < 0 || off[0] + off[2] > self->page.len || off[1] < 0 ||
              off[1] + (Py_ssize_t)ranks * off[2] > self->page.len;
    for (int i = 0; i < 6; i++)
        bad |= w[i] < 0;
    if (bad) {
        PyBuffer_Release(&self->page);
        return PyErr_Format(PyExc_ValueError, "the gate's words or mailboxes lie outside its page");
    }
    l = (fc_gate_layout){(size_t)w[0], (size_t)w[1], (size_t)w[2], (size_t)w[3], (size_t)w[4], (size_t)w[5],
                         (size_t)off[0], (size_t)off[1], (size_t)off[2], ranks, ok, error, closed};
    if (fc_gate_init(&self->gate, self->page.buf, &l, start, profile)) {
        PyBuffer_Release(&self->page);
        return PyErr_NoMemory();
    }
    self->gated = 1;
    Py_RETURN_NONE;
}

static int gated(EngineObject *self)
{
    if (!self->gated) {
        PyErr_SetString(PyExc_RuntimeError, "no gate is attached");
        return 0;
    }
    return py_usable(self);
}

/* release(seq, status): store STATUS then RELEASE (sticky, never backwards). */
static PyObject *release(PyObject *gate, PyObject *args)
{
    EngineObject *self = FACET(gate);
    unsigned int seq, status;
    if (!PyArg_ParseTuple(args, "II", &seq, &status) || !gated(self))
        return NULL;
    fc_gate_release(&self->gate, seq, status);
    Py_RETURN_NONE;
}

static PyObject *outstanding(PyObject *gate, PyObject *unused)
{
    (void)unused;
    EngineObject *self = FACET(gate);
    return PyLong_FromLong(self->gated ? atomic_load(&self->gate.outstanding) : 0);
}

static PyObject *stop(PyObject *gate, PyObject *unused)
{
    (void)unused;
    EngineObject *self = FACET(gate);
    if (self->gated)
        atomic_store(&self->gate.stop, 1);
    Py_RETURN_NONE;
}

/* timings() -> [(seq, arrival_us, exchange_us, host_us, release_us, spin_iters), ...] */
static PyObject *timings(PyObject *gate, PyObject *unused)
{
    (void)unused;
    EngineObject *self = FACET(gate);
    if (!gated(self))
        return NULL;
    PyObject *list = PyList_New(0);
    fc_gate_timing t[64];
    size_t n;
    while (list && (n = fc_gate_take_timings(&self->gate, t, 64)) > 0) {
        for (size_t i = 0; i < n; i++) {
            PyObject *row = Py_BuildValue("(IddddI)", t[i].seq, t[i].arrival_us, t[i].exchange_us, t[i].host_us,
                                          t[i].release_us, t[i].spin_iters);
            if (!row || PyList_Append(list, row)) {
                Py_XDECREF(row);
                Py_CLEAR(list);
                break;
            }
            Py_DECREF(row);
        }
    }
    return list;
}

static PyObject *submit(PyObject *gate, PyObject *const *args, Py_ssize_t nargs)
{
    EngineObject *self = FACET(gate);
    return gated(self) ? py_submit_gate(self, args, nargs) : NULL;
}

static PyMethodDef gate_methods[] = {
    {"attach", attach, METH_VARARGS, "the gate's control page and layout"},
    {"release", release, METH_VARARGS, "release(seq, status)"},
    {"stop", stop, METH_NOARGS, "stop waiting for arrivals"},
    {"outstanding", outstanding, METH_NOARGS, "gates queued and not yet served"},
    {"timings", timings, METH_NOARGS, "the profile's new records"},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
     "submit(spec, call_seq, gate_seq, nbytes, task, work) -> Completion: a gate, its exchange the spec's"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_gate_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.GateHost",
    .tp_basicsize = sizeof(py_facet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An Engine's half of the fence gate's host mode (Engine.gate).",
    .tp_dealloc = py_facet_dealloc,
    .tp_methods = gate_methods,
};
