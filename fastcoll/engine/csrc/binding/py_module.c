/* The module fastcoll.engine._native: its types, its error, the codes Python maps names to,
 * and the reductions on their own (for tests). Its public names, and each type's, are
 * fastcoll/engine/door.py's PUBLIC_API, which fastcoll/engine/native.py holds it to at import. */
#include "py_common.h"

#include <pthread.h>
#include <string.h>

#include "reduce/fc_reduce.h"

PyObject *py_native_error;

/* The names of the codes, in the order of their C enums: the dtypes' and ops' from the header
 * generated from fastcoll/dtypes.py (reduce/fc_tables.h); fastcoll/engine/native.py checks them
 * all against its own tuples at import. */
static const char *const DTYPE_NAMES[FC_DTYPE_COUNT] = FC_DTYPE_NAMES;
static const char *const OP_NAMES[FC_OP_COUNT] = FC_OP_NAMES;
static const char *const KIND_NAMES[FC_K_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
    "gather", "scatter", "reduce", "send", "recv"};
static const char *const ALGO_NAMES[FC_A_COUNT] = {"direct", "doubling", "ring", "pairwise", "chain"};
static const char *const PHASE_NAMES[FC_P_COUNT] = {"send", "wait", "receive", "reduce", "flush"};

PyObject *py_err_info(const fc_err *err)
{
    return Py_BuildValue("(iiiiLLLLy#)", err->code, err->peer, err->waiting_for, err->sys_errno,
                         (long long)err->n[0], (long long)err->n[1], (long long)err->n[2],
                         (long long)err->n[3], err->text, (Py_ssize_t)err->text_len);
}

PyObject *py_raise(const fc_err *err)
{
    if (err->code == FC_E_SIGNAL && PyErr_Occurred())
        return NULL; /* the signal handler's exception (KeyboardInterrupt) */
    PyObject *info = py_err_info(err);
    if (info) {
        PyErr_SetObject(py_native_error, info);
        Py_DECREF(info);
    }
    return NULL;
}

int py_check_signals(void *ctx)
{
    py_signals *s = ctx;
    PyEval_RestoreThread(s->ts);
    int raised = PyErr_CheckSignals() < 0;
    s->ts = PyEval_SaveThread();
    return raised;
}

static int code_of(PyObject *name, const char *const *names, int count, const char *what)
{
    const char *s = PyUnicode_AsUTF8(name);
    if (!s)
        return -1;
    for (int i = 0; i < count; i++)
        if (!strcmp(s, names[i]))
            return i;
    PyErr_Format(PyExc_ValueError, "unknown %s %R", what, name);
    return -1;
}

/* reduce(dtype, op, a, b, out): out = a op b, as the engine combines contributions. */
static PyObject *reduce_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "reduce takes 5 arguments");
    int dtype = code_of(args[0], DTYPE_NAMES, FC_DTYPE_COUNT, "dtype");
    int op = dtype < 0 ? -1 : code_of(args[1], OP_NAMES, FC_OP_COUNT, "reduction");
    if (op < 0)
        return NULL;
    if (!fc_reduction_valid(dtype, op))
        return PyErr_Format(PyExc_ValueError, "%s does not reduce %s", OP_NAMES[op], DTYPE_NAMES[dtype]);
    Py_buffer v[3];
    int got = 0, flags[3] = {PyBUF_C_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE};
    for (; got < 3; got++)
        if (PyObject_GetBuffer(args[2 + got], &v[got], flags[got]))
            break;
    PyObject *result = NULL;
    size_t isz = fc_itemsize(dtype);
    if (got < 3) {
        /* the error is set */
    } else if (v[0].len != v[2].len || v[1].len != v[2].len || (size_t)v[2].len % isz) {
        PyErr_SetString(PyExc_ValueError, "a, b and out must hold the same whole number of items");
    } else {
        Py_BEGIN_ALLOW_THREADS
        fc_reduce(dtype, op, v[0].buf, v[1].buf, v[2].buf, (size_t)v[2].len / isz);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return result;
}

/* finish_mean(dtype, buf, world_size): buf /= world_size, rounded as the dtype rounds. */
static PyObject *finish_mean_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "finish_mean takes 3 arguments");
    int dtype = code_of(args[0], DTYPE_NAMES, FC_DTYPE_COUNT, "dtype");
    long n = dtype < 0 ? -1 : PyLong_AsLong(args[2]);
    if (dtype < 0 || (n == -1 && PyErr_Occurred()))
        return NULL;
    if (n < 1 || n > 1 << 30 || !fc_reduction_valid(dtype, FC_MEAN))
        return PyErr_Format(PyExc_ValueError, "no mean of %s over %ld ranks", DTYPE_NAMES[dtype], n);
    Py_buffer v;
    if (PyObject_GetBuffer(args[1], &v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE))
        return NULL;
    size_t isz = fc_itemsize(dtype);
    PyObject *result = NULL;
    if ((size_t)v.len % isz) {
        PyErr_SetString(PyExc_ValueError, "buf must hold a whole number of items");
    } else {
        fc_finish_mean(dtype, v.buf, (size_t)v.len / isz, (int)n);
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&v);
    return result;
}

static PyObject *names(const char *const *list, int count)
{
    PyObject *t = PyTuple_New(count);
    for (int i = 0; t && i < count; i++) {
        PyObject *s = PyUnicode_FromString(list[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyMethodDef methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))reduce_fn, METH_FASTCALL,
     "reduce(dtype, op, a, b, out): out = a op b, element-wise, as the native engine combines."},
    {"finish_mean", (PyCFunction)(void (*)(void))finish_mean_fn, METH_FASTCALL,
     "finish_mean(dtype, buf, world_size): divide a sum by the world size in place."},
    {"link_kinds", py_link_kinds, METH_NOARGS, "link_kinds(): the names of the kinds of link this build has."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "fastcoll's native data plane (see fastcoll/engine/native.py, which is its Python side).",
    -1, methods, NULL, NULL, NULL, NULL,
};

static int add(PyObject *m, const char *name, PyObject *value)
{
    if (!value || PyModule_AddObject(m, name, value)) {
        Py_XDECREF(value);
        return -1;
    }
    return 0;
}

unsigned long py_fork_generation;

/* In the child, after fork(): it runs alone then, so the count needs no lock. */
static void forked_child(void)
{
    py_fork_generation++;
}

PyMODINIT_FUNC PyInit__native(void);

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&py_engine_type) || PyType_Ready(&py_runner_type) || PyType_Ready(&py_links_type) ||
        PyType_Ready(&py_gate_type) || PyType_Ready(&py_spec_type) || PyType_Ready(&py_completion_type) ||
        PyType_Ready(&py_graph_table_type) ||
        py_results_ready())
        return NULL;
    if (pthread_atfork(NULL, NULL, forked_child)) {
        PyErr_SetString(PyExc_RuntimeError, "could not register the native engine's fork handler");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    py_native_error = PyErr_NewExceptionWithDoc(
        "fastcoll.engine._native.NativeError",
        "A native call failed; args are (code, peer, waiting_for, errno, n0, n1, n2, n3, text).", NULL, NULL);
    Py_XINCREF(py_native_error);
    if (add(m, "NativeError", py_native_error) || add(m, "Engine", Py_NewRef((PyObject *)&py_engine_type)) ||
        add(m, "Completion", Py_NewRef((PyObject *)&py_completion_type)) ||
        add(m, "Runner", Py_NewRef((PyObject *)&py_runner_type)) ||
        add(m, "Links", Py_NewRef((PyObject *)&py_links_type)) ||
        add(m, "GateHost", Py_NewRef((PyObject *)&py_gate_type)) ||
        add(m, "OpSpec", Py_NewRef((PyObject *)&py_spec_type)) ||
        add(m, "GraphTable", Py_NewRef((PyObject *)&py_graph_table_type)) ||
        add(m, "ResultCache", Py_NewRef((PyObject *)&py_result_cache_type)) ||
        add(m, "DTYPES", names(DTYPE_NAMES, FC_DTYPE_COUNT)) || add(m, "OPS", names(OP_NAMES, FC_OP_COUNT)) ||
        add(m, "KINDS", names(KIND_NAMES, FC_K_COUNT)) || add(m, "ALGORITHMS", names(ALGO_NAMES, FC_A_COUNT)) ||
        add(m, "PHASES", names(PHASE_NAMES, FC_P_COUNT)) ||
        add(m, "GRAPH_TRACE_MAX", Py_BuildValue("{s:n,s:n}", "trace_calls", (Py_ssize_t)PY_GRAPH_TRACE_CALLS_MAX,
                                                "trace_phases", (Py_ssize_t)PY_GRAPH_TRACE_PHASES_MAX))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
