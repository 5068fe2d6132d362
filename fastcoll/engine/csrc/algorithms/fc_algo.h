/* Collective algorithms in C: the native engine's schedules, tuned, which the pure-Python
 * engine's one schedule per collective (fastcoll/algorithms/reference.py) is the reference for.
 * Every schedule combines each element in one order on every rank, so every rank gets the same
 * bits; the direct exchange combines in rank order, as the Python engine does.
 *
 * An algorithm is one file that defines an fc_algorithm (a function per collective it runs,
 * NULL for the others) and one entry in fc_algo.c's registry; its functions see one fc_call
 * (the group's rank and size, send/recv/flush addressed by group rank) and one fc_op.
 */
#ifndef FC_ALGO_H
#define FC_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "core/fc_engine.h"
#include "base/fc_mem.h"

/* The collectives (fastcoll/engine/ops.py's KINDS, in this order). */
enum fc_kind {
    FC_K_ALL_REDUCE = 0, FC_K_ALL_GATHER, FC_K_REDUCE_SCATTER, FC_K_BROADCAST, FC_K_BARRIER,
    FC_K_ALL_TO_ALL, FC_K_GATHER, FC_K_SCATTER, FC_K_REDUCE, FC_K_SEND, FC_K_RECV, FC_K_COUNT
};
_Static_assert(FC_K_COUNT <= 32, "fc_engine's long_kinds keeps a bit a kind");

/* The algorithms (fastcoll/algorithms/select.py's ALGORITHMS, in this order). */
enum fc_algo_id { FC_A_DIRECT = 0, FC_A_DOUBLING, FC_A_RING, FC_A_PAIRWISE, FC_A_CHAIN, FC_A_COUNT };

/* One collective on flat buffers; counts and bounds in elements of `itemsize` bytes. An
 * all_gather's src, if given, is this rank's block (copied into place first); a broadcast's
 * root may give its buffer as src alone (it is only read). */
/* A reduction given as a function (an MPI user op, MPI_User_function's shape): inout[i] = in[i]
 * op inout[i] for i < *len. It must be commutative, as MPI_Op_create(fn, 1, ...) declares. */
typedef void (*fc_user_op)(void *in, void *inout, int *len, void **type);

typedef struct fc_op {
    int kind, algo, dtype, redop;
    fc_user_op user; /* reduces instead of (dtype, redop) when set */
    void *user_type;  /* the handle passed to `user` */
    int root; /* a rooted collective's root; a send's or a receive's peer */
    size_t itemsize;
    const uint8_t *src;
    size_t src_count;
    uint8_t *dst;
    size_t dst_count;
    const int64_t *bounds;      /* (start, end) per rank */
    const int64_t *recv_bounds; /* all_to_all: where each rank's block lands */
    int agree_counts; /* all_to_all: each pair first confirms how many elements it exchanges */
} fc_op;

/* A traced call's phases (FASTCOLL_TRACE), the names fastcoll/trace.py writes, in this order
 * (the module's PHASES): each send, each wait for a peer's header, each payload received, each
 * reduction and each flush, noted by fc_trace.c into a bounded buffer the caller gives. */
enum fc_phase { FC_P_SEND = 0, FC_P_WAIT, FC_P_RECEIVE, FC_P_REDUCE, FC_P_FLUSH, FC_P_COUNT };

typedef struct fc_span {
    fc_ns start, end;
    int64_t bytes;
    int32_t peer;  /* the job's rank, or -1 (a reduction, a flush) */
    int32_t phase; /* enum fc_phase */
} fc_span;

typedef struct fc_trace {
    fc_span *spans; /* cap of them; the first n noted */
    size_t cap, n;
    int64_t dropped; /* phases past cap, counted but not kept */
} fc_trace;

/* One call as the algorithms see it. */
typedef struct fc_call {
    fc_engine *e;
    int64_t seq;
    const uint8_t *sig;
    size_t sig_len;
    fc_ns deadline;
    int rank, size;
    const int32_t *ranks; /* the job's rank of each group rank */
    size_t piece_bytes;
    size_t itemsize;
    int64_t sent, received; /* the ring's messages to its right and from its left */
    fc_err *err;
    /* The agreement (fc_agree.c): per group rank, its agreement message is still to be read
     * (NULL: the call has none, or it has been read from everyone). */
    uint8_t *owed;
    const fc_op *agreeing; /* the op it is about (an all_to_all's counts) */
    uint8_t *pair_sig;     /* scratch for an agreement message's signature */
    fc_trace *trace;       /* where its phases are noted; NULL (untraced): one branch a primitive */
} fc_call;

typedef int (*fc_run_fn)(fc_call *c, const fc_op *op);

typedef struct fc_algorithm {
    const char *name;
    fc_run_fn run[FC_K_COUNT];
} fc_algorithm;

extern const fc_algorithm fc_algo_direct, fc_algo_doubling, fc_algo_ring, fc_algo_pairwise, fc_algo_chain;

/* The agreement (fc_agree.c, fastcoll/algorithms/__init__.py's Call.agree): whether op has one;
 * tell every peer this rank's signature (an all_to_all with agree_counts: each pair's own); read
 * every one still owed (fc_recv and fc_flush do, before this rank first waits); read the rest
 * and free what the agreement held (called once begun, failed or not, `ok` if the call went
 * well: 0, or -1 with c->err set). */
int fc_agree_needed(const fc_op *op);
int fc_agree_begin(fc_call *c, const fc_op *op);
int fc_agree_take_all(fc_call *c);
int fc_agree_end(fc_call *c, int ok);

/* Run `op` through its algorithm (and finish a mean). 0, or -1 with c->err set. */
int fc_run(fc_call *c, const fc_op *op);
/* Whether the registry has op's (algorithm, kind). */
int fc_can_run(int algo, int kind);

/* The primitives, by group rank; counts in elements of c->itemsize. */
int fc_send(fc_call *c, int peer, int64_t chunk, const uint8_t *p, size_t count);
int fc_recv(fc_call *c, int peer, int64_t chunk, uint8_t *p, size_t count);
int fc_flush(fc_call *c);
/* Elements a piece carries (fastcoll's Call.piece_items). */
size_t fc_piece_items(const fc_call *c);
/* out = a op b over count elements (the op's dtype and reduction), noted if c is traced. */
void fc_combine(fc_call *c, const fc_op *op, const uint8_t *a, const uint8_t *b, uint8_t *out, size_t count);
/* The primitives of a traced call (fc_trace.c; `peer` by group rank, `job_peer` by the job's
 * rank, counts in bytes for fc_trace_recv), each noted as its phase, failed or not. */
void fc_trace_note(fc_trace *t, int phase, int peer, size_t bytes, fc_ns start);
int fc_trace_send(fc_call *c, int peer, int64_t chunk, const uint8_t *p, size_t count);
int fc_trace_recv(fc_call *c, int job_peer, const uint8_t *sig, size_t sig_len, int64_t chunk, uint8_t *p,
                  size_t bytes);
int fc_trace_flush(fc_call *c);
/* Memory an algorithm needs (NULL: c->err is FC_E_NOMEM); fc_scratch_free gives it back. */
void *fc_scratch(fc_call *c, size_t bytes);

/* range(n) cut into `parts` blocks whose sizes differ by at most one: block i is [*a, *b). */
void fc_block(size_t n, int parts, int i, int64_t *a, int64_t *b);
/* How many pieces of at most `step` items [a, b) is cut into (an empty range is one piece). */
size_t fc_piece_count(int64_t a, int64_t b, size_t step);
/* Piece k of [a, b): [*pa, *pb). */
void fc_piece(int64_t a, int64_t b, size_t step, size_t k, int64_t *pa, int64_t *pb);

#define FC_AT(buf, i, itemsize) ((buf) + (size_t)(i) * (itemsize))

#endif
