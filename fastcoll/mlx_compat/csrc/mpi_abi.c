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
 * (MPI_Op_create: MLX's float16/bfloat16 sums) live in small tables. A call fastcoll cannot
 * serve (an unknown handle, a split communicator) says so on stderr; one that fails on the wire
 * ends the process (fc_graph.h), as MPI's default error handler ends the job.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fc_reduce.h"
#include "mpi_abi.h"

#define EXPORT __attribute__((visibility("default")))

#define MPI_SUCCESS 0
#define MPI_ERR_TYPE 3
#define MPI_ERR_COMM 5
#define MPI_ERR_OP 9
#define MPI_ERR_ARG 12
#define MPI_ERR_OTHER 15
#define MPI_ERR_INTERN 17
#define IN_PLACE ((void *)1) /* Open MPI's MPI_IN_PLACE */
#define TYPES_MAX 16
#define OPS_MAX 32

typedef void (*user_fn)(void *, void *, int *, void **);

struct mpi_type {
    int dtype;   /* fc_reduce.h's code; a derived type: the unsigned type of its size */
    size_t size; /* bytes an element */
    int derived;
};
struct mpi_op {
    int redop; /* FC_SUM, FC_MIN, FC_MAX; -1 for a user op */
    user_fn fn;
};
struct mpi_comm {
    int world;
};
/* Open MPI's MPI_Status, whose first three fields MPI_Recv fills. */
typedef struct {
    int source, tag, error, cancelled;
    size_t ucount;
} mpi_status;

#define TYPE(name, code, bytes) EXPORT struct mpi_type name = {code, bytes, 0}
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
EXPORT struct mpi_op ompi_mpi_op_sum = {FC_SUM, NULL};
EXPORT struct mpi_op ompi_mpi_op_max = {FC_MAX, NULL};
EXPORT struct mpi_op ompi_mpi_op_min = {FC_MIN, NULL};
EXPORT struct mpi_comm ompi_mpi_comm_world = {1};

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

/* 0, or -1 for a table of another version. */
EXPORT int fastcoll_mpi_attach(const fc_graph_api *table)
{
    if (!table || table->version != FC_GRAPH_VERSION)
        return -1;
    pthread_rwlock_wrlock(&attach_lock);
    api = table;
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

static int world(const void *comm)
{
    return comm == &ompi_mpi_comm_world;
}

static int comm_number(const void *comm, int *out, int rank)
{
    const fc_graph_api *a = use();
    if (!a || !world(comm) || !out) {
        if (a)
            done();
        return MPI_ERR_COMM;
    }
    *out = rank ? a->rank : a->size;
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

EXPORT int MPI_Comm_split(void *comm, int color, int key, void **out)
{
    (void)comm;
    (void)color;
    (void)key;
    (void)out;
    return refuse("MPI_Comm_split", "fastcoll's graph library has one group: the job", MPI_ERR_COMM);
}

EXPORT int MPI_Comm_free(void **comm)
{
    (void)comm;
    return MPI_SUCCESS;
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
    types[ntypes] = (struct mpi_type){code, size, 1};
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
    ops[nops] = (struct mpi_op){-1, fn};
    *out = &ops[nops++];
    pthread_mutex_unlock(&table_lock);
    return MPI_SUCCESS;
}

/* ----- the calls MLX's graph makes ----- */

static int calling(const char *call, const void *comm, int count, const void *type, const fc_graph_api **a)
{
    if (!world(comm))
        return refuse(call, "not a communicator of fastcoll's graph library", MPI_ERR_COMM);
    if (count < 0 || !type)
        return refuse(call, "a negative count or no type", MPI_ERR_ARG);
    if (!(*a = use())) {
        fprintf(stderr, "fastcoll: %s: called after fastcoll.finalize() or before init(); ending the process\n",
                call);
        _exit(1); /* MLX ignores a collective's result: going on would compute with garbage */
    }
    return MPI_SUCCESS;
}

EXPORT int MPI_Allreduce(const void *src, void *dst, int count, void *type, void *op, void *comm)
{
    const fc_graph_api *a;
    const struct mpi_type *t = type;
    const struct mpi_op *o = op;
    int rc = calling("MPI_Allreduce", comm, count, type, &a);
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
    rc = a->all_reduce(a->ctx, src == IN_PLACE ? dst : src, dst, (size_t)count, dtype, redop, o->fn, type);
    done();
    return rc ? MPI_ERR_OTHER : MPI_SUCCESS;
}

EXPORT int MPI_Allgather(const void *src, int count, void *type, void *dst, int rcount, void *rtype, void *comm)
{
    const fc_graph_api *a;
    const struct mpi_type *t = type, *rt = rtype;
    int rc = calling("MPI_Allgather", comm, count, type, &a);
    if (rc)
        return rc;
    if (!rt || rcount < 0 || (size_t)rcount * rt->size != (size_t)count * t->size || src == IN_PLACE) {
        done();
        return refuse("MPI_Allgather", "send and receive blocks differ (or MPI_IN_PLACE)", MPI_ERR_ARG);
    }
    rc = a->all_gather(a->ctx, src, dst, (size_t)count * t->size);
    done();
    return rc ? MPI_ERR_OTHER : MPI_SUCCESS;
}

EXPORT int MPI_Send(const void *src, int count, void *type, int dst, int tag, void *comm)
{
    (void)tag; /* messages between two ranks keep their order: MLX sends with tag 0 */
    const fc_graph_api *a;
    int rc = calling("MPI_Send", comm, count, type, &a);
    if (rc)
        return rc;
    rc = a->send(a->ctx, src, (size_t)count * ((const struct mpi_type *)type)->size, dst);
    done();
    return rc ? MPI_ERR_OTHER : MPI_SUCCESS;
}

EXPORT int MPI_Recv(void *dst, int count, void *type, int src, int tag, void *comm, void *status)
{
    const fc_graph_api *a;
    int rc = calling("MPI_Recv", comm, count, type, &a);
    if (rc)
        return rc;
    rc = a->recv(a->ctx, dst, (size_t)count * ((const struct mpi_type *)type)->size, src);
    done();
    if (status) {
        mpi_status *s = status;
        s->source = src;
        s->tag = tag < 0 ? 0 : tag;
        s->error = MPI_SUCCESS;
    }
    return rc ? MPI_ERR_OTHER : MPI_SUCCESS;
}
