/* The GateHost: an Engine's half of the fence gate's host mode (Engine.gate): the control page
 * attached, releases, the profile's records, gates queued for the service thread (fc_gate.c
 * does the work). */
#include "py_common.h"

#include <limits.h>

#include "gate/fc_gate_page.h"

/* One size of the gate's layout, read by name. */
static int layout_size(PyObject *layout, const char *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttrString(layout, name);
    if (!v)
        return -1;
    *out = PyNumber_AsSsize_t(v, PyExc_OverflowError);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The layout of a page of `len` bytes, from `layout` (a ControlLayout: its send_offset,
 * recv_offset, mailbox_bytes and ranks); the words and status codes are this build's
 * gate/fc_gate_page.h, generated from the same file. 0, or -1 with an exception set. */
static int layout_of(PyObject *layout, Py_ssize_t len, fc_gate_layout *l)
{
    static const size_t WORDS[] = {FC_PAGE_ARRIVAL, FC_PAGE_RELEASE, FC_PAGE_STATUS,
                                   FC_PAGE_ACK,     FC_PAGE_SPIN_ITERS, FC_PAGE_SPIN_FAILED};
    Py_ssize_t send, recv, mailbox, ranks;
    if (layout_size(layout, "send_offset", &send) || layout_size(layout, "recv_offset", &recv) ||
        layout_size(layout, "mailbox_bytes", &mailbox) || layout_size(layout, "ranks", &ranks))
        return -1;
    if (send != FC_PAGE_SEND_OFFSET) {
        PyErr_Format(PyExc_ValueError, "the layout's send mailbox is at byte %zd, this build's at %u: rebuild the engine",
                     send, FC_PAGE_SEND_OFFSET);
        return -1;
    }
    size_t most = 0;
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++)
        most = WORDS[i] > most ? WORDS[i] : most;
    if (ranks < 1 || ranks > INT_MAX || mailbox < 0 || (Py_ssize_t)(4 * most + 4) > len || send + mailbox > len ||
        recv < 0 || recv > len || (mailbox > 0 && ranks > (len - recv) / mailbox)) {
        PyErr_SetString(PyExc_ValueError, "the gate's words or mailboxes lie outside its page");
        return -1;
    }
    *l = (fc_gate_layout){FC_PAGE_ARRIVAL, FC_PAGE_RELEASE, FC_PAGE_STATUS, FC_PAGE_ACK, FC_PAGE_SPIN_ITERS,
                          FC_PAGE_SPIN_FAILED, (size_t)send, (size_t)recv, (size_t)mailbox, (int)ranks,
                          FC_PAGE_OK, FC_PAGE_ERROR, FC_PAGE_CLOSED};
    return 0;
}

/* attach(page, layout, start_seq, profile): the control page (a writable buffer) and its
 * layout (fastcoll/gate/protocol/layout.py's ControlLayout). */
static PyObject *attach(PyObject *gate, PyObject *args)
{
    EngineObject *self = FACET(gate);
    fc_gate_layout l;
    unsigned int start;
    int profile;
    PyObject *page, *layout;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "OOIp", &page, &layout, &start, &profile))
        return NULL;
    if (self->gated)
        return PyErr_Format(PyExc_RuntimeError, "a gate is attached already");
    if (PyObject_GetBuffer(page, &self->page, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        return NULL;
    if ((uintptr_t)self->page.buf % 4) {
        PyBuffer_Release(&self->page);
        return PyErr_Format(PyExc_ValueError, "the gate's page is not aligned to its 32-bit words");
    }
    if (layout_of(layout, self->page.len, &l)) {
        PyBuffer_Release(&self->page);
        return NULL;
    }
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
