/* The graph table's calls in the rank's trace (FASTCOLL_TRACE): each call MLX's evaluation
 * thread makes through py_graph.c is noted here, under the table's lock, with its name, number,
 * when it reached the table, began and ended, and its phases as the eager path's traced calls
 * note them (algorithms/fc_trace.c, through the call's `trace`). Python takes what was noted
 * when it writes the trace (GraphTable.trace, py_graph_table.c, through py_graph.c's
 * py_graph_traced, which holds the table's lock), as a dict of plain values.
 *
 * Memory is taken only by a table opened to trace, and grows with what is noted, up to the
 * bounds graph_open gives: past them a call is not kept (counted) and a kept call's phases past
 * its own bound or the table's are counted as its `dropped`, as the eager path's are. */
#include "py_common.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One call noted: its phases are spans[first, first + n) of the batch it is in. */
typedef struct py_graph_call {
    fc_ns reached, start, end; /* reached the table, began to run, ended */
    int64_t seq, bytes, dropped;
    size_t first, n;
    int32_t peer; /* a send's or a receive's peer (the job's rank), else -1 */
    char name[PY_GRAPH_TRACE_NAME];
} py_graph_call;

struct py_graph_trace {
    size_t calls_max, phases_max; /* the bounds: kept in all, over every batch Python took */
    size_t calls_kept, phases_kept;
    int64_t calls_dropped;
    fc_ns first_dropped;  /* when the first call not kept came */
    py_graph_call *calls; /* this batch (since Python last took one): ncalls of cap_calls */
    size_t ncalls, cap_calls;
    fc_span *spans; /* this batch's phases: nspans of cap_spans */
    size_t nspans, cap_spans;
    fc_trace cur; /* the call under way's phases (into spans) */
};

py_graph_trace *py_graph_trace_new(size_t calls_max, size_t phases_max)
{
    py_graph_trace *t = calloc(1, sizeof *t);
    if (t) {
        t->calls_max = calls_max;
        t->phases_max = phases_max;
    }
    return t;
}

static void batch_free(py_graph_trace *t)
{
    free(t->calls);
    free(t->spans);
    t->calls = NULL;
    t->spans = NULL;
    t->ncalls = t->cap_calls = t->nspans = t->cap_spans = 0;
}

void py_graph_trace_free(py_graph_trace *t)
{
    if (t)
        batch_free(t);
    free(t);
}

/* Room for `want` more items of `size` in *p (cap of them, n used), doubled at least, never past
 * `most`; 0, or -1 where memory ran out (*p as it was). */
static int room(void **p, size_t *cap, size_t n, size_t want, size_t most, size_t size)
{
    if (n + want <= *cap)
        return 0;
    size_t grown = *cap ? *cap : 64;
    while (grown < n + want)
        grown *= 2;
    grown = grown < most ? grown : most;
    void *q = grown >= n + want && grown <= SIZE_MAX / size ? realloc(*p, grown * size) : NULL;
    if (!q)
        return -1;
    *p = q;
    *cap = grown;
    return 0;
}

/* Note the call `c` is about to run (op, numbered seq, named name): 1, with c->trace its phases'
 * buffer, or 0 where it is not kept (past the bound, or no memory: counted, and it runs
 * untraced). Under the table's lock. */
int py_graph_trace_begin(py_graph_trace *t, fc_call *c, const fc_op *op, const char *name, int64_t seq)
{
    fc_ns now = fc_now();
    size_t left = t->phases_max - t->phases_kept;
    size_t phases = left < PY_TRACE_SPANS ? left : PY_TRACE_SPANS; /* the eager path's bound a call */
    size_t batch_max = t->phases_max - (t->phases_kept - t->nspans); /* this batch's share */
    if (t->calls_kept >= t->calls_max ||
        room((void **)&t->calls, &t->cap_calls, t->ncalls, 1, t->calls_max, sizeof *t->calls) ||
        (phases && room((void **)&t->spans, &t->cap_spans, t->nspans, phases, batch_max, sizeof *t->spans))) {
        if (!t->calls_dropped++)
            t->first_dropped = now;
        return 0;
    }
    py_graph_call *k = &t->calls[t->ncalls];
    int message = op->kind == FC_K_SEND || op->kind == FC_K_RECV;
    *k = (py_graph_call){.reached = now, .start = now, .end = now, .seq = seq, .first = t->nspans,
                         .peer = message ? c->ranks[op->root] : -1,
                         .bytes = message ? (int64_t)(op->kind == FC_K_SEND ? op->src_count : op->dst_count) : 0};
    snprintf(k->name, sizeof k->name, "%s", name);
    t->cur = (fc_trace){.spans = t->spans ? t->spans + t->nspans : NULL, .cap = phases, .n = 0, .dropped = 0};
    c->trace = &t->cur;
    return 1;
}

/* The noted call began to run (on the service thread, where it waited behind the queue). */
void py_graph_trace_started(py_graph_trace *t)
{
    t->calls[t->ncalls].start = fc_now();
}

/* The noted call ended, failed or not: its phases are kept. Under the table's lock. */
void py_graph_trace_end(py_graph_trace *t)
{
    py_graph_call *k = &t->calls[t->ncalls++];
    k->end = fc_now();
    k->n = t->cur.n < t->cur.cap ? t->cur.n : t->cur.cap;
    k->dropped = t->cur.dropped;
    t->nspans += k->n;
    t->phases_kept += k->n;
    t->calls_kept++;
}

/* ----- what Python takes ----- */

struct py_graph_batch {
    py_graph_call *calls;
    size_t ncalls;
    fc_span *spans;
    int64_t calls_dropped;
    fc_ns first_dropped;
};

py_graph_batch *py_graph_trace_detach(py_graph_trace *t)
{
    py_graph_batch *b = malloc(sizeof *b);
    if (!b)
        return NULL;
    *b = (py_graph_batch){t->calls, t->ncalls, t->spans, t->calls_dropped, t->first_dropped};
    t->calls = NULL; /* the next call starts a new batch; the bounds count every batch */
    t->spans = NULL;
    t->ncalls = t->cap_calls = t->nspans = t->cap_spans = 0;
    return b;
}

/* ((phase, peer, bytes, start, end) ...): as Runner.run returns a traced call's, in ns of fc_now. */
static PyObject *phases_of(const py_graph_call *k, const fc_span *spans)
{
    PyObject *out = PyTuple_New((Py_ssize_t)k->n);
    for (size_t i = 0; out && i < k->n; i++) {
        const fc_span *s = &spans[k->first + i];
        PyObject *one = Py_BuildValue("(iiLLL)", (int)s->phase, (int)s->peer, (long long)s->bytes,
                                      (long long)s->start, (long long)s->end);
        if (!one) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, one);
    }
    return out;
}

static PyObject *call_of(const py_graph_call *k, const fc_span *spans)
{
    PyObject *phases = phases_of(k, spans);
    if (!phases)
        return NULL;
    return Py_BuildValue("{s:s,s:L,s:L,s:L,s:L,s:i,s:L,s:L,s:N}", "name", k->name, "seq", (long long)k->seq,
                         "queued", (long long)k->reached, "start", (long long)k->start, "end", (long long)k->end,
                         "peer", (int)k->peer, "bytes", (long long)k->bytes, "dropped", (long long)k->dropped,
                         "phases", phases);
}

PyObject *py_graph_trace_report(py_graph_batch *b, fc_ns now)
{
    PyObject *calls = PyTuple_New((Py_ssize_t)b->ncalls);
    for (size_t i = 0; calls && i < b->ncalls; i++) {
        PyObject *one = call_of(&b->calls[i], b->spans);
        if (!one) {
            Py_CLEAR(calls);
            break;
        }
        PyTuple_SET_ITEM(calls, (Py_ssize_t)i, one);
    }
    PyObject *r = NULL;
    if (calls)
        r = Py_BuildValue("{s:L,s:N,s:L,s:L}", "now", (long long)now, "calls", calls, "dropped",
                          (long long)b->calls_dropped, "first_dropped", (long long)b->first_dropped);
    free(b->calls);
    free(b->spans);
    free(b);
    return r;
}
