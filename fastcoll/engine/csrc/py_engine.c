/* The Engine type: this rank's links handed over from Python, the message calls the pure-Python
 * schedules use, inline runs of a whole collective, queued calls and gates (the gate's other
 * calls: py_gate.c; the end: py_close.c). */
#include "py_common.h"

#include <string.h>

/* Release the GIL for a wait; on the main thread, let the wait run Python's signal handlers. */
#define WAIT_BEGIN(self)                                                     \
    py_signals sigs_;                                                        \
    int main_ = PyThread_get_thread_ident() == (self)->main_thread;          \
    sigs_.ts = PyEval_SaveThread();                                          \
    if (main_) {                                                             \
        (self)->engine.check_signals = py_check_signals;                     \
        (self)->engine.signals_ctx = &sigs_;                                 \
    }
#define WAIT_END(self)                       \
    (self)->engine.check_signals = NULL;     \
    (self)->engine.signals_ctx = NULL;       \
    PyEval_RestoreThread(sigs_.ts);

/* Whether the engine takes calls: once closed, NativeError(FC_E_SHUT), which Python reports as
 * "this group was finalized" (a thread that passed its group's check as finalize() began). */
int py_engine_usable(EngineObject *self)
{
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine is not set up");
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
    self->ready = 1;
    return 0;
}

/* add_link(peer, channel, fd, segment, tx_offset, rx_offset, capacity): the engine takes the
 * connected socket fd; for shared memory `segment` is the mapping holding both rings. */
static PyObject *add_link(EngineObject *self, PyObject *args)
{
    int peer, ch, fd;
    PyObject *segment;
    Py_ssize_t tx_off, rx_off, cap;
    if (!PyArg_ParseTuple(args, "iiiOnnn", &peer, &ch, &fd, &segment, &tx_off, &rx_off, &cap) || !py_engine_usable(self))
        return NULL;
    uint8_t *tx = NULL, *rx = NULL;
    if (segment != Py_None) {
        Py_buffer *more = PyMem_Realloc(self->segments, (self->nsegments + 1) * sizeof *more);
        if (!more)
            return PyErr_NoMemory();
        self->segments = more;
        Py_buffer *v = &self->segments[self->nsegments];
        if (PyObject_GetBuffer(segment, v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
            return NULL;
        Py_ssize_t need = FC_RING_CONTROL + cap;
        if (cap <= 0 || tx_off < 0 || rx_off < 0 || tx_off % 8 || rx_off % 8 || tx_off + need > v->len ||
            rx_off + need > v->len || (tx_off < rx_off + need && rx_off < tx_off + need)) {
            PyBuffer_Release(v);
            PyErr_SetString(PyExc_ValueError, "the rings do not fit the segment apart from each other");
            return NULL;
        }
        self->nsegments++;
        tx = (uint8_t *)v->buf + tx_off;
        rx = (uint8_t *)v->buf + rx_off;
    }
    if (fc_engine_add_link(&self->engine, peer, ch, fd, tx, rx, (size_t)cap)) {
        PyErr_SetString(PyExc_ValueError, "bad peer or channel, or one added twice");
        return NULL;
    }
    Py_RETURN_NONE;
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
    if (!py_engine_usable(self))
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
 * src, dst, root, bounds, recv_bounds): run a collective on this thread, which holds the run
 * lock; NativeError if it fails. */
static PyObject *run(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != PY_OP_ARGS)
        return PyErr_Format(PyExc_TypeError, "run takes %d arguments", PY_OP_ARGS);
    if (!py_engine_usable(self))
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
    return py_engine_usable(self) ? py_run_planned(self, args, nargs) : NULL;
}

static PyObject *submit(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return py_engine_usable(self) ? py_submit_op(self, args, nargs) : NULL;
}

static PyObject *submit_call(EngineObject *self, PyObject *fn)
{
    return py_engine_usable(self) ? py_submit_call(self, fn) : NULL;
}

/* ----- the message calls (fastcoll/engine/native.py's NativeTransport) ----- */

static int peer_ok(EngineObject *self, int peer, long long chunk)
{
    if (peer < 0 || peer >= self->engine.size || peer == self->engine.rank || chunk < 0) {
        PyErr_SetString(PyExc_ValueError, "bad peer or chunk");
        return 0;
    }
    return 1;
}

/* send(peer, kind, seq, sig, chunk, payload): queue a frame; the payload (a buffer, or None)
 * must stay alive and unchanged until flush() returns. */
static PyObject *send(EngineObject *self, PyObject *args)
{
    int peer, kind;
    long long seq, chunk;
    Py_buffer sig, payload = {0};
    PyObject *obj;
    if (!py_engine_usable(self) || !PyArg_ParseTuple(args, "iiLy*LO", &peer, &kind, &seq, &sig, &chunk, &obj))
        return NULL;
    int ok = peer >= 0 && peer < self->engine.size && peer != self->engine.rank && kind >= FC_DATA &&
             kind <= FC_CLOSE && chunk >= 0;
    if (ok && obj != Py_None && PyObject_GetBuffer(obj, &payload, PyBUF_C_CONTIGUOUS)) {
        PyBuffer_Release(&sig);
        return NULL;
    }
    fc_err err;
    fc_err_set(&err, FC_OK, -1);
    int rc = !ok ? 1
                 : fc_engine_send(&self->engine, peer, kind, seq, sig.buf, (size_t)sig.len, chunk, payload.buf,
                                  (size_t)payload.len, &err);
    PyBuffer_Release(&sig);
    if (payload.obj)
        PyBuffer_Release(&payload);
    if (rc > 0)
        return PyErr_Format(PyExc_ValueError, "bad peer, kind or chunk");
    return rc ? py_raise(&err) : Py_NewRef(Py_None);
}

/* send_raw(peer, data), for tests: `data` as it is on channel 0 to peer (a frame of a
 * misbehaving peer: malformed, or cut short). */
static PyObject *send_raw(EngineObject *self, PyObject *args)
{
    int peer;
    Py_buffer data;
    if (!py_engine_usable(self) || !PyArg_ParseTuple(args, "iy*", &peer, &data))
        return NULL;
    if (!peer_ok(self, peer, 0)) {
        PyBuffer_Release(&data);
        return NULL;
    }
    fc_link *l = &self->engine.chans[peer * self->engine.channels].link;
    int rc = l->send_errno ? 0 : fc_link_queue(l, data.buf, (size_t)data.len, NULL, 0);
    PyBuffer_Release(&data);
    if (rc)
        return PyErr_NoMemory();
    fc_link_push(l);
    Py_RETURN_NONE;
}

static PyObject *flush(EngineObject *self, PyObject *arg)
{
    double seconds = PyFloat_AsDouble(arg);
    if ((seconds == -1.0 && PyErr_Occurred()) || !py_engine_usable(self))
        return NULL;
    fc_err err;
    fc_ns deadline = fc_deadline_in(seconds);
    WAIT_BEGIN(self)
    int rc = fc_engine_flush(&self->engine, deadline, &err);
    WAIT_END(self)
    return rc ? py_raise(&err) : Py_NewRef(Py_None);
}

/* next_header(peer, chunk, seconds) -> (kind, seq, sig, chunk, nbytes) */
static PyObject *next_header(EngineObject *self, PyObject *args)
{
    int peer;
    long long chunk;
    double seconds;
    if (!py_engine_usable(self) || !PyArg_ParseTuple(args, "iLd", &peer, &chunk, &seconds) || !peer_ok(self, peer, chunk))
        return NULL;
    fc_err err;
    fc_header h;
    fc_ns deadline = fc_deadline_in(seconds);
    WAIT_BEGIN(self)
    int rc = fc_engine_next_header(&self->engine, peer, chunk, deadline, &h, &err);
    WAIT_END(self)
    if (rc)
        return py_raise(&err);
    return Py_BuildValue("(iLy#LL)", h.kind, (long long)h.seq, h.sig, (Py_ssize_t)h.sig_len,
                         (long long)h.chunk, (long long)h.nbytes);
}

/* read_payload(peer, chunk, out, seconds): the payload after the header just taken. */
static PyObject *read_payload(EngineObject *self, PyObject *args)
{
    int peer;
    long long chunk;
    double seconds;
    Py_buffer out;
    if (!py_engine_usable(self) || !PyArg_ParseTuple(args, "iLw*d", &peer, &chunk, &out, &seconds))
        return NULL;
    if (!peer_ok(self, peer, chunk)) {
        PyBuffer_Release(&out);
        return NULL;
    }
    fc_err err;
    fc_ns deadline = fc_deadline_in(seconds);
    WAIT_BEGIN(self)
    int rc = fc_engine_read_payload(&self->engine, peer, chunk, out.buf, (size_t)out.len, deadline, &err);
    WAIT_END(self)
    PyBuffer_Release(&out);
    return rc ? py_raise(&err) : Py_NewRef(Py_None);
}

static PyObject *keep_unread(EngineObject *self, PyObject *args)
{
    int peer;
    long long chunk;
    if (!py_engine_usable(self) || !PyArg_ParseTuple(args, "iL", &peer, &chunk) || !peer_ok(self, peer, chunk))
        return NULL;
    fc_engine_keep_unread(&self->engine, peer, chunk);
    Py_RETURN_NONE;
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

/* ----- the gate (py_gate.c) ----- */

static PyObject *gate_submit(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return py_gate_ready(self) ? py_submit_gate(self, args, nargs) : NULL;
}

static PyObject *graph_open(EngineObject *self, PyObject *args)
{
    return py_engine_usable(self) ? py_graph_open(self, args) : NULL;
}

static PyObject *gate_submit_planned(EngineObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return py_gate_ready(self) ? py_submit_planned_gate(self, args, nargs) : NULL;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef engine_methods[] = {
    {"add_link", (PyCFunction)add_link, METH_VARARGS, "add_link(peer, channel, fd, segment, tx_offset, rx_offset, capacity)"},
    {"set_failure_handler", (PyCFunction)set_failure_handler, METH_O, "on_failure(task, work, info, waited)"},
    {"claim_if_idle", (PyCFunction)claim_if_idle, METH_NOARGS, "True: run the next call on this thread"},
    {"release", (PyCFunction)release, METH_NOARGS, "give back the run lock claim_if_idle took"},
    {"run", FASTCALL(run), METH_FASTCALL, "run a collective on this thread (17 arguments, see py_common.h)"},
    {"run_planned", FASTCALL(run_planned), METH_FASTCALL, "run_planned(plan, seq, src, dst): a planned call, here"},
    {"submit", FASTCALL(submit), METH_FASTCALL, "queue a collective (17 arguments, task, work): a Completion"},
    {"submit_call", (PyCFunction)submit_call, METH_O, "queue a Python function behind the queued calls"},
    {"send", (PyCFunction)send, METH_VARARGS, "send(peer, kind, seq, sig, chunk, payload)"},
    {"send_raw", (PyCFunction)send_raw, METH_VARARGS, "send_raw(peer, data): for tests, bytes as they are"},
    {"flush", (PyCFunction)flush, METH_O, "flush(seconds)"},
    {"next_header", (PyCFunction)next_header, METH_VARARGS, "next_header(peer, chunk, seconds)"},
    {"read_payload", (PyCFunction)read_payload, METH_VARARGS, "read_payload(peer, chunk, out, seconds)"},
    {"keep_unread", (PyCFunction)keep_unread, METH_VARARGS, "keep_unread(peer, chunk)"},
    {"abort", (PyCFunction)py_engine_abort, METH_VARARGS, "abort(frame, seconds)"},
    {"interrupt", (PyCFunction)interrupt, METH_NOARGS, "end the call under way at its next wait"},
    {"close", (PyCFunction)py_engine_close, METH_VARARGS, "close(flush_seconds, linger_seconds)"},
    {"attach_gate", (PyCFunction)py_attach_gate, METH_VARARGS, "the gate's control page and layout"},
    {"gate_release", (PyCFunction)py_gate_release, METH_VARARGS, "gate_release(seq, status)"},
    {"gate_stop", (PyCFunction)py_gate_stop, METH_NOARGS, "stop waiting for arrivals"},
    {"gate_outstanding", (PyCFunction)py_gate_outstanding, METH_NOARGS, "gates queued and not yet served"},
    {"gate_timings", (PyCFunction)py_gate_timings, METH_NOARGS, "the profile's new records"},
    {"gate_submit", FASTCALL(gate_submit), METH_FASTCALL, "queue a gate (seq, nbytes, 17 arguments, task, work)"},
    {"gate_submit_planned", FASTCALL(gate_submit_planned), METH_FASTCALL,
     "queue a gate (plan, call_seq, gate_seq, nbytes, task, work): the exchange planned"},
    {"graph_open", (PyCFunction)graph_open, METH_VARARGS,
     "graph_open(prefix, ranks, rank, limit, piece_bytes, all_reduce, all_gather, labels): the graph table"},
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
