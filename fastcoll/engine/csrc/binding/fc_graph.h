/* Collectives called from a thread fastcoll does not own, with no Python: MLX's evaluation
 * thread, through the MPI library fastcoll gives MLX (fastcoll/mlx_compat/csrc/mpi_abi.c).
 *
 * The engine hands that library this table (Engine.graph_open, py_graph.c). Each call runs on
 * the calling thread when the engine is idle, else behind the queued calls, and returns 0. A
 * call that fails does not return: it writes what went wrong, naming the peer, to stderr and
 * ends the process with status 1, as MPI's default error handler ends the job, since nothing
 * in MLX's graph could raise the error to Python. This header is the whole interface between
 * the two libraries: plain C, no Python.
 */
#ifndef FC_GRAPH_H
#define FC_GRAPH_H

#include <stddef.h>

#define FC_GRAPH_VERSION 2

/* MPI_User_function's shape: inout[i] = in[i] op inout[i] for i < *len (commutative). */
typedef void (*fc_graph_user_op)(void *in, void *inout, int *len, void **type);

typedef struct fc_graph_api {
    int version; /* FC_GRAPH_VERSION */
    void *ctx;
    int rank, size; /* this rank in the graph's group, and its size */
    /* dst = the sum/min/max (redop: fc_reduce.h's FC_SUM, FC_MIN, FC_MAX) of every rank's
     * src (count elements of dtype, fc_reduce.h's codes), or through `user` when it is set
     * (dtype then only gives the element size). src may be dst. name_dtype, name_op: the
     * dtype and op as the user made the call (fc_reduce.h's codes, -1 where not known), which
     * its signature names, so that a mismatch reads in the user's terms. */
    int (*all_reduce)(void *ctx, const void *src, void *dst, size_t count, int dtype, int redop,
                      fc_graph_user_op user, void *user_type, int name_dtype, int name_op);
    /* dst = every rank's nbytes of src, in rank order; name_dtype as for all_reduce (its
     * elements must be of that size). */
    int (*all_gather)(void *ctx, const void *src, void *dst, size_t nbytes, int name_dtype);
    int (*send)(void *ctx, const void *src, size_t nbytes, int peer);
    int (*recv)(void *ctx, void *dst, size_t nbytes, int peer);
} fc_graph_api;

#endif
