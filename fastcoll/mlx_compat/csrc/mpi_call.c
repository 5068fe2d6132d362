/* A call of MLX's graph as the user knows it: its name in the user's terms, the one line that
 * ends the process when it fails, and the check that no two MLX streams run calls at once.
 *
 * fastcoll.mlx_compat puts every collective of a Python thread on one MLX stream of its own, so
 * the calls of one thread reach this library one at a time, in the order the program made them,
 * on every rank alike. Two streams inside calls at once mean two threads (or a function of MLX's
 * own, copied out before install(), on the caller's stream): which of the two runs first is then
 * chance, may differ between ranks, and two calls of the same shape would trade their data. So
 * such an overlap ends the process, naming both calls, unless the two communicators share no rank
 * but this one (their order cannot matter then).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reduce/fc_reduce.h"
#include "mpi_lib.h"

int mpi_table_rank = -1;
static char **names; /* each table rank's name ("rank 1 (host h2)"), set at attach */
static int nnames;

static const char *const DTYPE_NAMES[FC_DTYPE_COUNT] = FC_DTYPE_NAMES; /* fastcoll/dtypes.py's */

/* `joined`: `size` names, each ended by '\n'. 0, or -1 (nothing kept). */
int mpi_names_set(const char *joined, int size)
{
    if (!joined || size < 1)
        return -1;
    char **list = calloc((size_t)size, sizeof *list);
    if (!list)
        return -1;
    const char *p = joined;
    int i = 0;
    for (; i < size; i++) {
        const char *end = strchr(p, '\n');
        if (!end || !(list[i] = strndup(p, (size_t)(end - p))))
            break;
        p = end + 1;
    }
    if (i < size || *p) {
        while (i > 0)
            free(list[--i]);
        free(list);
        return -1;
    }
    names = list; /* kept for the process's life: a failure may name any rank, any time */
    nnames = size;
    return 0;
}

const char *mpi_rank_name(int table_rank)
{
    return names && table_rank >= 0 && table_rank < nnames ? names[table_rank] : "a rank";
}

static const char *dtype_name(int dtype)
{
    return dtype >= 0 && dtype < FC_DTYPE_COUNT ? DTYPE_NAMES[dtype] : "a type MLX made";
}

static const char *op_name(int op)
{
    static const char *const OP_NAMES[FC_OP_COUNT] = FC_OP_NAMES;
    return op >= 0 && op < FC_OP_COUNT ? OP_NAMES[op] : "an op MLX made";
}

void mpi_describe(const struct mpi_call *c, char *out, size_t n)
{
    const char *prefix = c->comm && !c->comm->world ? c->comm->name : "";
    unsigned long long count = (unsigned long long)c->count;
    const char *dt = dtype_name(c->dtype);
    int me = c->me;
    switch (c->kind) {
    case CALL_ALL_REDUCE:
        snprintf(out, n, "%sall_reduce(%s,%s,(%llu,))", prefix, op_name(c->op), dt, count);
        break;
    case CALL_ALL_GATHER:
        snprintf(out, n, "%sall_gather(%s,(%llu,))", prefix, dt, count);
        break;
    case CALL_SEND: /* send(from,to,...) on both sides, as eager calls name them */
        snprintf(out, n, "%ssend(%d,%d,%s,(%llu,))", prefix, me, c->peer, dt, count);
        break;
    case CALL_RECV:
        snprintf(out, n, "%srecv(%d,%d,%s,(%llu,))", prefix, c->peer, me, dt, count);
        break;
    default:
        snprintf(out, n, "a call fastcoll does not know");
    }
}

_Noreturn void mpi_fatal(const struct mpi_call *c, const char *why)
{
    char what[256];
    mpi_describe(c, what, sizeof what);
    fprintf(stderr, "fastcoll: %s: %s in MLX's graph: %s\n", mpi_rank_name(mpi_table_rank), what, why);
    fflush(stderr);
    _exit(1);
}

/* ----- one stream at a time ----- */

#define SLOTS 8 /* calls in flight that are watched; beyond them, not watched */

static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int used;
    pthread_t thread;
    struct mpi_call call;
} slots[SLOTS];

static int member(const struct mpi_comm *c, int table_rank)
{
    if (c->world)
        return 1;
    for (int i = 0; i < c->size; i++)
        if (c->ranks[i] == table_rank)
            return 1;
    return 0;
}

/* Whether the two communicators have a rank in common besides this one (one communicator's calls
 * share its state, whatever its ranks). */
static int share(const struct mpi_comm *a, const struct mpi_comm *b)
{
    if (a == b)
        return 1;
    const struct mpi_comm *small = a->world ? b : a, *other = small == a ? b : a;
    for (int i = 0; i < small->size; i++)
        if (small->ranks[i] != mpi_table_rank && member(other, small->ranks[i]))
            return 1;
    return 0;
}

static _Noreturn void raced(const struct mpi_call *c, const struct mpi_call *other)
{
    char theirs[256], why[1024];
    mpi_describe(other, theirs, sizeof theirs);
    snprintf(why, sizeof why,
             "FastcollError: another MLX stream was inside %s at the same time, with ranks this call "
             "has too, so which of the two runs first is chance and can differ between ranks (two "
             "calls of one shape would trade their data). fastcoll puts each Python thread's "
             "collectives on one stream of its own: evaluate the collectives of ranks that share a "
             "group from one thread at a time (mx.synchronize() before another thread's), and call "
             "mx.distributed's functions after fastcoll.mlx_compat.install() (one copied out before "
             "runs on the stream of the call)",
             theirs);
    mpi_fatal(c, why);
}

int mpi_enter(const struct mpi_call *c)
{
    pthread_t self = pthread_self();
    int slot = -1;
    pthread_mutex_lock(&slot_lock);
    for (int i = 0; i < SLOTS; i++) {
        if (!slots[i].used) {
            slot = slot < 0 ? i : slot;
        } else if (!pthread_equal(slots[i].thread, self) && share(slots[i].call.comm, c->comm)) {
            struct mpi_call other = slots[i].call;
            pthread_mutex_unlock(&slot_lock);
            raced(c, &other);
        }
    }
    if (slot >= 0) {
        slots[slot].used = 1;
        slots[slot].thread = self;
        slots[slot].call = *c;
    }
    pthread_mutex_unlock(&slot_lock);
    return slot;
}

void mpi_leave(int slot)
{
    if (slot < 0 || slot >= SLOTS)
        return;
    pthread_mutex_lock(&slot_lock);
    slots[slot].used = 0;
    pthread_mutex_unlock(&slot_lock);
}
