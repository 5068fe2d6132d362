/* fcfab: the receive side and completion queues. Receives are posted in order and published in
 * the inbox; messages that claimed them are matched, in order, when the CQ is polled. */
#include "fcfab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int fc_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)cq;
    (void)solicited_only;
    return ENOSYS;  /* no completion channels: callers poll */
}

static uint32_t rq_slots(const struct fc_qp *qp)
{
    return qp->init.cap.max_recv_wr ? qp->init.cap.max_recv_wr : 1;
}

static int recv_one(struct fc_ctx *ctx, struct fc_qp *qp, const struct ibv_recv_wr *wr)
{
    if (qp->ibv.state == IBV_QPS_RESET || wr->num_sge < 0 ||
        (uint32_t)wr->num_sge > qp->init.cap.max_recv_sge || (wr->num_sge > 0 && !wr->sg_list))
        return EINVAL;
    if (qp->rq_tail - qp->rq_head >= qp->init.cap.max_recv_wr)
        return ENOMEM;
    struct fc_rwqe *e = &qp->rq[qp->rq_tail % rq_slots(qp)];
    *e = (struct fc_rwqe){.wr_id = wr->wr_id, .nsge = wr->num_sge};
    for (int i = 0; i < wr->num_sge; i++) {
        e->sge[i] = wr->sg_list[i];
        e->len += wr->sg_list[i].length;
        if (!fc_sge_ok(ctx, qp->ibv.pd, &wr->sg_list[i], 1))
            e->bad = 1;  /* reported when a message lands in it, as hardware finds it */
    }
    qp->rq_tail++;
    if (qp->self.in)
        atomic_store_explicit(&qp->self.in->posted, qp->rq_tail, memory_order_release);
    return 0;
}

int fc_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct fc_ctx *ctx = fc_ctx_of(ibqp->context);
    struct fc_qp *qp = (struct fc_qp *)(void *)ibqp;
    int e = 0;
    pthread_mutex_lock(&ctx->lock);
    for (; wr; wr = wr->next)
        if ((e = recv_one(ctx, qp, wr)) != 0)
            break;
    pthread_mutex_unlock(&ctx->lock);
    if (e && bad)
        *bad = wr;
    return e;
}

int fc_cq_push(struct fc_cq *cq, const struct fc_cqe *e)
{
    if (cq->count == cq->cap) {
        cq->overrun = 1;  /* as hardware: the CQ is in error from now on; nothing is overwritten */
        return -1;
    }
    cq->q[(cq->head + cq->count) % cq->cap] = *e;
    cq->count++;
    return 0;
}

void fc_cq_forget_qp(struct fc_cq *cq, struct fc_qp *qp)
{
    for (uint32_t i = 0; i < cq->count; i++)
        if (cq->q[(cq->head + i) % cq->cap].qp == qp)
            cq->q[(cq->head + i) % cq->cap].qp = NULL;
}

/* Copy a landed message into the receive's sges; its length was checked against them. */
static void scatter(const struct fc_rwqe *e, const char *data, uint32_t len)
{
    uint64_t off = 0;
    for (int i = 0; i < e->nsge && off < len; i++) {
        uint64_t n = e->sge[i].length < len - off ? e->sge[i].length : len - off;
        memcpy((void *)(uintptr_t)e->sge[i].addr, data + off, n);
        off += n;
    }
}

/* The completion of the oldest receive, if its message has landed (and is not held back by a
 * delay); 0 when there is none yet. Everything read from the slot is bounded first. */
static int land(struct fc_qp *qp, const struct fc_rwqe *e, struct ibv_wc *wc, uint64_t *now)
{
    struct fc_slot *slot = fc_slot_at(&qp->self, qp->rq_head);
    if (atomic_load_explicit(&slot->seq, memory_order_acquire) != qp->rq_head + 1)
        return 0;
    struct {
        uint64_t not_before;
        uint32_t len, imm, flags, src_qpn;
    } h = {slot->not_before, slot->len, slot->imm, slot->flags, slot->src_qpn}; /* each read once */
    if (h.not_before) {
        if (!*now)
            *now = fc_now_ns();
        if (h.not_before > *now && h.not_before - *now <= (uint64_t)FC_MAX_DELAY_US * 1000u)
            return 0;
    }
    *wc = (struct ibv_wc){.wr_id = e->wr_id, .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RECV,
                          .byte_len = h.len, .qp_num = qp->ibv.qp_num, .src_qp = h.src_qpn & 0xffffff};
    if (h.flags & FC_HAS_IMM) {
        wc->wc_flags = IBV_WC_WITH_IMM;
        wc->imm_data = h.imm;
    }
    if (h.len > FC_MAX_MSG || h.len > e->len)
        wc->status = IBV_WC_LOC_LEN_ERR;
    else if (e->bad)
        wc->status = IBV_WC_LOC_PROT_ERR;
    else
        scatter(e, (const char *)slot + FC_SLOT_HDR, h.len);
    return 1;
}

/* Move this QP's finished receives into its CQ, oldest first, while the CQ has room. */
static void harvest(struct fc_qp *qp, struct fc_cq *cq)
{
    uint64_t now = 0;
    while (cq->count < cq->cap && qp->rq_head != qp->rq_tail) {
        const struct fc_rwqe *e = &qp->rq[qp->rq_head % rq_slots(qp)];
        struct fc_cqe c = {.qp = qp};
        if (qp->ibv.state == IBV_QPS_ERR || !qp->self.in)
            c.wc = (struct ibv_wc){.wr_id = e->wr_id, .status = IBV_WC_WR_FLUSH_ERR,
                                   .opcode = IBV_WC_RECV, .qp_num = qp->ibv.qp_num};
        else if (!land(qp, e, &c.wc, &now))
            break;
        fc_cq_push(cq, &c);
        qp->rq_head++;
        if (c.wc.status != IBV_WC_SUCCESS && qp->ibv.state != IBV_QPS_ERR) {
            qp->ibv.state = IBV_QPS_ERR;
            fc_qp_publish_state(qp);
        }
    }
}

int fc_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct fc_cq *cq = (struct fc_cq *)(void *)ibcq;
    struct fc_ctx *ctx = fc_ctx_of(ibcq->context);
    int got = 0;
    if (n < 0 || (n > 0 && !wc))
        return -EINVAL;
    pthread_mutex_lock(&ctx->lock);
    if (cq->overrun) {
        pthread_mutex_unlock(&ctx->lock);
        errno = EOVERFLOW;
        return -EOVERFLOW;
    }
    for (struct fc_qp *qp = ctx->qps; qp; qp = qp->next)
        if (qp->ibv.recv_cq == ibcq)
            harvest(qp, cq);
    for (; got < n && cq->count; got++) {
        const struct fc_cqe *c = &cq->q[cq->head];
        wc[got] = c->wc;
        if (c->is_send && c->qp && c->sq_index + 1 > c->qp->sq_done)
            c->qp->sq_done = c->sq_index + 1;  /* this and every earlier unsignaled send are done */
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&ctx->lock);
    return got;
}

FC_API struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector)
{
    if (!context || cqe < 1 || cqe > FC_MAX_CQE || comp_vector != 0 || channel) {
        errno = channel ? EOPNOTSUPP : EINVAL;
        return NULL;
    }
    struct fc_cq *cq = calloc(1, sizeof *cq);
    if (cq)
        cq->q = calloc((size_t)cqe, sizeof *cq->q);
    if (!cq || !cq->q) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->ibv.context = context;
    cq->ibv.cq_context = cq_context;
    cq->ibv.cqe = cqe;
    cq->cap = (uint32_t)cqe;
    struct fc_ctx *ctx = fc_ctx_of(context);
    pthread_mutex_lock(&ctx->lock);
    ctx->objects++;
    pthread_mutex_unlock(&ctx->lock);
    fc_count(FC_N_CQ, 1);
    return &cq->ibv;
}

FC_API int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct fc_cq *cq = (struct fc_cq *)(void *)ibcq;
    struct fc_ctx *ctx = fc_ctx_of(ibcq->context);
    pthread_mutex_lock(&ctx->lock);
    int busy = cq->users > 0;
    if (!busy)
        ctx->objects--;
    pthread_mutex_unlock(&ctx->lock);
    if (busy)
        return EBUSY;  /* a QP still uses it */
    free(cq->q);
    free(cq);
    fc_count(FC_N_CQ, -1);
    return 0;
}
