/* The MPI library fastcoll gives MLX: Open MPI's ABI, as much of it as MLX's MPI backend
 * (mlx/distributed/mpi/mpi.cpp) loads, over fastcoll's engine.
 *
 * MLX runs a collective of its MPI backend inside its graph, on its evaluation thread, where a
 * collective called through Python cannot be. fastcoll.mlx_compat points MLX_MPI_LIBNAME here
 * and hands this library the engine's graph table (fastcoll_mpi_attach); MLX then calls
 * MPI_Allreduce and the rest, and each call runs on fastcoll's links without Python.
 *
 * Open MPI's handles are the addresses of its predefined objects (ompi_mpi_float,
 * ompi_mpi_op_sum, ompi_mpi_comm_world), which MLX looks up by name: they are defined here with
 * what a call needs to know of them. Derived types (MPI_Type_contiguous) and user ops
 * (MPI_Op_create: MLX's float16/bfloat16 sums) live in small tables. MPI_Comm_split is
 * fastcoll's own Group.split, and the communicators it makes run their calls in mpi_sub.c. A
 * call fastcoll cannot serve (an unknown handle) says so on stderr; one that fails on the wire
 * ends the process (fc_graph.h, mpi_call.c), as MPI's default error handler ends the job, with
 * one line that names the call as the user made it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "reduce/fc_reduce.h"
#include "mpi_abi.h"
#include "mpi_lib.h"

#define TYPES_MAX 16
#define OPS_MAX 32

/* Open MPI's MPI_Status, whose first three fields MPI_Recv fills. */
typedef struct {
    int source, tag, error, cancelled;
    size_t ucount;
} mpi_status;

#define TYPE(name, code, bytes) EXPORT struct mpi_type name = {code, bytes, 0, code}
TYPE(ompi_mpi_c_bool, FC_BOOL, 1);
TYPE(ompi_mpi_int8_t, FC_INT8, 1);
TYPE(ompi_mpi_uint8_t, FC_UINT8, 1);
TYPE(ompi_mpi_int16_t, FC_INT16, 2);
TYPE(ompi_mpi_uint16_t, FC_UINT16, 2);
TYPE(ompi_mpi_int32_t, FC_INT32, 4);
TYPE(ompi_mpi_uint32_t, FC_UINT32, 4);
TYPE(ompi_mpi_int64_t, FC_INT64, 8);
TYPE(ompi_mpi_uint64_t, FC_UINT64, 8);
TYPE(ompi_mpi_float, FC_FLOAT32, 4);
TYPE(ompi_mpi_double, FC_FLOAT64, 8);
TYPE(ompi_mpi_c_complex, FC_COMPLEX64, 8);
EXPORT struct mpi_op ompi_mpi_op_sum = {FC_SUM, NULL, FC_SUM};
EXPORT struct mpi_op ompi_mpi_op_max = {FC_MAX, NULL, FC_MAX};
EXPORT struct mpi_op ompi_mpi_op_min = {FC_MIN, NULL, FC_MIN};
EXPORT struct mpi_comm ompi_mpi_comm_world = {.world = 1};

/* What MLX's MPI backend makes at MPI_Init, in this order (mlx/distributed/mpi/mpi.cpp,
 * init_safe): two 2-byte types, float16's and bfloat16's, then the ops sum (float16, bfloat16),
 * max (float16, bfloat16, complex64) and min (the same three). Only the names in messages come
 * from this order; what a call computes comes from the ops themselves. */
static const int DERIVED_NAMES[] = {FC_FLOAT16, FC_BFLOAT16};
static const int USER_OP_NAMES[] = {FC_SUM, FC_SUM, FC_MAX, FC_MAX, FC_MAX, FC_MIN, FC_MIN, FC_MIN};

/* The library's one state: the process's engine table (MPI itself is one per process). */
static pthread_rwlock_t attach_lock = PTHREAD_RWLOCK_INITIALIZER;
static const fc_graph_api *api;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mpi_type types[TYPES_MAX];
static int ntypes;
static struct mpi_op ops[OPS_MAX];
static int nops;

static int refuse(const char *call, const char *why, int code)
{
    fprintf(stderr, "fastcoll: %s: %s\n", call, why);
    return code;
}

/* ----- attaching (fastcoll.mlx_compat.graph) ----- */

/* 0; -1 for a table of another version, or names that are not one line for each of its ranks.
 * `names`: who each rank of the table is, for messages; `split`: fastcoll's Group.split. */
EXPORT int fastcoll_mpi_attach(const fc_graph_api *table, const char *names, split_fn split)
{
    if (!table || table->version != FC_GRAPH_VERSION || !split || mpi_names_set(names, table->size))
        return -1;
    pthread_rwlock_wrlock(&attach_lock);
    api = table;
    mpi_table_rank = table->rank;
    ompi_mpi_comm_world.rank = table->rank;
    ompi_mpi_comm_world.size = table->size;
    mpi_split_callback = split;
    pthread_rwlock_unlock(&attach_lock);
    return 0;
}

/* After the call under way; later calls are refused. */
EXPORT void fastcoll_mpi_detach(void)
{
    pthread_rwlock_wrlock(&attach_lock);
    api = NULL;
    pthread_rwlock_unlock(&attach_lock);
}

/* The table, read-locked until done(); NULL (unlocked) when fastcoll is not attached. */
static const fc_graph_api *use(void)
{
    pthread_rwlock_rdlock(&attach_lock);
    if (!api)
        pthread_rwlock_unlock(&attach_lock);
    return api;
}

static void done(void)
{
    pthread_rwlock_unlock(&attach_lock);
}

/* ----- the library ----- */

EXPORT int MPI_Get_library_version(char *version, int *len)
{
    /* MLX accepts a library whose version names Open MPI (its ABI is what MLX was built for). */
    static const char text[] = "fastcoll's graph library (Open MPI ABI, for MLX)";
    if (!version || !len)
        return MPI_ERR_ARG;
    memcpy(version, text, sizeof text);
    *len = (int)sizeof text - 1;
    return MPI_SUCCESS;
}

EXPORT int MPI_Init(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const fc_graph_api *a = use();
    if (!a)
        return refuse("MPI_Init", "fastcoll.mlx_compat did not attach a job (use its init())", MPI_ERR_OTHER);
    done();
    return MPI_SUCCESS;
}

EXPORT int MPI_Finalize(void)
{
    return MPI_SUCCESS; /* fastcoll.finalize() ends the job */
}

static int comm_number(const void *comm, int *out, int rank)
{
    const fc_graph_api *a = use();
    if (!a || !out || !mpi_comm_known(comm)) {
        if (a)
            done();
        return MPI_ERR_COMM;
    }
    const struct mpi_comm *c = comm;
    *out = rank ? c->rank : c->size;
    done();
    return MPI_SUCCESS;
}

EXPORT int MPI_Comm_rank(void *comm, int *rank)
{
    return comm_number(comm, rank, 1);
}

EXPORT int MPI_Comm_size(void *comm, int *size)
{
    return comm_number(comm, size, 0);
}

/* fastcoll's Group.split, through fastcoll.mlx_compat.graph: MLX calls it from Group.split on
 * the program's thread, where Python runs. The table is not held meanwhile: Python's split
 * waits for this thread's graph calls first, which need it. */
EXPORT int MPI_Comm_split(void *comm, int color, int key, void **out)
{
    const fc_graph_api *a = use();
    if (!a)
        return refuse("MPI_Comm_split", "fastcoll.mlx_compat did not attach a job (use its init())", MPI_ERR_COMM);
    done();
    if (!out || !mpi_comm_known(comm) || key < 0)
        return refuse("MPI_Comm_split", "not a communicator of fastcoll's graph library, or a negative key",
                      MPI_ERR_COMM);
    return mpi_sub_split(comm, color, key, (struct mpi_comm **)out);
}

EXPORT int MPI_Comm_free(void **comm)
{
    if (!comm || !*comm)
        return MPI_ERR_COMM;
    if (*comm == &ompi_mpi_comm_world)
        return MPI_SUCCESS;
    int rc = mpi_sub_free(*comm);
    *comm = NULL;
    return rc;
}

EXPORT int MPI_Type_contiguous(int count, void *old, void **out)
{
    const struct mpi_type *t = old;
    if (!out || !t || count < 1 || t->size > SIZE_MAX / (size_t)count)
        return refuse("MPI_Type_contiguous", "a bad count or type", MPI_ERR_TYPE);
    size_t size = (size_t)count * t->size;
    int code = size == 1 ? FC_UINT8 : size == 2 ? FC_UINT16 : size == 4 ? FC_UINT32 : size == 8 ? FC_UINT64 : -1;
    if (code < 0)
        return refuse("MPI_Type_contiguous", "only types of 1, 2, 4 or 8 bytes", MPI_ERR_TYPE);
    pthread_mutex_lock(&table_lock);
    if (ntypes == TYPES_MAX) {
        pthread_mutex_unlock(&table_lock);
        return refuse("MPI_Type_contiguous", "too many derived types", MPI_ERR_INTERN);
    }
    int name = ntypes < 2 && size == 2 ? DERIVED_NAMES[ntypes] : FC_DTYPE_COUNT;
    types[ntypes] = (struct mpi_type){code, size, 1, name};
    *out = &types[ntypes++];
    pthread_mutex_unlock(&table_lock);
    return MPI_SUCCESS;
}

EXPORT int MPI_Type_commit(void **type)
{
    return type && *type ? MPI_SUCCESS : MPI_ERR_TYPE;
}

EXPORT int MPI_Op_create(user_fn fn, int commute, void **out)
{
    if (!fn || !out || !commute)
        return refuse("MPI_Op_create", "only commutative functions", MPI_ERR_OP);
    pthread_mutex_lock(&table_lock);
    if (nops == OPS_MAX) {
        pthread_mutex_unlock(&table_lock);
        return refuse("MPI_Op_create", "too many ops", MPI_ERR_INTERN);
    }
    int n = (int)(sizeof USER_OP_NAMES / sizeof USER_OP_NAMES[0]);
    ops[nops] = (struct mpi_op){-1, fn, nops < n ? USER_OP_NAMES[nops] : -1};
    *out = &ops[nops++];
    pthread_mutex_unlock(&table_lock);
    return MPI_SUCCESS;
}

/* ----- the calls MLX's graph makes ----- */

/* Check a call's handles and take the table; the call as the user knows it in *c. */
static int calling(const char *call, struct mpi_call *c, void *comm, int count, const void *type,
                   const fc_graph_api **a)
{
    if (!mpi_comm_known(comm))
        return refuse(call, "not a communicator of fastcoll's graph library", MPI_ERR_COMM);
    if (count < 0 || !type)
        return refuse(call, "a negative count or no type", MPI_ERR_ARG);
    const struct mpi_comm *m = comm;
    c->comm = m;
    c->count = (uint64_t)count;
    c->dtype = ((const struct mpi_type *)type)->name;
    c->me = m->rank;
    if ((c->kind == CALL_SEND || c->kind == CALL_RECV) && (c->peer < 0 || c->peer >= m->size || c->peer == m->rank))
        mpi_fatal(c, "FastcollError: no such peer in the group (or this rank itself)");
    if (!(*a = use())) {
        fprintf(stderr, "fastcoll: %s: called after fastcoll.finalize() or before init(); ending the process\n",
                call);
        _exit(1); /* MLX ignores a collective's result: going on would compute with garbage */
    }
    return MPI_SUCCESS;
}

/* The dtype the user knows t as (fc_reduce.h's code), for the table's signatures; -1 where
 * not known, or not of t's size. */
static int user_dtype(const struct mpi_type *t)
{
    return t->name >= 0 && t->name < FC_DTYPE_COUNT && fc_itemsize(t->name) == t->size ? t->name : -1;
}

static int finish(int slot, int rc)
{
    mpi_leave(slot);
    done();
    return rc ? MPI_ERR_OTHER : MPI_SUCCESS;
}

EXPORT int MPI_Allreduce(const void *src, void *dst, int count, void *type, void *op, void *comm)
{
    const fc_graph_api *a;
    const struct mpi_type *t = type;
    const struct mpi_op *o = op;
    struct mpi_call c = {CALL_ALL_REDUCE, 0, o ? o->name : -1, 0, 0, -1, NULL};
    int rc = calling("MPI_Allreduce", &c, comm, count, type, &a);
    if (rc)
        return rc;
    if (!o || (t->derived && o->redop >= 0)) {
        done();
        return refuse("MPI_Allreduce", "a built-in op on a derived type", MPI_ERR_OP);
    }
    int dtype = t->dtype, redop = o->redop < 0 ? FC_SUM : o->redop;
    if (dtype == FC_BOOL && !o->fn) { /* bytes of 0 and 1: a sum or max is an or, a min an and */
        dtype = FC_UINT8;
        redop = redop == FC_MIN ? FC_MIN : FC_MAX;
    }
    /* A user op reduces by itself (dtype gives only the element size); the table's signature
     * names the call as the user made it (a sum of bool, not a max of uint8). */
    int slot = mpi_enter(&c);
    struct mpi_comm *m = comm;
    if (m->world)
        rc = a->all_reduce(a->ctx, src == IN_PLACE ? dst : src, dst, (size_t)count, dtype, redop, o->fn, type,
                           user_dtype(t), o->name);
    else
        rc = mpi_sub_all_reduce(a, m, &c, src, dst, dtype, redop, o, type, t->size);
    return finish(slot, rc);
}

EXPORT int MPI_Allgather(const void *src, int count, void *type, void *dst, int rcount, void *rtype, void *comm)
{
    const fc_graph_api *a;
    const struct mpi_type *t = type, *rt = rtype;
    struct mpi_call c = {CALL_ALL_GATHER, 0, -1, 0, 0, -1, NULL};
    int rc = calling("MPI_Allgather", &c, comm, count, type, &a);
    if (rc)
        return rc;
    if (!rt || rcount < 0 || (size_t)rcount * rt->size != (size_t)count * t->size || src == IN_PLACE) {
        done();
        return refuse("MPI_Allgather", "send and receive blocks differ (or MPI_IN_PLACE)", MPI_ERR_ARG);
    }
    int slot = mpi_enter(&c);
    struct mpi_comm *m = comm;
    if (m->world)
        rc = a->all_gather(a->ctx, src, dst, (size_t)count * t->size, user_dtype(t));
    else
        rc = mpi_sub_all_gather(a, m, &c, src, dst, (size_t)count * t->size);
    return finish(slot, rc);
}

EXPORT int MPI_Send(const void *src, int count, void *type, int dst, int tag, void *comm)
{
    (void)tag; /* messages between two ranks keep their order: MLX sends with tag 0 */
    const fc_graph_api *a;
    struct mpi_call c = {CALL_SEND, 0, -1, 0, 0, dst, NULL};
    int rc = calling("MPI_Send", &c, comm, count, type, &a);
    if (rc)
        return rc;
    size_t n = (size_t)count * ((const struct mpi_type *)type)->size;
    int slot = mpi_enter(&c);
    struct mpi_comm *m = comm;
    rc = m->world ? a->send(a->ctx, src, n, dst) : mpi_sub_send(a, m, &c, src, n);
    return finish(slot, rc);
}

EXPORT int MPI_Recv(void *dst, int count, void *type, int src, int tag, void *comm, void *status)
{
    const fc_graph_api *a;
    struct mpi_call c = {CALL_RECV, 0, -1, 0, 0, src, NULL};
    int rc = calling("MPI_Recv", &c, comm, count, type, &a);
    if (rc)
        return rc;
    size_t n = (size_t)count * ((const struct mpi_type *)type)->size;
    int slot = mpi_enter(&c);
    struct mpi_comm *m = comm;
    rc = m->world ? a->recv(a->ctx, dst, n, src) : mpi_sub_recv(a, m, &c, dst, n);
    if (status) {
        mpi_status *s = status;
        s->source = src;
        s->tag = tag < 0 ? 0 : tag;
        s->error = MPI_SUCCESS;
    }
    return finish(slot, rc);
}
