/* A traced run's phases (FASTCOLL_TRACE on the native engine): the call notes them in a bounded
 * buffer taken here (algorithms/fc_trace.c), and Python gets them back as tuples, which
 * fastcoll/engine/native.py writes as the spans fastcoll/trace.py names. */
#include "py_common.h"

#include <stdlib.h>

int py_trace_begin(py_trace *pt)
{
    pt->t.spans = malloc(PY_TRACE_SPANS * sizeof *pt->t.spans);
    if (!pt->t.spans) {
        PyErr_NoMemory();
        return -1;
    }
    pt->t.cap = PY_TRACE_SPANS;
    pt->t.n = 0;
    pt->t.dropped = 0;
    pt->origin = fc_now();
    return 0;
}

/* ((phase, peer, bytes, start_ns, end_ns) ..., dropped), times since py_trace_begin. */
static PyObject *spans_of(const py_trace *pt)
{
    size_t n = pt->t.n < pt->t.cap ? pt->t.n : pt->t.cap;
    PyObject *spans = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; spans && i < n; i++) {
        const fc_span *s = &pt->t.spans[i];
        PyObject *one = Py_BuildValue("(iiLLL)", (int)s->phase, (int)s->peer, (long long)s->bytes,
                                      (long long)(s->start - pt->origin), (long long)(s->end - pt->origin));
        if (!one) {
            Py_CLEAR(spans);
            break;
        }
        PyTuple_SET_ITEM(spans, (Py_ssize_t)i, one);
    }
    return spans ? Py_BuildValue("(NL)", spans, (long long)pt->t.dropped) : NULL;
}

PyObject *py_trace_end(py_trace *pt)
{
    PyObject *r = spans_of(pt);
    free(pt->t.spans);
    pt->t.spans = NULL;
    return r;
}

PyObject *py_trace_raise(py_trace *pt, const fc_err *err)
{
    if (err->code == FC_E_SIGNAL && PyErr_Occurred()) { /* the signal handler's exception */
        free(pt->t.spans);
        pt->t.spans = NULL;
        return NULL;
    }
    PyObject *spans = py_trace_end(pt);
    PyObject *info = spans ? py_err_info(err) : NULL;
    PyObject *exc = info ? PyObject_Call(py_native_error, info, NULL) : NULL;
    if (exc && PyObject_SetAttrString(exc, "spans", spans) == 0)
        PyErr_SetObject(py_native_error, exc);
    Py_XDECREF(exc);
    Py_XDECREF(info);
    Py_XDECREF(spans);
    return NULL;
}
