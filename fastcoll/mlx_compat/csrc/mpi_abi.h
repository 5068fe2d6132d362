/* What fastcoll's graph library exports (mpi_abi.c): the calls of Open MPI's ABI that MLX's MPI
 * backend loads, with Open MPI's signatures (a handle is the address of an object, so void *
 * here), and the two calls fastcoll.mlx_compat.graph makes. */
#ifndef FC_MPI_ABI_H
#define FC_MPI_ABI_H

#include "fc_graph.h"

int fastcoll_mpi_attach(const fc_graph_api *table);
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
