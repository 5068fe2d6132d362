/* The communicators MPI_Comm_split makes, and their calls.
 *
 * A split is fastcoll's own (Group.split, in Python: fastcoll.mlx_compat.graph's callback, which
 * every rank of the parent reaches through MLX's Group.split), so its members, their order and
 * its name are the engine's. Its calls run here, over the graph table's point-to-point messages
 * (the engine opens one table, the job's): an all_reduce is a reduction up a binomial tree to the
 * group's rank 0 and a broadcast back down it, an all_gather a gather to rank 0 and the same
 * broadcast. Every message up the tree and every send is preceded by a header of fixed size
 * (which group, which of its calls, which collective of which dtype and count), which the
 * receiver checks before the data: ranks that call different collectives end with a
 * MismatchError in the user's terms, before any data of the wrong call is taken.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce/fc_reduce.h"
#include "mpi_lib.h"

#define COMMS_MAX 256
#define HDR_BYTES 40
#define HDR_MAGIC 0x46435342u /* "FCSB" */

split_fn mpi_split_callback;
static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mpi_comm *comms[COMMS_MAX]; /* the live splits: a handle MLX passes must be one */

int mpi_comm_known(const void *comm)
{
    if (comm == &ompi_mpi_comm_world)
        return 1;
    int found = 0;
    pthread_mutex_lock(&comms_lock);
    for (int i = 0; i < COMMS_MAX && !found; i++)
        found = comms[i] == comm;
    pthread_mutex_unlock(&comms_lock);
    return found && comm;
}

static void comm_free(struct mpi_comm *c)
{
    if (!c)
        return;
    free(c->ranks);
    free(c->sent);
    free(c->received);
    free(c->scratch);
    free(c);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Fill c from the callback's answer: 0, or -1 for an answer out of bounds. */
static int comm_fill(struct mpi_comm *c, int size, int rank, int table_size)
{
    if (size < 1 || rank < 0 || rank >= size || !memchr(c->name, 0, sizeof c->name))
        return -1;
    for (int i = 0; i < size; i++)
        if (c->ranks[i] < 0 || c->ranks[i] >= table_size)
            return -1;
    c->size = size;
    c->rank = rank;
    c->id = fnv1a(c->name);
    c->sent = calloc((size_t)size, sizeof *c->sent);
    c->received = calloc((size_t)size, sizeof *c->received);
    return c->sent && c->received ? 0 : -1;
}

/* The parent's size bounds the child's. MPI_SUCCESS, or MPI_ERR_COMM (said on stderr or kept by
 * Python to raise). */
int mpi_sub_split(struct mpi_comm *parent, int color, int key, struct mpi_comm **out)
{
    int most = parent->world ? ompi_mpi_comm_world.size : parent->size;
    struct mpi_comm *c = calloc(1, sizeof *c);
    if (!c || most < 1 || !(c->ranks = calloc((size_t)most, sizeof *c->ranks))) {
        comm_free(c);
        return MPI_ERR_INTERN;
    }
    int slot = -1;
    pthread_mutex_lock(&comms_lock);
    for (int i = 0; i < COMMS_MAX && slot < 0; i++)
        if (!comms[i])
            slot = i;
    if (slot >= 0)
        comms[slot] = c; /* known before Python sees it: the handle is valid once it returns */
    pthread_mutex_unlock(&comms_lock);
    int rank = -1, size = slot < 0 ? -1 : mpi_split_callback(parent, color, key, c, c->ranks, most, &rank,
                                                               c->name, (int)sizeof c->name);
    if (size < 0 || comm_fill(c, size, rank, ompi_mpi_comm_world.size)) {
        if (slot < 0)
            fprintf(stderr, "fastcoll: MPI_Comm_split: more than %d groups at once\n", COMMS_MAX);
        else if (size >= 0)
            fprintf(stderr, "fastcoll: MPI_Comm_split: fastcoll's split gave a group out of bounds\n");
        mpi_sub_free(c);
        return MPI_ERR_COMM;
    }
    *out = c;
    return MPI_SUCCESS;
}

int mpi_sub_free(struct mpi_comm *comm)
{
    int found = 0;
    pthread_mutex_lock(&comms_lock);
    for (int i = 0; i < COMMS_MAX; i++)
        if (comms[i] == comm) {
            comms[i] = NULL;
            found = 1;
        }
    pthread_mutex_unlock(&comms_lock);
    if (found)
        comm_free(comm);
    return found ? MPI_SUCCESS : MPI_ERR_COMM;
}

/* ----- headers ----- */

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* magic, kind | comm id | seq | count | dtype, op (each field little-endian) */
static void hdr_pack(uint8_t *h, const struct mpi_call *c, uint64_t seq)
{
    put64(h, (uint64_t)HDR_MAGIC | (uint64_t)(uint32_t)c->kind << 32);
    put64(h + 8, c->comm->id);
    put64(h + 16, seq);
    put64(h + 24, c->count);
    put64(h + 32, (uint64_t)(uint32_t)c->dtype | (uint64_t)(uint32_t)c->op << 32);
}

static void send_bytes(const fc_graph_api *a, const struct mpi_comm *comm, int to, const void *p, size_t n)
{
    a->send(a->ctx, p, n, comm->ranks[to]); /* a failure does not return (fc_graph.h) */
}

static void recv_bytes(const fc_graph_api *a, const struct mpi_comm *comm, int from, void *p, size_t n)
{
    a->recv(a->ctx, p, n, comm->ranks[from]);
}

/* Receive the header of group rank `from` and end the process unless it is `c`'s, call `seq`. */
static void hdr_expect(const fc_graph_api *a, const struct mpi_call *c, int from, uint64_t seq)
{
    uint8_t h[HDR_BYTES];
    recv_bytes(a, c->comm, from, h, sizeof h);
    uint64_t w0 = get64(h), w4 = get64(h + 32);
    /* as the sender named it: a send names its destination, this rank */
    struct mpi_call theirs = {(int)(uint32_t)(w0 >> 32), (int)(uint32_t)w4, (int)(uint32_t)(w4 >> 32),
                              get64(h + 24), from, c->comm->rank, c->comm};
    int kind = c->kind == CALL_RECV ? CALL_SEND : c->kind;
    if ((uint32_t)w0 == HDR_MAGIC && get64(h + 8) == c->comm->id && get64(h + 16) == seq && theirs.kind == kind &&
        theirs.count == c->count && theirs.dtype == c->dtype && theirs.op == c->op)
        return;
    char what[256], why[640];
    const char *who = mpi_rank_name(c->comm->ranks[from]);
    if ((uint32_t)w0 != HDR_MAGIC || get64(h + 8) != c->comm->id) {
        snprintf(why, sizeof why, "MismatchError: %s called a collective of another group", who);
    } else {
        /* from memory a peer wrote: named only where in bounds */
        if (theirs.kind < 0 || theirs.kind >= CALL_KINDS || theirs.dtype < 0 || theirs.dtype > FC_DTYPE_COUNT)
            theirs.kind = CALL_KINDS;
        mpi_describe(&theirs, what, sizeof what);
        snprintf(why, sizeof why, "MismatchError: %s called %s (its call %llu of the group, this rank's %llu)", who,
                 what, (unsigned long long)get64(h + 16), (unsigned long long)seq);
    }
    mpi_fatal(c, why);
}

static void send_with_header(const fc_graph_api *a, const struct mpi_call *c, int to, uint64_t seq, const void *p,
                             size_t n)
{
    uint8_t h[HDR_BYTES];
    hdr_pack(h, c, seq);
    send_bytes(a, c->comm, to, h, sizeof h);
    if (n)
        send_bytes(a, c->comm, to, p, n);
}

/* ----- the collectives ----- */

/* The group's rank 0 sends buf down the binomial tree; every other rank receives it. */
static void broadcast(const fc_graph_api *a, const struct mpi_comm *comm, void *buf, size_t n)
{
    int r = comm->rank, mask = 1;
    while (mask < comm->size) {
        if (r & mask) {
            recv_bytes(a, comm, r - mask, buf, n);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (r + mask < comm->size)
            send_bytes(a, comm, r + mask, buf, n);
}

static uint8_t *scratch(struct mpi_comm *comm, size_t n, const struct mpi_call *c)
{
    if (comm->scratch_bytes < n) {
        free(comm->scratch);
        comm->scratch_bytes = 0;
        if (!(comm->scratch = malloc(n)))
            mpi_fatal(c, "FastcollError: out of memory");
        comm->scratch_bytes = n;
    }
    return comm->scratch;
}

int mpi_sub_all_reduce(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                       void *dst, int dtype, int redop, const struct mpi_op *op, void *type, size_t itemsize)
{
    size_t n = (size_t)c->count * itemsize;
    uint64_t seq = comm->seq++;
    if (src != IN_PLACE && n)
        memmove(dst, src, n);
    uint8_t *in = n ? scratch(comm, n, c) : NULL;
    int r = comm->rank, mask = 1, len = (int)c->count;
    for (; mask < comm->size; mask <<= 1) {
        if (r & mask) { /* this rank's subtree is summed: up to its parent, then wait below */
            send_with_header(a, c, r - mask, seq, dst, n);
            break;
        }
        if (r + mask >= comm->size)
            continue;
        hdr_expect(a, c, r + mask, seq);
        if (!n)
            continue;
        recv_bytes(a, comm, r + mask, in, n);
        if (op->fn)
            op->fn(in, dst, &len, &type);
        else if (fc_reduce(dtype, redop, in, dst, dst, (size_t)c->count))
            mpi_fatal(c, "FastcollError: no such reduction of this dtype");
    }
    if (n)
        broadcast(a, comm, dst, n);
    return MPI_SUCCESS;
}

int mpi_sub_all_gather(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                       void *dst, size_t nbytes)
{
    uint64_t seq = comm->seq++;
    if (comm->rank != 0) {
        send_with_header(a, c, 0, seq, src, nbytes);
    } else {
        if (nbytes)
            memmove(dst, src, nbytes);
        for (int i = 1; i < comm->size; i++) {
            hdr_expect(a, c, i, seq);
            if (nbytes)
                recv_bytes(a, comm, i, (uint8_t *)dst + (size_t)i * nbytes, nbytes);
        }
    }
    if (nbytes)
        broadcast(a, comm, dst, nbytes * (size_t)comm->size);
    return MPI_SUCCESS;
}

int mpi_sub_send(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                 size_t nbytes)
{
    send_with_header(a, c, c->peer, comm->sent[c->peer]++, src, nbytes);
    return MPI_SUCCESS;
}

int mpi_sub_recv(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, void *dst, size_t nbytes)
{
    hdr_expect(a, c, c->peer, comm->received[c->peer]++);
    if (nbytes)
        recv_bytes(a, comm, c->peer, dst, nbytes);
    return MPI_SUCCESS;
}
