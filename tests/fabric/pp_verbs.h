/* The test programs' side of the fabric: the verbs calls loaded with dlopen/dlsym by name, as
 * fastcoll's link and MLX's JACCL load them, and queue pairs brought up with JACCL's steps. */
#ifndef PP_VERBS_H
#define PP_VERBS_H

#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#define PP_BUF (4u << 20) /* the registered buffer: receives in the first half, sends in the second */
#define PP_HALF (PP_BUF / 2)

struct verbs {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
};

static const char *const pp_names[] = {
    "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
    "ibv_close_device", "ibv_query_device", "ibv_query_port", "ibv_query_gid", "ibv_alloc_pd",
    "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq",
    "ibv_create_qp", "ibv_destroy_qp", "ibv_modify_qp", "ibv_query_qp"};

_Static_assert(sizeof(struct verbs) == sizeof pp_names / sizeof pp_names[0] * sizeof(void (*)(void)),
               "one name for each entry");

#define PP_CHECK(cond, ...)                                                    \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "pingpong %d: ", __LINE__);                        \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            exit(2);                                                           \
        }                                                                      \
    } while (0)

/* The library FASTCOLL_VERBS_LIB names, each entry point found by name. */
static inline void pp_load(struct verbs *v)
{
    const char *path = getenv("FASTCOLL_VERBS_LIB");
    PP_CHECK(path && *path, "FASTCOLL_VERBS_LIB is not set");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    PP_CHECK(h, "dlopen %s: %s", path, dlerror());
    for (size_t i = 0; i < sizeof pp_names / sizeof pp_names[0]; i++) {
        void *f = dlsym(h, pp_names[i]);
        PP_CHECK(f, "dlsym %s: %s", pp_names[i], dlerror());
        memcpy((char *)v + i * sizeof f, &f, sizeof f);  /* POSIX: a function's address as void * */
    }
}

static inline uint64_t pp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* What a peer needs of a queue pair: JACCL's Destination. */
struct pp_dest {
    uint32_t qpn, psn;
    union ibv_gid gid;
};

struct pp_end {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    struct ibv_qp *qp;
    char *buf;
    struct pp_dest me;
};

static inline struct ibv_context *pp_open(struct verbs *v, const char *name)
{
    int n = 0;
    struct ibv_device **list = v->get_device_list(&n);
    struct ibv_context *ctx = NULL;
    PP_CHECK(list, "no device list");
    for (int i = 0; i < n; i++)
        if (strcmp(v->get_device_name(list[i]), name) == 0)
            ctx = v->open_device(list[i]);
    v->free_device_list(list);
    PP_CHECK(ctx, "cannot open %s", name);
    return ctx;
}

/* The device's IPv4-mapped GID, found as JACCL finds it: ::ffff:a.b.c.d. */
static inline int pp_ipv4_gid(struct verbs *v, struct ibv_context *ctx, union ibv_gid *gid)
{
    struct ibv_port_attr port;
    PP_CHECK(v->query_port(ctx, 1, &port) == 0, "query_port");
    for (int i = 0; i < port.gid_tbl_len; i++) {
        union ibv_gid g;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (v->query_gid(ctx, 1, i, &g) == 0 && memcmp(g.raw, v4, sizeof v4) == 0) {
            *gid = g;
            return i;
        }
    }
    return -1;
}

/* A device, PD, CQ, registered buffer and a queue pair of `type`, JACCL's way. */
static inline void pp_setup(struct verbs *v, struct pp_end *e, const char *dev, enum ibv_qp_type type,
                     uint32_t max_wr, int cqe)
{
    memset(e, 0, sizeof *e);
    e->ctx = pp_open(v, dev);
    PP_CHECK((e->pd = v->alloc_pd(e->ctx)) != NULL, "alloc_pd");
    PP_CHECK((e->cq = v->create_cq(e->ctx, cqe, NULL, NULL, 0)) != NULL, "create_cq");
    PP_CHECK(posix_memalign((void **)&e->buf, 4096, PP_BUF) == 0, "posix_memalign");
    memset(e->buf, 0, PP_BUF);
    e->mr = v->reg_mr(e->pd, e->buf, PP_BUF,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    PP_CHECK(e->mr, "reg_mr");
    struct ibv_qp_init_attr ia = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
                                  .cap = {.max_send_wr = max_wr, .max_recv_wr = max_wr,
                                          .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64}};
    PP_CHECK((e->qp = v->create_qp(e->pd, &ia)) != NULL, "create_qp");
    PP_CHECK(pp_ipv4_gid(v, e->ctx, &e->me.gid) == 1, "no IPv4-mapped GID at index 1");
    e->me.qpn = e->qp->qp_num;
    e->me.psn = 7;
}

/* RESET -> INIT -> RTR -> RTS with the masks and values of JACCL's Connection (RC adds the
 * attributes reliable connections require). */
static inline void pp_connect(struct verbs *v, struct pp_end *e, const struct pp_dest *peer)
{
    int rc = e->qp->qp_type == IBV_QPT_RC;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_WRITE};
    PP_CHECK(v->modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
             "to INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.rq_psn = peer->psn;
    a.dest_qp_num = peer->qpn;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    mask |= rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0;
    PP_CHECK(v->modify_qp(e->qp, &a, mask) == 0, "to RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = e->me.psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    mask |= rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0;
    PP_CHECK(v->modify_qp(e->qp, &a, mask) == 0, "to RTS");
}

static inline void pp_teardown(struct verbs *v, struct pp_end *e)
{
    PP_CHECK(v->destroy_qp(e->qp) == 0, "destroy_qp");
    PP_CHECK(v->dereg_mr(e->mr) == 0, "dereg_mr");
    PP_CHECK(v->destroy_cq(e->cq) == 0, "destroy_cq");
    PP_CHECK(v->dealloc_pd(e->pd) == 0, "dealloc_pd");
    PP_CHECK(v->close_device(e->ctx) == 0, "close_device");
    free(e->buf);
}

/* Post one receive of `len` bytes at `off` in the buffer, split over two sges. */
static inline int pp_post_recv(struct pp_end *e, uint64_t wr_id, uint32_t off, uint32_t len)
{
    struct ibv_sge sg[2] = {{(uintptr_t)(e->buf + off), len / 2, e->mr->lkey},
                            {(uintptr_t)(e->buf + off + len / 2), len - len / 2, e->mr->lkey}};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = 2}, *bad = NULL;
    return ibv_post_recv(e->qp, &wr, &bad);
}

/* Send `len` bytes from `off` (two sges; inline when short), signaled, with imm when asked. */
static inline int pp_post_send(struct pp_end *e, uint64_t wr_id, uint32_t off, uint32_t len, int imm, uint32_t immv)
{
    struct ibv_sge sg[2] = {{(uintptr_t)(e->buf + off), len / 2, e->mr->lkey},
                            {(uintptr_t)(e->buf + off + len / 2), len - len / 2, e->mr->lkey}};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = sg, .num_sge = 2,
                             .opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED | (len <= 64 ? IBV_SEND_INLINE : 0)};
    wr.imm_data = htonl(immv);
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(e->qp, &wr, &bad);
}

/* One completion, or 0 when none came within `ms`. */
static inline int pp_poll(struct pp_end *e, struct ibv_wc *wc, unsigned ms)
{
    uint64_t end = pp_now_us() + (uint64_t)ms * 1000u;
    do {
        int n = ibv_poll_cq(e->cq, 1, wc);
        PP_CHECK(n >= 0, "poll_cq failed: %d", n);
        if (n == 1)
            return 1;
        sched_yield();  /* two spinning processes share a small machine */
    } while (pp_now_us() < end);
    return 0;
}

#endif
