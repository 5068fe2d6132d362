/* fcfab: a verbs provider for tests. Processes of one machine talk through queue pairs whose
 * inboxes are files in shared memory (FCFAB_DIR); README.md says what it models. */
#ifndef FCFAB_H
#define FCFAB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Everything verbs.h declares is exported; everything of ours is hidden (-fvisibility=hidden). */
#pragma GCC visibility push(default)
#include <infiniband/verbs.h>
#pragma GCC visibility pop

/* The header's macros turn these names into inline wrappers; we define the functions themselves. */
#undef ibv_reg_mr
#undef ibv_query_port
#undef ibv_get_device_list

/* Limits, as the device and port report them. */
#define FC_MAX_DEV 16           /* FCFAB_DEVICES may ask for 1..FC_MAX_DEV */
#define FC_DEFAULT_DEV 4
#define FC_MAX_MSG (1u << 20)   /* max_msg_sz: 1 MiB */
#define FC_MAX_WR 1024          /* max_qp_wr: max_send_wr and max_recv_wr */
#define FC_MAX_SGE 4            /* max_sge: send and receive */
#define FC_MAX_INLINE 256       /* max_inline_data */
#define FC_MAX_CQE 65536
#define FC_MAX_RD_ATOM 16
#define FC_GID_LEN 2            /* index 0 link-local, index 1 IPv4-mapped */
#define FC_ACTIVE_MTU IBV_MTU_1024
#define FC_PATH_MAX 512
#define FC_DIR_MAX 400          /* FCFAB_DIR's length, below FC_PATH_MAX with a file name */
#define FC_MAX_DELAY_US 60000000u

/* The shared file of one queue pair: its inbox. One page of header, then one slot per receive
 * the owner may have outstanding; the k-th message to claim a receive lands in slot k % slots. */
#define FC_MAGIC 0x3162616663666366ULL  /* "fcfcfab1" */
#define FC_VERSION 1u
#define FC_HDR_BYTES 4096u
#define FC_SLOT_HDR 64u
#define FC_STRIDE ((uint64_t)FC_SLOT_HDR + FC_MAX_MSG)
#define FC_RETIRED 0xdeadu      /* inbox state: the owner left this file; look the name up again */
#define FC_HAS_IMM 1u

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the inbox needs lock-free 64-bit atomics");

struct fc_inbox {
    uint64_t magic;
    uint32_t version, slots;
    uint64_t stride, bytes;
    uint32_t pid, dev, qpn, qp_type;
    _Alignas(64) _Atomic uint32_t state;   /* the owner's QP state: delivered only in RTR, RTS */
    _Alignas(64) _Atomic uint64_t posted;  /* receives the owner has posted, ever (owner writes) */
    _Alignas(64) _Atomic uint64_t claimed; /* of those, how many a message has taken (senders) */
};

struct fc_slot {
    _Atomic uint64_t seq;  /* k + 1 once message k is whole in this slot (release) */
    uint64_t not_before;   /* CLOCK_MONOTONIC ns before which the receiver does not see it */
    uint32_t len, imm, flags, src_qpn;
};

_Static_assert(sizeof(struct fc_inbox) <= FC_HDR_BYTES, "inbox header fits its page");
_Static_assert(sizeof(struct fc_slot) <= FC_SLOT_HDR, "slot header fits");

/* A mapped inbox, with what was checked about it when it was opened (never re-read). */
struct fc_map {
    struct fc_inbox *in;
    size_t bytes;
    uint32_t slots;
};

struct fc_mr {
    struct ibv_mr ibv;
    struct fc_mr *next;
    int access;
};

struct fc_pd {
    struct ibv_pd ibv;
    int users;  /* MRs and QPs on it: dealloc_pd is EBUSY while any remain */
};

struct fc_cqe {
    struct ibv_wc wc;
    struct fc_qp *qp;  /* the send's QP (NULL once destroyed), to retire its send queue */
    uint64_t sq_index; /* the send's position in that send queue */
    int is_send;
};

struct fc_cq {
    struct ibv_cq ibv;
    struct fc_cqe *q;
    uint32_t cap, head, count;
    int overrun, users;
};

struct fc_rwqe {
    uint64_t wr_id;
    uint64_t len;  /* the sum of its sges */
    int nsge, bad; /* bad: an sge no MR covers (IBV_WC_LOC_PROT_ERR when a message lands) */
    struct ibv_sge sge[FC_MAX_SGE];
};

struct fc_qp {
    struct ibv_qp ibv;
    struct fc_qp *next;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr attr;  /* the attributes set so far, for query_qp */
    struct fc_map self, peer; /* own inbox; the peer's, once RTR named it (lazily opened) */
    char path[FC_PATH_MAX], peer_path[FC_PATH_MAX];
    int has_peer;
    uint64_t sq_posted, sq_done, rq_head, rq_tail;
    struct fc_rwqe *rq;
};

struct fc_ctx {
    struct ibv_context ibv;
    struct fc_ctx *next;
    pthread_mutex_t lock;  /* one lock for every object of this context */
    int dev;
    struct fc_mr *mrs;
    struct fc_qp *qps;
    int objects;           /* PDs, CQs (QPs and MRs hang off PDs): close is EBUSY while any remain */
};

/* Process-wide settings from the environment, read once. */
struct fc_config {
    int devices;
    char dir[FC_DIR_MAX];
    const char *error;  /* set when the environment is unusable: open_device fails saying so */
    char error_buf[256];
};

enum fc_count { FC_N_CTX, FC_N_PD, FC_N_MR, FC_N_CQ, FC_N_QP, FC_N_KINDS };

#define FC_API __attribute__((visibility("default")))

/* fcfab_dev.c */
const struct fc_config *fc_config(void);
void fc_count(enum fc_count kind, int delta);
struct fc_ctx *fc_ctx_of(struct ibv_context *c);
void fc_gid(int dev, int index, union ibv_gid *gid);
int fc_gid_lookup(const union ibv_gid *gid, int *dev, uint32_t *pid);
void fc_config_error(struct fc_config *cfg, const char *fmt, const char *what);

/* fcfab_fault.c */
int fc_faults_parse(const char *spec, struct fc_config *cfg);
void fc_faults_for_next_send(int *drop, int *copies, uint32_t *delay_us);

/* fcfab_shm.c */
int fc_dir_ready(const char *dir);
void fc_dir_sweep(const char *dir);
void fc_qp_path(char *out, int dev, uint32_t pid, uint32_t qpn);
int fc_inbox_create(struct fc_qp *qp, int dev);
void fc_inbox_retire(struct fc_qp *qp);
int fc_map_open(const char *path, struct fc_map *m);
void fc_map_close(struct fc_map *m);
struct fc_slot *fc_slot_at(const struct fc_map *m, uint64_t k);

/* fcfab_send.c */
int fc_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
struct fc_mr *fc_mr_find(struct fc_ctx *ctx, struct ibv_pd *pd, uint32_t lkey);
int fc_sge_ok(struct fc_ctx *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int need_write);
uint64_t fc_now_ns(void);

/* fcfab_recv.c */
int fc_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int fc_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int fc_req_notify_cq(struct ibv_cq *cq, int solicited_only);
void fc_cq_forget_qp(struct fc_cq *cq, struct fc_qp *qp);
int fc_cq_push(struct fc_cq *cq, const struct fc_cqe *e);

/* fcfab_qp.c */
void fc_qp_publish_state(struct fc_qp *qp);

#endif
