/* How the graph table names its calls, and words their failures: in the user's terms, as the
 * eager path does ("s0c0/all_reduce(sum,float32,(64,))"; "PeerLostError: rank 1 (host h) closed
 * its connection ..."), so that a mismatch or a lost peer reads alike in both modes. The
 * names are fastcoll.dtypes' (names() in code order, and OPS), which Python hands over when the
 * table opens: one table of names for both paths. Every rank builds the same signature for the
 * same call (they are compared on the wire), so nothing rank-specific goes into one. */
#include "py_common.h"

#include <stdio.h>
#include <string.h>

#include "reduce/fc_reduce.h"

/* Copy `want` names from the tuple `names` into out; 0, or -1 with a ValueError that says why. */
static int take(char (*out)[PY_GRAPH_NAME_MAX], PyObject *names, Py_ssize_t want, const char *what)
{
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != want) {
        PyErr_Format(PyExc_ValueError, "graph_open: %zd %s names expected (fastcoll.dtypes')", want, what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        PyObject *item = PyTuple_GET_ITEM(names, i);
        Py_ssize_t len = 0;
        const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &len) : NULL;
        if (!s && PyErr_Occurred())
            return -1;
        /* a signature's punctuation in a name would let two calls read alike */
        if (!s || len < 1 || len >= PY_GRAPH_NAME_MAX || strcspn(s, "(),/") != (size_t)len) {
            PyErr_Format(PyExc_ValueError, "graph_open: a bad %s name (#%zd): 1 to %d characters, none of (),/",
                         what, i, PY_GRAPH_NAME_MAX - 1);
            return -1;
        }
        memcpy(out[i], s, (size_t)len + 1);
    }
    return 0;
}

int py_graph_names_take(py_graph_names *n, PyObject *dtypes, PyObject *ops)
{
    return take(n->dtypes, dtypes, FC_DTYPE_COUNT, "dtype") || take(n->ops, ops, FC_OP_COUNT, "op") ? -1 : 0;
}

static const char *dtype_name(const py_graph_names *n, int code)
{
    return code >= 0 && code < FC_DTYPE_COUNT ? n->dtypes[code] : "an unknown dtype";
}

void py_graph_sig_all_reduce(const py_graph_names *n, char *out, size_t size, const char *prefix, size_t count,
                             int dtype, int redop, int user, int name_dtype, int name_op)
{
    /* the op MLX made for a reduction the engine lacks, where the library cannot say which */
    const char *op = name_op >= 0 && name_op < FC_OP_COUNT ? n->ops[name_op]
                     : user                                ? "custom"
                     : redop >= 0 && redop < FC_OP_COUNT   ? n->ops[redop]
                                                           : "an unknown op";
    const char *dt = dtype_name(n, name_dtype >= 0 && name_dtype < FC_DTYPE_COUNT ? name_dtype : dtype);
    snprintf(out, size, "%sall_reduce(%s,%s,(%zu,))", prefix, op, dt, count);
}

void py_graph_sig_all_gather(const py_graph_names *n, char *out, size_t size, const char *prefix, size_t nbytes,
                             int name_dtype)
{
    size_t item = name_dtype >= 0 && name_dtype < FC_DTYPE_COUNT ? fc_itemsize(name_dtype) : 0;
    if (!item || nbytes % item) { /* elements of a type the user does not know: its bytes */
        name_dtype = FC_UINT8;
        item = 1;
    }
    snprintf(out, size, "%sall_gather(%s,(%zu,))", prefix, dtype_name(n, name_dtype), nbytes / item);
}

void py_graph_describe(const fc_err *e, const char *who, double limit, char *out, size_t n)
{
    int len = (int)e->text_len;
    switch (e->code) {
    case FC_E_TIMEOUT_WAIT:
    case FC_E_TIMEOUT_PAYLOAD:
        snprintf(out, n, "CollectiveTimeoutError: %s did not answer within %g s", who, limit);
        break;
    case FC_E_TIMEOUT_SEND:
        snprintf(out, n, "CollectiveTimeoutError: %s stopped taking data for %g s", who, limit);
        break;
    case FC_E_CLOSED:
    case FC_E_CLOSED_MID:
        snprintf(out, n, "PeerLostError: %s closed its connection (it exited or was killed)", who);
        break;
    case FC_E_CONN:
    case FC_E_BROKEN:
        snprintf(out, n, "PeerLostError: connection to %s failed: %s", who, len ? e->text : strerror(e->sys_errno));
        break;
    case FC_E_FINALIZED:
        snprintf(out, n, "PeerLostError: %s called finalize() while this rank still needed it", who);
        break;
    case FC_E_MALFORMED:
        snprintf(out, n, "PeerLostError: %s sent a malformed frame (%.*s)", who, len, e->text);
        break;
    case FC_E_ABORT:
        snprintf(out, n, "PeerLostError: %s gave up: %.*s", who, len, e->text);
        break;
    case FC_E_MISMATCH_CALL:
    case FC_E_MISMATCH_CHUNK:
        snprintf(out, n, "MismatchError: %s called another collective (%.*s)", who, len, e->text);
        break;
    case FC_E_NOMEM:
        snprintf(out, n, "FastcollError: the native engine ran out of memory");
        break;
    default:
        snprintf(out, n, "FastcollError: internal error %d in the native engine (%.*s)", e->code, len, e->text);
    }
}
