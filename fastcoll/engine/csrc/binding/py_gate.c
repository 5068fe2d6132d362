/* The Engine's half of the fence gate's host mode: the control page attached, releases, the
 * profile's records, gates queued for the service thread (fc_gate.c does the work). */
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

/* attach_gate(page, layout, start_seq, profile): the control page (a writable buffer) and its
 * layout (fastcoll/gate/protocol/layout.py's ControlLayout). */
PyObject *py_attach_gate(EngineObject *self, PyObject *args)
{
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

/* gate_release(seq, status): store STATUS then RELEASE (sticky, never backwards). */
PyObject *py_gate_release(EngineObject *self, PyObject *args)
{
    unsigned int seq, status;
    if (!PyArg_ParseTuple(args, "II", &seq, &status) || !gated(self))
        return NULL;
    fc_gate_release(&self->gate, seq, status);
    Py_RETURN_NONE;
}

PyObject *py_gate_outstanding(EngineObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(self->gated ? atomic_load(&self->gate.outstanding) : 0);
}

PyObject *py_gate_stop(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (self->gated)
        atomic_store(&self->gate.stop, 1);
    Py_RETURN_NONE;
}

/* gate_timings() -> [(seq, arrival_us, exchange_us, host_us, release_us, spin_iters), ...] */
PyObject *py_gate_timings(EngineObject *self, PyObject *unused)
{
    (void)unused;
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

PyObject *py_gate_submit(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return gated(self) ? py_submit_gate(self, args, nargs) : NULL;
}

PyObject *py_gate_submit_planned(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return gated(self) ? py_submit_planned_gate(self, args, nargs) : NULL;
}
