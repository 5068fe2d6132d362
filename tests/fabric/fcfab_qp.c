/* fcfab: queue pairs: creation, the state machine with the attribute masks the kernel requires
 * at each step (RESET -> INIT -> RTR -> RTS, and to RESET or ERR from anywhere), and queries. */
#include "fcfab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic uint32_t next_qpn = 0x101;

void fc_qp_publish_state(struct fc_qp *qp)
{
    if (qp->self.in)
        atomic_store_explicit(&qp->self.in->state, (uint32_t)qp->ibv.state, memory_order_release);
}

static int init_attr_ok(struct ibv_pd *pd, const struct ibv_qp_init_attr *a)
{
    const struct ibv_qp_cap *c = &a->cap;
    if (a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_RC)
        return EOPNOTSUPP;
    if (a->srq)
        return EOPNOTSUPP;
    if (!a->send_cq || !a->recv_cq || a->send_cq->context != pd->context || a->recv_cq->context != pd->context)
        return EINVAL;
    if (c->max_send_wr > FC_MAX_WR || c->max_recv_wr > FC_MAX_WR || c->max_send_sge > FC_MAX_SGE ||
        c->max_recv_sge > FC_MAX_SGE || c->max_inline_data > FC_MAX_INLINE)
        return EINVAL;
    return 0;
}

FC_API struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    int e = pd && a ? init_attr_ok(pd, a) : EINVAL;
    struct fc_qp *qp = e ? NULL : calloc(1, sizeof *qp);
    if (!e && qp)
        qp->rq = calloc(a->cap.max_recv_wr ? a->cap.max_recv_wr : 1, sizeof *qp->rq);
    if (e || !qp || !qp->rq) {
        if (qp)
            free(qp);
        errno = e ? e : ENOMEM;
        return NULL;
    }
    struct fc_ctx *ctx = fc_ctx_of(pd->context);
    qp->init = *a;
    qp->ibv = (struct ibv_qp){.context = pd->context, .qp_context = a->qp_context, .pd = pd,
                              .send_cq = a->send_cq, .recv_cq = a->recv_cq, .qp_type = a->qp_type,
                              .state = IBV_QPS_RESET};
    qp->ibv.qp_num = qp->ibv.handle = atomic_fetch_add(&next_qpn, 1) & 0xffffff;
    if (fc_inbox_create(qp, ctx->dev) != 0) {
        e = errno;
        free(qp->rq);
        free(qp);
        errno = e;
        return NULL;
    }
    pthread_mutex_lock(&ctx->lock);
    qp->next = ctx->qps;
    ctx->qps = qp;
    ((struct fc_pd *)(void *)pd)->users++;
    ((struct fc_cq *)(void *)a->send_cq)->users++;
    ((struct fc_cq *)(void *)a->recv_cq)->users++;
    pthread_mutex_unlock(&ctx->lock);
    fc_count(FC_N_QP, 1);
    return &qp->ibv;
}

FC_API int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    struct fc_qp *qp = (struct fc_qp *)(void *)ibqp;
    struct fc_ctx *ctx = fc_ctx_of(ibqp->context);
    int found = 0;
    pthread_mutex_lock(&ctx->lock);
    for (struct fc_qp **p = &ctx->qps; *p; p = &(*p)->next)
        if (*p == qp) {
            *p = qp->next;
            found = 1;
            break;
        }
    if (found) {
        ((struct fc_pd *)(void *)ibqp->pd)->users--;
        ((struct fc_cq *)(void *)ibqp->send_cq)->users--;
        ((struct fc_cq *)(void *)ibqp->recv_cq)->users--;
        fc_cq_forget_qp((struct fc_cq *)(void *)ibqp->send_cq, qp);
        fc_cq_forget_qp((struct fc_cq *)(void *)ibqp->recv_cq, qp);
    }
    pthread_mutex_unlock(&ctx->lock);
    if (!found)
        return EINVAL;
    fc_inbox_retire(qp);
    fc_map_close(&qp->peer);
    free(qp->rq);
    free(qp);
    fc_count(FC_N_QP, -1);
    return 0;
}

/* The kernel's table (ib_modify_qp_is_ok) for UC and RC: the attributes a transition requires
 * and those it allows; 0 when the transition exists. */
static int transition(int rc, enum ibv_qp_state cur, enum ibv_qp_state next, int *req, int *opt)
{
    *req = *opt = 0;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        return 0;
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        *req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
        *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        *req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        *req |= rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0;
        *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        *req = IBV_QP_SQ_PSN;
        *req |= rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0;
        *opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
        *opt |= rc ? IBV_QP_MIN_RNR_TIMER : 0;
    } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
        *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
        *opt |= rc ? IBV_QP_MIN_RNR_TIMER : 0;
    } else {
        return -1;
    }
    return 0;
}

#define FC_QP_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
                      IBV_ACCESS_REMOTE_ATOMIC)

static int av_ok(const struct ibv_ah_attr *ah)
{
    int dev;
    uint32_t pid;
    /* The link layer is Ethernet (RoCE): an address without a GRH cannot be routed. */
    return ah->is_global && ah->grh.sgid_index < FC_GID_LEN && ah->port_num == 1 &&
           fc_gid_lookup(&ah->grh.dgid, &dev, &pid) == 0;
}

/* Each attribute the mask names has a value this device takes. */
static int values_ok(struct fc_qp *qp, const struct ibv_qp_attr *a, int mask)
{
    int bad = ((mask & IBV_QP_PORT) && a->port_num != 1) ||
              ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) ||
              ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~(unsigned)FC_QP_ACCESS)) ||
              ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > FC_ACTIVE_MTU)) ||
              ((mask & IBV_QP_AV) && !av_ok(&a->ah_attr)) ||
              ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff) ||
              ((mask & IBV_QP_RQ_PSN) && a->rq_psn > 0xffffff) ||
              ((mask & IBV_QP_SQ_PSN) && a->sq_psn > 0xffffff) ||
              ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > FC_MAX_RD_ATOM) ||
              ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > FC_MAX_RD_ATOM) ||
              ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) ||
              ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) ||
              ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) ||
              ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) ||
              ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != qp->ibv.state);
    return !bad;
}

/* Keep what the mask names, for query_qp. */
static void keep_attrs(struct ibv_qp_attr *k, const struct ibv_qp_attr *a, int mask)
{
    if (mask & IBV_QP_ACCESS_FLAGS) k->qp_access_flags = a->qp_access_flags;
    if (mask & IBV_QP_PKEY_INDEX) k->pkey_index = a->pkey_index;
    if (mask & IBV_QP_PORT) k->port_num = a->port_num;
    if (mask & IBV_QP_AV) k->ah_attr = a->ah_attr;
    if (mask & IBV_QP_PATH_MTU) k->path_mtu = a->path_mtu;
    if (mask & IBV_QP_TIMEOUT) k->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT) k->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) k->rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_RQ_PSN) k->rq_psn = a->rq_psn;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) k->max_rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) k->min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_SQ_PSN) k->sq_psn = a->sq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) k->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & IBV_QP_PATH_MIG_STATE) k->path_mig_state = a->path_mig_state;
    if (mask & IBV_QP_DEST_QPN) k->dest_qp_num = a->dest_qp_num;
    if (mask & IBV_QP_ALT_PATH) {
        k->alt_ah_attr = a->alt_ah_attr;
        k->alt_pkey_index = a->alt_pkey_index;
        k->alt_port_num = a->alt_port_num;
        k->alt_timeout = a->alt_timeout;
    }
}

/* RESET empties the queues as the kernel does: a fresh inbox, and senders find the new one. */
static int reset(struct fc_qp *qp)
{
    struct fc_ctx *ctx = fc_ctx_of(qp->ibv.context);
    fc_inbox_retire(qp);
    fc_map_close(&qp->peer);
    qp->has_peer = 0;
    qp->rq_head = qp->rq_tail = 0;
    qp->sq_done = qp->sq_posted;
    memset(&qp->attr, 0, sizeof qp->attr);
    return fc_inbox_create(qp, ctx->dev) == 0 ? 0 : errno;
}

/* At RTR the peer is named: its inbox is the file of (dgid, dest_qp_num), mapped now if it is
 * there and at the first send otherwise (a peer that is gone is no error on UC). */
static void name_peer(struct fc_qp *qp)
{
    int dev = 0;
    uint32_t pid = 0;
    fc_gid_lookup(&qp->attr.ah_attr.grh.dgid, &dev, &pid);
    fc_map_close(&qp->peer);
    fc_qp_path(qp->peer_path, dev, pid, qp->attr.dest_qp_num);
    qp->has_peer = 1;
    fc_map_open(qp->peer_path, &qp->peer);
}

static int modify(struct fc_qp *qp, struct ibv_qp_attr *a, int mask)
{
    enum ibv_qp_state cur = qp->ibv.state;
    enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    int req, opt;
    if (transition(qp->ibv.qp_type == IBV_QPT_RC, cur, next, &req, &opt) != 0 || (mask & req) != req ||
        (mask & ~(req | opt | IBV_QP_STATE)) || !values_ok(qp, a, mask))
        return EINVAL;
    int e = 0;
    if (next == IBV_QPS_RESET)
        e = reset(qp);
    keep_attrs(&qp->attr, a, mask);
    qp->ibv.state = e ? IBV_QPS_ERR : next;
    if (next == IBV_QPS_RTR)
        name_peer(qp);
    fc_qp_publish_state(qp);
    return e;
}

FC_API int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
    if (!ibqp || !attr)
        return EINVAL;
    struct fc_ctx *ctx = fc_ctx_of(ibqp->context);
    pthread_mutex_lock(&ctx->lock);
    int e = modify((struct fc_qp *)(void *)ibqp, attr, attr_mask);
    pthread_mutex_unlock(&ctx->lock);
    return e;
}

FC_API int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
                        struct ibv_qp_init_attr *init_attr)
{
    struct fc_qp *qp = (struct fc_qp *)(void *)ibqp;
    struct fc_ctx *ctx = fc_ctx_of(ibqp->context);
    (void)attr_mask;  /* everything is filled in, as providers may */
    if (!attr || !init_attr)
        return EINVAL;
    pthread_mutex_lock(&ctx->lock);
    *attr = qp->attr;
    attr->qp_state = attr->cur_qp_state = qp->ibv.state;
    attr->cap = qp->init.cap;
    *init_attr = qp->init;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}
