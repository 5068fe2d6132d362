/* What the files of fastcoll's MPI library for MLX share (mpi_abi.c: the ABI's entry points;
 * mpi_call.c: how a call is named, ordered and ended; mpi_sub.c: the communicators that
 * MPI_Comm_split makes). Nothing here is exported: mpi_abi.h is the library's interface. */
#ifndef FC_MPI_LIB_H
#define FC_MPI_LIB_H

#include <stddef.h>
#include <stdint.h>

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

typedef void (*user_fn)(void *, void *, int *, void **);

struct mpi_type {
    int dtype;   /* fc_reduce.h's code; a derived type: the unsigned type of its size */
    size_t size; /* bytes an element */
    int derived;
    int name;    /* the dtype a user knows it as (fc_reduce.h's code), or FC_DTYPE_COUNT */
};
struct mpi_op {
    int redop; /* FC_SUM, FC_MIN, FC_MAX; -1 for a user op */
    user_fn fn;
    int name;  /* FC_SUM, FC_MIN or FC_MAX as the user knows it; -1: unknown */
};

/* A communicator: the job (ompi_mpi_comm_world, the graph table's group) or one that
 * MPI_Comm_split made (a fastcoll sub-group, whose calls mpi_sub.c runs over the table's
 * point-to-point messages). */
struct mpi_comm {
    int world;
    int rank, size;     /* a split's: this rank in it, and its size */
    int32_t *ranks;     /* a split's: the table's rank of each of its ranks */
    uint64_t id;        /* a split's: what its messages carry (a hash of its name) */
    uint64_t seq;       /* a split's: its collectives so far */
    uint64_t *sent, *received; /* a split's: point-to-point messages to and from each rank */
    uint8_t *scratch;   /* a split's: a reduction's incoming block */
    size_t scratch_bytes;
    char name[96];      /* a split's: fastcoll's prefix of the sub-group ("s1c0/") */
};

extern struct mpi_comm ompi_mpi_comm_world;

/* ----- a call as the user knows it (mpi_call.c) ----- */

enum { CALL_ALL_REDUCE, CALL_ALL_GATHER, CALL_SEND, CALL_RECV, CALL_KINDS };

struct mpi_call {
    int kind;
    int dtype; /* the user's dtype: fc_reduce.h's code, or FC_DTYPE_COUNT for one unknown */
    int op;    /* all_reduce's FC_SUM, FC_MIN or FC_MAX; -1 unknown */
    uint64_t count;
    int me;    /* the caller's rank in comm */
    int peer;  /* send/recv: comm's rank of the other side */
    const struct mpi_comm *comm;
};

/* "all_reduce(sum,float32,(64,))", as fastcoll's eager calls name their calls. */
void mpi_describe(const struct mpi_call *c, char *out, size_t n);
/* Who the table's rank r is ("rank 1 (host h2)"), from the names fastcoll gave at attach. */
const char *mpi_rank_name(int table_rank);
int mpi_names_set(const char *joined, int size);
/* This rank's table rank, for the messages (set at attach). */
extern int mpi_table_rank;
/* Say what `c` met (`why` starts with the error's class) and end the process with status 1,
 * as the engine ends it for a failure in MLX's graph (fc_graph.h says why). */
_Noreturn void mpi_fatal(const struct mpi_call *c, const char *why);
/* Around every call: ends the process when another thread (another MLX stream) is inside a
 * call of a communicator that shares a rank with c's, since their order would be chance. */
int mpi_enter(const struct mpi_call *c);
void mpi_leave(int slot);

/* ----- communicators that MPI_Comm_split made (mpi_sub.c) ----- */

extern split_fn mpi_split_callback;

int mpi_comm_known(const void *comm); /* the world or a live split */
int mpi_sub_split(struct mpi_comm *parent, int color, int key, struct mpi_comm **out);
int mpi_sub_free(struct mpi_comm *comm);
int mpi_sub_all_reduce(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                       void *dst, int dtype, int redop, const struct mpi_op *op, void *type, size_t itemsize);
int mpi_sub_all_gather(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                       void *dst, size_t nbytes);
int mpi_sub_send(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, const void *src,
                 size_t nbytes);
int mpi_sub_recv(const fc_graph_api *a, struct mpi_comm *comm, const struct mpi_call *c, void *dst, size_t nbytes);

#endif
