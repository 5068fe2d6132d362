/* The Links: an Engine's links, handed over from Python (add), what carries each (info), and the
 * message calls of the pure-Python schedules (py_messages.c); the kinds this build has
 * (the module's link_kinds()). */
#include "py_common.h"

#include <string.h>

#include "links/fc_shmring.h"

/* The registry's names as a tuple: what link_kinds() returns. */
static PyObject *kind_names(void)
{
    size_t n = 0;
    while (fc_link_kind_at(n))
        n++;
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(fc_link_kind_at(i)->name);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, s);
    }
    return t;
}

PyObject *py_link_kinds(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return kind_names();
}

/* The kind named `name`, or NULL with a ValueError naming it and the kinds this build has. */
static const fc_link_kind *kind_of(const char *name)
{
    const fc_link_kind *k = fc_link_kind_named(name);
    if (k)
        return k;
    PyObject *have = kind_names(), *sep = PyUnicode_FromString(", ");
    PyObject *list = have && sep ? PyUnicode_Join(sep, have) : NULL;
    if (list)
        PyErr_Format(PyExc_ValueError, "no link kind '%s' in this build (it has %U)", name, list);
    Py_XDECREF(list);
    Py_XDECREF(sep);
    Py_XDECREF(have);
    return NULL;
}

/* Hold `segment` until the engine's end and point p's rings into it: two rings of
 * FC_RING_CONTROL + cap bytes each, apart. 0, or -1 with a Python error. */
static int hold_segment(EngineObject *self, PyObject *segment, Py_ssize_t tx_off, Py_ssize_t rx_off,
                        Py_ssize_t cap, fc_link_params *p)
{
    Py_buffer *more = PyMem_Realloc(self->segments, (self->nsegments + 1) * sizeof *more);
    if (!more) {
        PyErr_NoMemory();
        return -1;
    }
    self->segments = more;
    Py_buffer *v = &self->segments[self->nsegments];
    if (PyObject_GetBuffer(segment, v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
        return -1;
    Py_ssize_t need = FC_RING_CONTROL + cap;
    if (cap <= 0 || cap > PY_SSIZE_T_MAX / 4 || tx_off < 0 || rx_off < 0 || tx_off % 8 || rx_off % 8 ||
        tx_off > v->len - need || rx_off > v->len - need || (tx_off < rx_off + need && rx_off < tx_off + need)) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_ValueError, "the rings do not fit the segment apart from each other");
        return -1;
    }
    self->nsegments++;
    p->tx_mem = (uint8_t *)v->buf + tx_off;
    p->rx_mem = (uint8_t *)v->buf + rx_off;
    p->cap = (size_t)cap;
    return 0;
}

/* Open the link without the GIL (a kind's open may wait for its peer); None, or an error: a bad
 * peer or channel is a ValueError, a failed open a RuntimeError with the kind's reason. */
static PyObject *open_link(EngineObject *self, int peer, int ch, const fc_link_kind *kind, const fc_link_params *p)
{
    char why[256] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_engine_add_link(&self->engine, peer, ch, kind, p, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc == -1)
        return PyErr_Format(PyExc_ValueError, "bad peer %d or channel %d, or a link added there twice", peer, ch);
    if (rc)
        return PyErr_Format(PyExc_RuntimeError, "the %s link to rank %d could not open: %s", kind->name, peer,
                            why[0] ? why : "no reason given");
    Py_RETURN_NONE;
}

/* add(peer, channel, fd, *, kind="tcp", segment=None, tx_offset=0, rx_offset=0, capacity=0,
 * device=None, library=None, reliable=False, setup_timeout=10.0, same_host=False): the engine
 * takes the connected socket fd (not on failure); shared memory's `segment` is the mapping that
 * holds both rings; a verbs link's `same_host` says its peer runs on this machine. */
static PyObject *add(PyObject *links, PyObject *args, PyObject *kw)
{
    EngineObject *self = FACET(links);
    static char *kwlist[] = {"peer", "channel", "fd", "kind", "segment", "tx_offset", "rx_offset", "capacity",
                             "device", "library", "reliable", "setup_timeout", "same_host", NULL};
    int peer, ch, reliable = 0, same_host = 0;
    const char *name = "tcp";
    PyObject *segment = Py_None;
    Py_ssize_t tx_off = 0, rx_off = 0, cap = 0;
    double setup = 10.0;
    fc_link_params p;
    memset(&p, 0, sizeof p);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|$sOnnnzzpdp", kwlist, &peer, &ch, &p.fd, &name, &segment,
                                     &tx_off, &rx_off, &cap, &p.device, &p.library, &reliable, &setup,
                                     &same_host))
        return NULL;
    const fc_link_kind *kind = py_usable(self) ? kind_of(name) : NULL;
    if (!kind)
        return NULL;
    if (!(setup >= 0 && setup <= 86400.0)) {
        PyErr_SetString(PyExc_ValueError, "setup_timeout must be 0 to 86400 seconds");
        return NULL;
    }
    p.reliable = reliable;
    p.same_host = same_host;
    p.setup_ns = (int64_t)(setup * 1e9);
    if (segment != Py_None && hold_segment(self, segment, tx_off, rx_off, cap, &p))
        return NULL;
    return open_link(self, peer, ch, kind, &p);
}

/* info(peer, channel) -> (kind, detail): what carries the link to `peer` on `channel`, for
 * transport_info() (detail: the kind's own words, e.g. "mlx5_0, UC, MTU 1024"; "" where its name
 * says it all). */
static PyObject *info(PyObject *links, PyObject *args)
{
    EngineObject *self = FACET(links);
    int peer, ch;
    if (!PyArg_ParseTuple(args, "ii", &peer, &ch))
        return NULL;
    if (!self->ready || atomic_load(&self->closed)) {
        PyErr_SetString(PyExc_RuntimeError, "the native engine is closed");
        return NULL;
    }
    fc_engine *e = &self->engine;
    if (peer < 0 || peer >= e->size || ch < 0 || ch >= e->channels || !e->chans[peer * e->channels + ch].open)
        return PyErr_Format(PyExc_ValueError, "no link to rank %d on channel %d", peer, ch);
    fc_link *l = &e->chans[peer * e->channels + ch].link;
    char detail[FC_LINK_WHY] = "";
    if (l->kind->describe)
        l->kind->describe(l, detail, sizeof detail);
    return Py_BuildValue("(ss)", l->kind->name, detail);
}

static PyMethodDef links_methods[] = {
    {"add", (PyCFunction)(void (*)(void))add, METH_VARARGS | METH_KEYWORDS,
     "add(peer, channel, fd, *, kind='tcp', segment=None, tx_offset=0, rx_offset=0, capacity=0, device=None, "
     "library=None, reliable=False, setup_timeout=10.0, same_host=False)"},
    {"info", info, METH_VARARGS,
     "info(peer, channel) -> (kind, detail): what carries that link (detail: e.g. 'mlx5_0, UC, MTU 1024')"},
    {"send", py_send, METH_VARARGS, "send(peer, kind, seq, sig, chunk, payload)"},
    {"send_raw", py_send_raw, METH_VARARGS, "send_raw(peer, data): for tests, bytes as they are"},
    {"flush", py_flush, METH_O, "flush(seconds)"},
    {"next_header", py_next_header, METH_VARARGS, "next_header(peer, chunk, seconds)"},
    {"read_payload", py_read_payload, METH_VARARGS, "read_payload(peer, chunk, out, seconds)"},
    {"keep_unread", py_keep_unread, METH_VARARGS, "keep_unread(peer, chunk)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject py_links_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.Links",
    .tp_basicsize = sizeof(py_facet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An Engine's links and the messages over them (Engine.links).",
    .tp_dealloc = py_facet_dealloc,
    .tp_methods = links_methods,
};
