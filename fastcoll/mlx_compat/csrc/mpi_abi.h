/* What fastcoll's graph library exports (mpi_abi.c): the calls of Open MPI's ABI that MLX's MPI
 * backend loads, with Open MPI's signatures (a handle is the address of an object, so void *
 * here), and the two calls fastcoll.mlx_compat.graph makes. */
#ifndef FC_MPI_ABI_H
#define FC_MPI_ABI_H

#include <stdint.h>

#include "binding/fc_graph.h"

/* fastcoll.mlx_compat.graph's split: parent handle, color, key (>= 0), the new handle; fills
 * `ranks` (the table's rank of each member, at most `most`), `rank` and `name` (fastcoll's
 * prefix of the sub-group); returns the new group's size, or -1 (Python keeps the error, and
 * raises it from Group.split). */
typedef int (*split_fn)(void *parent, int color, int key, void *child, int32_t *ranks, int most, int *rank,
                        char *name, int name_max);

int fastcoll_mpi_attach(const fc_graph_api *table, const char *names, split_fn split);
void fastcoll_mpi_detach(void);

int MPI_Get_library_version(char *version, int *len);
int MPI_Init(int *argc, char ***argv);
int MPI_Finalize(void);
int MPI_Comm_rank(void *comm, int *rank);
int MPI_Comm_size(void *comm, int *size);
int MPI_Comm_split(void *comm, int color, int key, void **out);
int MPI_Comm_free(void **comm);
int MPI_Type_contiguous(int count, void *old, void **out);
int MPI_Type_commit(void **type);
int MPI_Op_create(void (*fn)(void *, void *, int *, void **), int commute, void **out);
int MPI_Allreduce(const void *src, void *dst, int count, void *type, void *op, void *comm);
int MPI_Allgather(const void *src, int count, void *type, void *dst, int rcount, void *rtype, void *comm);
int MPI_Send(const void *src, int count, void *type, int dst, int tag, void *comm);
int MPI_Recv(void *dst, int count, void *type, int src, int tag, void *comm, void *status);

#endif
