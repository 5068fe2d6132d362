/* The Python side of the native engine: what the binding files share.
 *
 * The door: what Python sees is fastcoll/engine/door.py's PUBLIC_API, which native.py checks
 * against this module at import. An Engine (one rank's data plane) offers three small objects
 * over the one EngineObject below, each of few methods: its `runner` (collectives: an OpSpec
 * made once per call or plan, then run or queued with the call's own sequence number and
 * buffers; the graph table), its `links` (adding links, and the messages the pure-Python
 * schedules send over them) and its `gate` (the fence gate's host half). Every call takes an
 * OpSpec or keywords, or a few values of its own call (a sequence number, buffers, the task).
 *
 *   py_module.c   the module: its types, NativeError, the codes, reduce() and finish_mean()
 *   py_engine.c   the Engine type: set up, abort, interrupt; its three objects (py_facet)
 *   py_runner.c   the Runner: the run lock, inline runs, queued calls, the graph table
 *   py_spec.c     the OpSpec type: a call's fixed part by name, checked once; its binding
 *   py_args.c     an OpSpec's fields and a call's buffers from Python, checked, as an fc_op
 *   py_links.c    the Links: add, info, and the module's link_kinds()
 *   py_messages.c the Links' message calls (the pure-Python schedules over native links)
 *   py_gate.c     the GateHost: the control page, releases, the profile, submits
 *   py_close.c    the Engine's end: the last words after an abort, close() (finalize())
 *   py_trace.c    a traced run's phases, from the call's bounded buffer to Python
 *   py_items.c    what the service thread runs: queued calls, Python functions, gates, the
 *                 last words; completions; the references released later with the GIL
 *   py_graph.c    the graph table: collectives MLX's evaluation thread calls without Python
 *   py_graph_trace.c  the graph table's calls noted for the rank's trace (FASTCOLL_TRACE)
 *   py_graph_table.c  the GraphTable graph_open returns (the capsule, trace())
 *   py_graph_names.c  the graph table's signatures and failures, in the user's terms
 *                 (fastcoll.dtypes' names)
 *   py_results.c  the ResultCache type: memory for large results, kept between calls
 *
 * The GIL is released around every wait. The service thread never takes it to run a native
 * call: only a Python function queued behind native calls, and the report of a failure, do.
 */
#ifndef FC_PY_COMMON_H
#define FC_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "algorithms/fc_algo.h"
#include "core/fc_engine.h"
#include "gate/fc_gate.h"
#include "reduce/fc_reduce.h"
#include "core/fc_service.h"

typedef struct py_item py_item;
typedef struct py_graph py_graph;

typedef struct {
    PyObject_HEAD
    fc_engine engine;
    fc_service service;
    int ready;     /* the engine was set up */
    _Atomic int closed; /* close() began: no call is taken any more */
    int ended;     /* close() closed the links and let go of the rings */
    _Atomic int inline_call; /* a Python thread holds the run lock (claim_if_idle to release) */
    _Atomic int failed; /* a call failed: queued calls fail at once with the job's error */
    Py_buffer *segments; /* the shared-memory mappings the links use, held until the end */
    size_t nsegments;
    fc_gate gate;
    int gated;
    Py_buffer page; /* the gate's control page */
    PyObject *on_failure; /* on_failure(task, work, info, waited): a queued call failed */
    unsigned long main_thread; /* the thread that runs Python's signal handlers */
    pthread_t words_thread; /* finishes the last words when a link was busy at the abort */
    int words_started;
    fc_ns words_until;
    pthread_mutex_t dead_lock;
    py_item *dead; /* finished items whose Python references wait for the GIL */
    py_graph *graph; /* the graph table, once opened (py_graph.c) */
    unsigned long generation; /* py_fork_generation when it was made */
} EngineObject;

/* How many times this process is a fork's child (py_module.c counts them, pthread_atfork): an
 * engine made before the last fork is its parent's, whose links, threads and locks a child must
 * never touch, nor end. */
extern unsigned long py_fork_generation;

static inline int py_forked(const EngineObject *self)
{
    return self->generation != py_fork_generation;
}

/* A collective as Python hands it over (py_args.c): its fixed part (the fc_op's collective,
 * algorithm, dtype and root; its call's sequence number, signature, group and time limit), and
 * the buffers it reads and writes, held until it has run. */
typedef struct py_op {
    fc_op op;
    int64_t seq;
    double limit;
    int rank, size;
    size_t piece_bytes;
    uint8_t *sig; /* copies (malloc'd) */
    size_t sig_len;
    int32_t *ranks;
    Py_buffer src, dst, bounds, recv_bounds;
    int held; /* bit i: the i-th of src, dst, bounds, recv_bounds is held */
    int trace; /* run() notes its phases (fc_trace) and returns them */
    int64_t *even[2]; /* bounds computed here (None from Python: even blocks) */
} py_op;

/* An OpSpec's fields (Runner.spec's keywords), in this order; the first PF_REQUIRED must be
 * given, the others default to 0, None or False. */
enum py_field {
    PF_KIND, PF_ALGORITHM, PF_SIG, PF_LIMIT, PF_RANK, PF_SIZE, PF_RANKS, PF_PIECE_BYTES, PF_DTYPE, PF_ITEMSIZE,
    PF_REDUCE, PF_ROOT, PF_BOUNDS, PF_RECV_BOUNDS, PF_AGREE_COUNTS, PF_TRACE, PF_COUNT
};
#define PF_REQUIRED PF_REDUCE
extern const char *const py_field_names[PF_COUNT];

/* Fix o's fixed part from the fields (f[PF_*], NULL where absent), each checked, with an error
 * that names the field; 0, or -1 with a Python error (release o either way). */
int py_op_fix(py_op *o, PyObject *const *f, int job_size, int job_rank);
/* The buffers (src, dst: a buffer or None; bounds, recv_bounds: int64 pairs, or None for even
 * blocks), checked against the fixed part; 0, or -1 with a Python error. */
int py_op_bind(py_op *o, PyObject *src, PyObject *dst, PyObject *bounds, PyObject *recv_bounds);
/* Bind the engine's own memory (a gate's receive mailbox) as the destination, no source, even
 * bounds; 0, or -1 with a Python error. */
int py_op_bind_into(py_op *o, uint8_t *dst, size_t nbytes);
/* Release the buffers (holds the GIL); py_op_release also frees the fixed part. */
void py_op_unbind(py_op *o);
void py_op_release(py_op *o);
/* The fc_call that runs `o` on `e` (its deadline `limit` from now). */
void py_op_call(py_op *o, fc_engine *e, fc_call *c, fc_err *err);

/* The most phases one call keeps (more are counted as dropped): a 1 GiB all_reduce in 1 MiB
 * pieces over 8 ranks notes about 6,000. */
#define PY_TRACE_SPANS ((size_t)1 << 14)
/* A traced run's buffer (py_trace.c): taken (0, or -1 with MemoryError), then its phases for
 * Python, ((phase, peer, bytes, start_ns, end_ns) ..., dropped) with times since it was taken,
 * or the NativeError of a failed call, its `spans` attribute the same; either frees it. */
typedef struct py_trace {
    fc_trace t;
    fc_ns origin;
} py_trace;
int py_trace_begin(py_trace *pt);
PyObject *py_trace_end(py_trace *pt);
PyObject *py_trace_raise(py_trace *pt, const fc_err *err);

/* The error of a failed call as Python reads it: (code, peer, waiting_for, errno, n0, n1, n2,
 * n3, text). */
PyObject *py_err_info(const fc_err *err);
/* Raise NativeError(info) for err (or leave a signal handler's exception where it is). */
PyObject *py_raise(const fc_err *err);

extern PyObject *py_native_error;
extern PyTypeObject py_engine_type;
extern PyTypeObject py_runner_type;
extern PyTypeObject py_links_type;
extern PyTypeObject py_gate_type;
extern PyTypeObject py_spec_type;
extern PyTypeObject py_completion_type;
extern PyTypeObject py_result_cache_type;

/* One of an Engine's three objects (its runner, links or gate): a view that keeps the
 * EngineObject alive; its methods reach the engine through FACET(self). */
typedef struct {
    PyObject_HEAD
    EngineObject *engine;
} py_facet;
#define FACET(o) (((py_facet *)(o))->engine)
void py_facet_dealloc(PyObject *self);

/* py_results.c: ready its types (0, or -1 with a Python error). */
int py_results_ready(void);

/* py_spec.c: Runner.spec(**fields) -> an OpSpec for this engine's job. */
PyObject *py_spec_new(EngineObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* o = the OpSpec `spec` as call `seq` (sharing its signature and ranks: py_op_unbind, never
 * py_op_release, ends it), bound to src and dst (py_spec_bind) or to the engine's own memory
 * (py_spec_bind_into, dst != NULL); 0, or -1 with a Python error and nothing held. */
int py_spec_bind(PyObject *spec, const fc_engine *e, PyObject *seq, PyObject *src, PyObject *dst, py_op *o);
int py_spec_bind_into(PyObject *spec, const fc_engine *e, long long seq, uint8_t *dst, size_t nbytes, py_op *o);

/* py_items.c: queue an OpSpec's call (submit: seq, src, dst), a gate (GateHost.submit: call_seq,
 * gate_seq, nbytes, its exchange the spec's all_gather into the receive mailbox) or a Python
 * function; each returns a Completion. task and work are what on_failure gets. */
PyObject *py_completion_new(fc_done *d);
PyObject *py_submit_op(EngineObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_submit_gate(EngineObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_submit_call(EngineObject *self, PyObject *fn);

/* py_graph.c: graph_open(*, prefix, ranks, rank, limit, piece_bytes, all_reduce=(small_max,
 * small_algo, large_algo), all_gather=(the same), labels, dtype_names, op_names,
 * trace_calls=0, trace_phases=0 (both set: its calls are noted, py_graph_trace.c)) -> a capsule
 * of fc_graph_api (Runner.graph_open hands it out in a GraphTable); close refuses later calls
 * (after the one under way); free at the engine's end. */
PyObject *py_graph_open(EngineObject *self, PyObject *args, PyObject *kw);
void py_graph_close(EngineObject *self);
void py_graph_free(EngineObject *self);

/* py_graph_trace.c: the graph table's calls noted for the rank's trace (graph_open's
 * trace_calls and trace_phases: the most calls and phases kept in all, each at most its
 * maximum below). new: an empty record (NULL: no memory); begin (under the table's lock): 1 and
 * c->trace set where the call is kept, else 0 (counted); started: the call began to run (where
 * it waited behind the queue); end: it ended. detach (under the lock): what was noted since the
 * last, handed over (NULL: no memory); report (with the GIL, no lock): that as Python's
 * {"now", "calls", "dropped", "first_dropped"} (times in ns of fc_now, `now` when it was
 * asked), freeing it. */
#define PY_GRAPH_TRACE_NAME 192
/* 32 MiB of phases and about 30 MiB of calls (with their names) at most: a token of
 * tensor-parallel decode on two ranks makes two all_sums a layer of about 5 phases each (a
 * 32-layer model: 64 calls, 320 phases), so some 2,000 tokens are kept, more than a trace viewer
 * shows well; a pipelined token makes fewer. */
#define PY_GRAPH_TRACE_CALLS_MAX ((size_t)1 << 17)
#define PY_GRAPH_TRACE_PHASES_MAX ((size_t)1 << 20) /* both: _native.GRAPH_TRACE_MAX */
typedef struct py_graph_trace py_graph_trace;
typedef struct py_graph_batch py_graph_batch;
py_graph_trace *py_graph_trace_new(size_t calls_max, size_t phases_max);
void py_graph_trace_free(py_graph_trace *t);
int py_graph_trace_begin(py_graph_trace *t, fc_call *c, const fc_op *op, const char *name, int64_t seq);
void py_graph_trace_started(py_graph_trace *t);
void py_graph_trace_end(py_graph_trace *t);
py_graph_batch *py_graph_trace_detach(py_graph_trace *t);
PyObject *py_graph_trace_report(py_graph_batch *b, fc_ns now);
/* py_graph.c: the table's calls noted since the last (report's dict), or None where the table
 * does not trace or was never opened. */
PyObject *py_graph_traced(EngineObject *self);
/* py_graph_table.c: the GraphTable Runner.graph_open returns (it takes the capsule's reference). */
PyObject *py_graph_table_new(EngineObject *engine, PyObject *capsule);
extern PyTypeObject py_graph_table_type;

/* py_graph_names.c: the names of fastcoll.dtypes (names() in fc_reduce.h's code order, OPS),
 * which the graph table's signatures use. */
#define PY_GRAPH_NAME_MAX 16
typedef struct py_graph_names {
    char dtypes[FC_DTYPE_COUNT][PY_GRAPH_NAME_MAX];
    char ops[FC_OP_COUNT][PY_GRAPH_NAME_MAX];
} py_graph_names;
/* Take the tuples Python passes (one name per code); 0, or -1 with a ValueError. */
int py_graph_names_take(py_graph_names *n, PyObject *dtypes, PyObject *ops);
/* "<prefix>all_reduce(sum,float32,(64,))": the op and dtype as the user named them where known
 * (name_dtype, name_op: -1 where not), else the engine's ("custom" for an op MLX made). */
void py_graph_sig_all_reduce(const py_graph_names *n, char *out, size_t size, const char *prefix, size_t count,
                             int dtype, int redop, int user, int name_dtype, int name_op);
/* "<prefix>all_gather(float32,(4,))"; uint8 and the byte count where the dtype is not known. */
void py_graph_sig_all_gather(const py_graph_names *n, char *out, size_t size, const char *prefix, size_t nbytes,
                             int name_dtype);

/* The error as fastcoll/engine/native.py's error_from words it (its class first), `who` the
 * peer's label and `limit` the table's time limit, into out (n bytes). */
void py_graph_describe(const fc_err *e, const char *who, double limit, char *out, size_t n);

/* py_engine.c: release the GIL for a wait; on the main thread, let the wait run Python's signal handlers. */
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

/* py_engine.c: 1 if the engine takes calls; else 0 with a Python error (a RuntimeError if it
 * was never set up; NativeError(FC_E_SHUT), "this group was finalized", once closed). */
int py_usable(EngineObject *self);

/* py_messages.c: the Links' message calls (see each). */
PyObject *py_send(PyObject *links, PyObject *args);
PyObject *py_send_raw(PyObject *links, PyObject *args);
PyObject *py_flush(PyObject *links, PyObject *arg);
PyObject *py_next_header(PyObject *links, PyObject *args);
PyObject *py_read_payload(PyObject *links, PyObject *args);
PyObject *py_keep_unread(PyObject *links, PyObject *args);

/* py_close.c: the Engine's abort(frame, seconds) and close(flush_seconds, linger_seconds);
 * py_engine_end frees everything as the object goes. */
PyObject *py_engine_abort(EngineObject *self, PyObject *args);
PyObject *py_engine_close(EngineObject *self, PyObject *args);
void py_engine_end(EngineObject *self);

/* py_links.c: the module's link_kinds(). */
PyObject *py_link_kinds(PyObject *module, PyObject *unused);

/* Release the Python references of finished items (holds the GIL). */
void py_reap(EngineObject *self);

/* Signal checks for a wait on the main thread: set around a wait that released the GIL. */
typedef struct py_signals {
    PyThreadState *ts;
} py_signals;
int py_check_signals(void *ctx);

#endif
