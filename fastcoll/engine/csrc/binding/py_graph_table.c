/* The GraphTable Runner.graph_open returns: the graph table's capsule, which fastcoll's MPI
 * library attaches to, and trace(), the calls noted for the rank's trace since the last
 * (py_graph.c takes them under the table's lock; py_graph_trace.c keeps and words them). A room
 * above both, so that neither calls back up into the other. */
#include "py_common.h"

#include <stddef.h>
#include <structmember.h>

/* What Runner.graph_open returns: the table's capsule (which the library attaches to) and the
 * calls noted for the trace, taken through trace(). */
typedef struct {
    PyObject_HEAD
    EngineObject *engine;
    PyObject *capsule;
} py_graph_table;

PyObject *py_graph_table_new(EngineObject *engine, PyObject *capsule)
{
    py_graph_table *t = PyObject_New(py_graph_table, &py_graph_table_type);
    if (!t) {
        Py_DECREF(capsule);
        return NULL;
    }
    t->engine = (EngineObject *)Py_NewRef((PyObject *)engine);
    t->capsule = capsule;
    return (PyObject *)t;
}

static void table_dealloc(PyObject *self)
{
    py_graph_table *t = (py_graph_table *)self;
    Py_DECREF(t->capsule);
    Py_DECREF(t->engine);
    PyObject_Free(self);
}

/* trace(): the graph's calls noted since the last (FASTCOLL_TRACE), or None; also after the
 * engine's close(), when the trace is written. */
static PyObject *table_trace(PyObject *self, PyObject *unused)
{
    (void)unused;
    return py_graph_traced(((py_graph_table *)self)->engine);
}

static PyMethodDef table_methods[] = {
    {"trace", table_trace, METH_NOARGS,
     "trace() -> {now, calls, dropped, first_dropped}: the calls noted since the last, or None (untraced)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef table_members[] = {
    {"capsule", T_OBJECT_EX, offsetof(py_graph_table, capsule), READONLY,
     "the capsule of fc_graph_api (\"fastcoll.graph_api\") the MPI library attaches to"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject py_graph_table_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastcoll.engine._native.GraphTable",
    .tp_basicsize = sizeof(py_graph_table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A graph table (Runner.graph_open): its capsule, and its calls noted for the trace.",
    .tp_dealloc = table_dealloc,
    .tp_methods = table_methods,
    .tp_members = table_members,
};
