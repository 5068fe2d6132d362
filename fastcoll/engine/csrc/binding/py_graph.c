/* The graph table (fc_graph.h): collectives of one fastcoll group, called without Python from
 * MLX's evaluation thread. The group is a sub-group Python made for it alone, so its sequence
 * numbers are this file's to count and its signatures' prefix keeps its messages apart from
 * every other group's. Python fixes everything else once (Engine.graph_open): the members, the
 * time limit, the piece size, which algorithm each size takes, and how each peer is named. */
#include "py_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fc_graph.h"
#include "reduce/fc_reduce.h"

#define PREFIX_MAX 96
#define LABEL_MAX 96
#define SIG_MAX 192 /* a prefix, two names and a count */

enum { G_ALL_REDUCE, G_ALL_GATHER, G_KINDS };

struct py_graph {
    fc_graph_api api;
    EngineObject *owner;
    pthread_mutex_t lock; /* one call at a time (MLX may evaluate on several CPU streams) */
    int open;             /* under lock: 0 once the engine closes */
    char prefix[PREFIX_MAX];
    py_graph_names names; /* fastcoll.dtypes', for the signatures */
    int rank, size;
    int32_t *ranks;       /* the job's rank of each group rank */
    char (*labels)[LABEL_MAX];
    double limit;
    size_t piece_bytes;
    size_t small_max[G_KINDS];
    int small_algo[G_KINDS], large_algo[G_KINDS];
    int64_t seq;
    int64_t *sent, *received; /* point-to-point messages to and from each group rank */
    uint8_t *scratch;         /* an in-place all_reduce's contribution */
    size_t scratch_bytes;
    py_graph_trace *trace; /* the calls noted for FASTCOLL_TRACE (py_graph_trace.c); NULL: untraced */
};

/* ----- the end of the process ----- */

static const char *label(const py_graph *g, int job_rank)
{
    for (int i = 0; i < g->size; i++)
        if (g->ranks[i] == job_rank)
            return g->labels[i];
    return "an unknown rank";
}

/* Say what failed and end the process (fc_graph.h says why). */
static void fatal(const py_graph *g, const char *what, const char *why)
{
    fprintf(stderr, "fastcoll: %s: %s in MLX's graph: %s\n", g->labels[g->rank], what, why);
    fflush(stderr);
    _exit(1);
}

static void fatal_err(const py_graph *g, const char *what, const fc_err *e)
{
    char why[256 + FC_TEXT_MAX];
    py_graph_describe(e, label(g, e->peer), g->limit, why, sizeof why);
    fatal(g, what, why);
}

/* ----- running one call ----- */

typedef struct {
    fc_item base;
    fc_call *call;
    const fc_op *op;
    fc_done *done;
    py_graph_trace *trace; /* the call's start is noted here, if it is traced */
} queued;

static void run_queued(fc_item *it)
{
    queued *q = (queued *)it;
    if (q->trace)
        py_graph_trace_started(q->trace);
    fc_done_finish(q->done, fc_run(q->call, q->op) ? (q->call->err->code ? q->call->err->code : FC_E_INTERNAL) : FC_OK);
}

static void drop_queued(fc_item *it)
{
    queued *q = (queued *)it;
    fc_err_set(q->call->err, FC_E_INTERNAL, -1);
    fc_err_text(q->call->err, "the engine stopped before the call ran", 38);
    fc_done_finish(q->done, FC_E_INTERNAL);
}

/* Run op as call (seq, sig) of the graph's group (traced as `name`, sig where NULL): here when
 * the engine is idle, else behind the queued calls on the service thread. Holds g->lock. */
static void run(py_graph *g, const char *what, int64_t seq, const char *sig, const fc_op *op, const char *name)
{
    EngineObject *o = g->owner;
    if (py_forked(o))
        fatal(g, what, "FastcollError: this process was forked from the one that joined the job, whose "
                       "connections are the parent's: a forked child cannot use its parent's job");
    if (!g->open || atomic_load(&o->failed))
        fatal(g, what, "FastcollError: the job has failed or fastcoll was finalized");
    /* the call's fixed part as Python's calls hand it over (no buffers held: none to release) */
    py_op fixed = {.op = *op, .seq = seq, .limit = g->limit, .rank = g->rank, .size = g->size,
                   .piece_bytes = g->piece_bytes, .sig = (uint8_t *)sig, .sig_len = strlen(sig), .ranks = g->ranks};
    fc_err err;
    fc_call c;
    py_op_call(&fixed, &o->engine, &c, &err);
    /* an untraced call's one test: c.trace stays NULL, its primitives' own branch */
    py_graph_trace *traced = g->trace && py_graph_trace_begin(g->trace, &c, op, name ? name : sig, seq) ? g->trace
                                                                                                       : NULL;
    int rc;
    if (fc_service_claim_if_idle(&o->service)) {
        rc = fc_run(&c, op);
        fc_service_release(&o->service);
    } else {
        queued q = {{NULL, NULL, NULL}, &c, op, fc_done_new(), traced};
        if (!q.done)
            fatal(g, what, "FastcollError: out of memory");
        q.base.run = run_queued;
        q.base.drop = drop_queued;
        fc_service_submit(&o->service, &q.base, 0);
        fc_done_wait(q.done, FC_FOREVER);
        rc = q.done->code != FC_OK;
        fc_done_unref(q.done);
    }
    if (traced)
        py_graph_trace_end(traced);
    if (rc) {
        atomic_store(&o->failed, 1);
        fatal_err(g, what, &err);
    }
}

static int algorithm(const py_graph *g, int kind, size_t nbytes)
{
    return nbytes <= g->small_max[kind] ? g->small_algo[kind] : g->large_algo[kind];
}

static int64_t *even_bounds(py_graph *g, size_t count)
{
    int64_t *b = malloc(2 * (size_t)g->size * sizeof *b);
    if (!b)
        fatal(g, "a collective", "FastcollError: out of memory");
    for (int i = 0; i < g->size; i++)
        fc_block(count * (size_t)g->size, g->size, i, &b[2 * i], &b[2 * i + 1]);
    return b;
}

static int graph_all_reduce(void *ctx, const void *src, void *dst, size_t count, int dtype, int redop,
                            fc_graph_user_op user, void *user_type, int name_dtype, int name_op)
{
    py_graph *g = ctx;
    size_t size = fc_itemsize(dtype);
    char sig[SIG_MAX];
    py_graph_sig_all_reduce(&g->names, sig, sizeof sig, g->prefix, count, dtype, redop, user != NULL, name_dtype,
                            name_op);
    pthread_mutex_lock(&g->lock);
    if (!size || (!user && !fc_reduction_valid(dtype, redop)) || count > SIZE_MAX / size)
        fatal(g, sig, "FastcollError: no such reduction of this dtype");
    size_t nbytes = count * size;
    if (src == dst && nbytes) { /* the algorithms read src while dst fills */
        if (g->scratch_bytes < nbytes) {
            fc_scratch_free(g->scratch);
            g->scratch_bytes = 0;
            if (!(g->scratch = fc_scratch_alloc(nbytes)))
                fatal(g, sig, "FastcollError: out of memory");
            g->scratch_bytes = nbytes;
        }
        memcpy(g->scratch, src, nbytes);
        src = g->scratch;
    }
    fc_op op = {.kind = FC_K_ALL_REDUCE, .algo = algorithm(g, G_ALL_REDUCE, nbytes), .dtype = dtype, .redop = redop,
                .user = user, .user_type = user_type, .itemsize = size, .src = src, .src_count = count,
                .dst = dst, .dst_count = count};
    run(g, sig, g->seq++, sig, &op, NULL);
    pthread_mutex_unlock(&g->lock);
    return 0;
}

static int graph_all_gather(void *ctx, const void *src, void *dst, size_t nbytes, int name_dtype)
{
    py_graph *g = ctx;
    char sig[SIG_MAX];
    py_graph_sig_all_gather(&g->names, sig, sizeof sig, g->prefix, nbytes, name_dtype);
    pthread_mutex_lock(&g->lock);
    if (nbytes > SIZE_MAX / (size_t)g->size)
        fatal(g, sig, "FastcollError: the result does not fit in memory");
    int64_t *bounds = even_bounds(g, nbytes);
    fc_op op = {.kind = FC_K_ALL_GATHER, .algo = algorithm(g, G_ALL_GATHER, nbytes * (size_t)g->size),
                .dtype = FC_UINT8, .itemsize = 1, .src = src, .src_count = nbytes, .dst = dst,
                .dst_count = nbytes * (size_t)g->size, .bounds = bounds};
    run(g, sig, g->seq++, sig, &op, NULL);
    free(bounds);
    pthread_mutex_unlock(&g->lock);
    return 0;
}

static void check_peer(py_graph *g, const char *what, int peer)
{
    if (peer < 0 || peer >= g->size || peer == g->rank)
        fatal(g, what, "FastcollError: no such peer in the group (or this rank itself)");
}

/* A message from rank `from` to rank `to` of the group, numbered per direction as Python's
 * point-to-point calls are: the sender's count of sends to `to` is the receiver's of receives. */
static void p2p(py_graph *g, int kind, int peer, const void *src, void *dst, size_t nbytes)
{
    const char *what = kind == FC_K_SEND ? "send" : "recv";
    int from = kind == FC_K_SEND ? g->rank : peer, to = kind == FC_K_SEND ? peer : g->rank;
    pthread_mutex_lock(&g->lock);
    check_peer(g, what, peer);
    fc_op op = {.kind = kind, .algo = FC_A_DIRECT, .dtype = FC_UINT8, .root = peer, .itemsize = 1,
                .src = src, .src_count = src ? nbytes : 0, .dst = dst, .dst_count = dst ? nbytes : 0};
    char sig[SIG_MAX], name[SIG_MAX];
    snprintf(sig, sizeof sig, "%sp2p(%d,%d,%zu)", g->prefix, from, to, nbytes);
    if (g->trace) /* named as the eager path's messages are: its bytes, as uint8 */
        snprintf(name, sizeof name, "%s%s(%d,%d,uint8,(%zu,))", g->prefix, what, from, to, nbytes);
    int64_t *count = kind == FC_K_SEND ? &g->sent[peer] : &g->received[peer];
    run(g, what, (*count)++, sig, &op, g->trace ? name : NULL);
    pthread_mutex_unlock(&g->lock);
}

static int graph_send(void *ctx, const void *src, size_t nbytes, int peer)
{
    p2p(ctx, FC_K_SEND, peer, src, NULL, nbytes);
    return 0;
}

static int graph_recv(void *ctx, void *dst, size_t nbytes, int peer)
{
    p2p(ctx, FC_K_RECV, peer, NULL, dst, nbytes);
    return 0;
}

/* ----- from Python ----- */

static void graph_free(py_graph *g)
{
    if (!g)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g->ranks);
    free(g->labels);
    free(g->sent);
    free(g->received);
    fc_scratch_free(g->scratch);
    py_graph_trace_free(g->trace);
    free(g);
}

static void capsule_free(PyObject *capsule)
{
    py_graph *g = PyCapsule_GetContext(capsule);
    if (g)
        Py_DECREF(g->owner);
}

/* The trace's bounds (both 0: untraced); 0, or -1 with a Python error. */
static int trace_take(py_graph *g, Py_ssize_t calls, Py_ssize_t phases)
{
    if (!calls && !phases)
        return 0;
    if (calls < 1 || (size_t)calls > PY_GRAPH_TRACE_CALLS_MAX || phases < 1 ||
        (size_t)phases > PY_GRAPH_TRACE_PHASES_MAX) {
        PyErr_Format(PyExc_ValueError, "graph_open: trace_calls must be 1 to %zu and trace_phases 1 to %zu (both 0: "
                     "untraced)", PY_GRAPH_TRACE_CALLS_MAX, PY_GRAPH_TRACE_PHASES_MAX);
        return -1;
    }
    if (!(g->trace = py_graph_trace_new((size_t)calls, (size_t)phases))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Fill g from the keywords prefix, ranks, rank, limit, piece_bytes, all_reduce (small_max,
 * small_algo, large_algo), all_gather (the same), labels, dtype_names, op_names, and
 * trace_calls, trace_phases (optional); 0, or -1 with a Python error. */
static int graph_fill(py_graph *g, PyObject *args, PyObject *kw, int job_size)
{
    static char *kwlist[] = {"prefix", "ranks", "rank", "limit", "piece_bytes", "all_reduce", "all_gather",
                             "labels", "dtype_names", "op_names", "trace_calls", "trace_phases", NULL};
    const char *prefix;
    PyObject *ranks, *labels, *dtypes, *ops;
    long long sm[G_KINDS];
    Py_ssize_t trace[2] = {0, 0};
    if (PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "graph_open takes keywords only");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO!idn(Lii)(Lii)O!OO|nn", kwlist, &prefix, &PyTuple_Type, &ranks,
                                     &g->rank, &g->limit, &g->piece_bytes, &sm[0], &g->small_algo[0],
                                     &g->large_algo[0], &sm[1], &g->small_algo[1], &g->large_algo[1],
                                     &PyTuple_Type, &labels, &dtypes, &ops, &trace[0], &trace[1]) ||
        py_graph_names_take(&g->names, dtypes, ops) || trace_take(g, trace[0], trace[1]))
        return -1;
    g->size = (int)PyTuple_GET_SIZE(ranks);
    if (strlen(prefix) >= PREFIX_MAX || g->size < 1 || g->size > job_size || PyTuple_GET_SIZE(labels) != g->size ||
        g->rank < 0 || g->rank >= g->size || !(g->limit > 0) || sm[0] < 0 || sm[1] < 0 ||
        !fc_can_run(g->small_algo[0], FC_K_ALL_REDUCE) || !fc_can_run(g->large_algo[0], FC_K_ALL_REDUCE) ||
        !fc_can_run(g->small_algo[1], FC_K_ALL_GATHER) || !fc_can_run(g->large_algo[1], FC_K_ALL_GATHER)) {
        PyErr_SetString(PyExc_ValueError, "graph_open: a bad prefix, group, time limit or algorithm");
        return -1;
    }
    snprintf(g->prefix, sizeof g->prefix, "%s", prefix);
    g->small_max[0] = (size_t)sm[0];
    g->small_max[1] = (size_t)sm[1];
    size_t n = (size_t)g->size;
    g->ranks = calloc(n, sizeof *g->ranks);
    g->labels = calloc(n, sizeof *g->labels);
    g->sent = calloc(n, sizeof *g->sent);
    g->received = calloc(n, sizeof *g->received);
    if (!g->ranks || !g->labels || !g->sent || !g->received) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        long r = PyLong_AsLong(PyTuple_GET_ITEM(ranks, i));
        const char *l = PyUnicode_AsUTF8(PyTuple_GET_ITEM(labels, i));
        if (!l || (r == -1 && PyErr_Occurred()))
            return -1;
        if (r < 0 || r >= job_size) {
            PyErr_SetString(PyExc_ValueError, "graph_open: a rank outside the job");
            return -1;
        }
        g->ranks[i] = (int32_t)r;
        snprintf(g->labels[i], LABEL_MAX, "%s", l);
    }
    return 0;
}

PyObject *py_graph_open(EngineObject *self, PyObject *args, PyObject *kw)
{
    if (self->graph) {
        PyErr_SetString(PyExc_RuntimeError, "an engine opens its graph table once");
        return NULL;
    }
    py_graph *g = calloc(1, sizeof *g);
    if (!g)
        return PyErr_NoMemory();
    if (pthread_mutex_init(&g->lock, NULL)) {
        free(g);
        return PyErr_NoMemory();
    }
    if (graph_fill(g, args, kw, self->engine.size)) {
        graph_free(g);
        return NULL;
    }
    g->owner = self;
    g->open = 1;
    g->api = (fc_graph_api){FC_GRAPH_VERSION, g, g->rank, g->size, graph_all_reduce, graph_all_gather, graph_send,
                            graph_recv};
    PyObject *capsule = PyCapsule_New(&g->api, "fastcoll.graph_api", capsule_free);
    if (!capsule || PyCapsule_SetContext(capsule, g)) {
        Py_XDECREF(capsule);
        graph_free(g);
        return NULL;
    }
    Py_INCREF(self); /* the capsule keeps the engine, which keeps g, alive */
    self->graph = g;
    return capsule;
}

void py_graph_close(EngineObject *self)
{
    py_graph *g = self->graph;
    if (!g)
        return;
    pthread_mutex_lock(&g->lock); /* after the call under way, if any */
    g->open = 0;
    pthread_mutex_unlock(&g->lock);
}

PyObject *py_graph_traced(EngineObject *self)
{
    py_graph *g = self->graph;
    if (!g || !g->trace || py_forked(self)) /* a forked child's copy: its lock may be held */
        Py_RETURN_NONE;
    fc_ns now = fc_now();
    py_graph_batch *b;
    Py_BEGIN_ALLOW_THREADS /* a call under way holds the lock and may wait for Python */
    pthread_mutex_lock(&g->lock);
    b = py_graph_trace_detach(g->trace);
    pthread_mutex_unlock(&g->lock);
    Py_END_ALLOW_THREADS
    return b ? py_graph_trace_report(b, now) : PyErr_NoMemory();
}

void py_graph_free(EngineObject *self)
{
    graph_free(self->graph);
    self->graph = NULL;
}
