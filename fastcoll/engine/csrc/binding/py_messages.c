/* The Links' message calls, which fastcoll/engine/native.py's NativeTransport makes for the
 * Python schedules that run over the native links: send, flush, the next header, its payload. */
#include "py_common.h"

static int peer_ok(EngineObject *self, int peer, long long chunk)
{
    if (peer < 0 || peer >= self->engine.size || peer == self->engine.rank || chunk < 0) {
        PyErr_SetString(PyExc_ValueError, "bad peer or chunk");
        return 0;
    }
    if (!fc_chan_of(&self->engine, peer, chunk)->open) {
        PyErr_Format(PyExc_ValueError, "no link to rank %d on chunk %lld's channel was added", peer, chunk);
        return 0;
    }
    return 1;
}

/* send(peer, kind, seq, sig, chunk, payload): queue a frame; the payload (a buffer, or None)
 * must stay alive and unchanged until flush() returns. */
PyObject *py_send(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer, kind;
    long long seq, chunk;
    Py_buffer sig, payload = {0};
    PyObject *obj;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "iiLy*LO", &peer, &kind, &seq, &sig, &chunk, &obj))
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
PyObject *py_send_raw(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer;
    Py_buffer data;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "iy*", &peer, &data))
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

PyObject *py_flush(PyObject *links, PyObject *arg)
{
    EngineObject *self = FACET(links);
    double seconds = PyFloat_AsDouble(arg);
    if ((seconds == -1.0 && PyErr_Occurred()) || !py_usable(self))
        return NULL;
    fc_err err;
    fc_ns deadline = fc_deadline_in(seconds);
    WAIT_BEGIN(self)
    int rc = fc_engine_flush(&self->engine, deadline, &err);
    WAIT_END(self)
    return rc ? py_raise(&err) : Py_NewRef(Py_None);
}

/* next_header(peer, chunk, seconds) -> (kind, seq, sig, chunk, nbytes) */
PyObject *py_next_header(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer;
    long long chunk;
    double seconds;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "iLd", &peer, &chunk, &seconds) || !peer_ok(self, peer, chunk))
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
PyObject *py_read_payload(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer;
    long long chunk;
    double seconds;
    Py_buffer out;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "iLw*d", &peer, &chunk, &out, &seconds))
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

PyObject *py_keep_unread(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer;
    long long chunk;
    if (!py_usable(self) || !PyArg_ParseTuple(args, "iL", &peer, &chunk) || !peer_ok(self, peer, chunk))
        return NULL;
    fc_engine_keep_unread(&self->engine, peer, chunk);
    Py_RETURN_NONE;
}

