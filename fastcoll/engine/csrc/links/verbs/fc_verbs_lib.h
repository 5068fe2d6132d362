/* The verbs library, loaded when a job first asks for an RDMA link and never at import: the
 * library FASTCOLL_VERBS_LIB names (passed down as the link's `library`), else the platform's
 * (librdma.dylib on macOS, Apple's RDMA over Thunderbolt; libibverbs.so.1 on Linux). The engine
 * is never linked against it, so a machine without RDMA imports and runs everything else.
 *
 * The functions verbs.h declares are called through this table, under names of its own, since
 * verbs.h makes some of them macros (ibv_reg_mr, ibv_query_port). The data path (post a send or a
 * receive, poll a completion queue) is verbs.h's inline functions, which call the provider's
 * operations in the device context, as every verbs program does.
 */
#ifndef FC_VERBS_LIB_H
#define FC_VERBS_LIB_H

#include <stddef.h>

#include <infiniband/verbs.h>

typedef struct fc_verbs_lib {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    const char *path; /* the library that was loaded */
} fc_verbs_lib;

/* The library at `path` (NULL or "": the platform's), loaded once for the process (later calls
 * must name the same one), or NULL with a one-line reason in why[0..why_len). Thread-safe. */
const fc_verbs_lib *fc_verbs_load(const char *path, char *why, size_t why_len);

/* The platform's library name. */
const char *fc_verbs_default_library(void);

#endif
