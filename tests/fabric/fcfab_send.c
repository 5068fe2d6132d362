/* fcfab: the send side. A send is copied into the peer's inbox at post time, into the slot of the
 * next receive the peer has posted; with none posted it is dropped, as UC drops it. */
#include "fcfab.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define FC_SEND_FLAGS (IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE | IBV_SEND_FENCE)

uint64_t fc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* one clock for every process of the machine */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct fc_mr *fc_mr_find(struct fc_ctx *ctx, struct ibv_pd *pd, uint32_t lkey)
{
    for (struct fc_mr *mr = ctx->mrs; mr; mr = mr->next)
        if (mr->ibv.lkey == lkey && mr->ibv.pd == pd)
            return mr;
    return NULL;
}

/* An MR of this PD holds the whole sge (and may be written, for a receive). */
int fc_sge_ok(struct fc_ctx *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int need_write)
{
    const struct fc_mr *mr = fc_mr_find(ctx, pd, sge->lkey);
    if (!mr)
        return 0;
    uint64_t base = (uintptr_t)mr->ibv.addr, len = mr->ibv.length;
    if (need_write && !(mr->access & IBV_ACCESS_LOCAL_WRITE))
        return 0;
    return sge->addr >= base && sge->length <= len && sge->addr - base <= len - sge->length;
}

/* The peer's inbox, mapped again if its owner left the one we had (a reset or a destroy). */
static struct fc_map *peer_map(struct fc_qp *qp)
{
    if (!qp->has_peer)
        return NULL;
    if (qp->peer.in) {
        if (atomic_load_explicit(&qp->peer.in->state, memory_order_acquire) != FC_RETIRED)
            return &qp->peer;
        fc_map_close(&qp->peer);
    }
    return fc_map_open(qp->peer_path, &qp->peer) == 0 ? &qp->peer : NULL;
}

/* Take the peer's next posted receive; 0 when it has none (or its counters make no sense). */
static int claim(const struct fc_map *p, uint64_t *k)
{
    uint64_t c = atomic_load_explicit(&p->in->claimed, memory_order_relaxed);
    for (;;) {
        uint64_t posted = atomic_load_explicit(&p->in->posted, memory_order_acquire);
        if (posted - c == 0 || posted - c > p->slots)
            return 0;
        if (atomic_compare_exchange_weak_explicit(&p->in->claimed, &c, c + 1, memory_order_acq_rel,
                                                  memory_order_relaxed))
            break;
    }
    *k = c;
    return 1;
}

static void deliver(struct fc_qp *qp, const struct ibv_send_wr *wr, uint64_t total, uint64_t not_before)
{
    struct fc_map *p = peer_map(qp);
    if (!p)
        return;  /* no such peer (gone, or not made yet): the message vanishes */
    uint32_t st = atomic_load_explicit(&p->in->state, memory_order_acquire);
    uint64_t k;
    if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) || !claim(p, &k))
        return;
    struct fc_slot *slot = fc_slot_at(p, k);
    char *data = (char *)slot + FC_SLOT_HDR;
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge; i++) {
        if (wr->sg_list[i].length)
            memcpy(data + off, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        off += wr->sg_list[i].length;
    }
    slot->not_before = not_before;
    slot->len = (uint32_t)total;
    slot->flags = wr->opcode == IBV_WR_SEND_WITH_IMM ? FC_HAS_IMM : 0;
    slot->imm = wr->opcode == IBV_WR_SEND_WITH_IMM ? wr->imm_data : 0;
    slot->src_qpn = qp->ibv.qp_num;
    atomic_store_explicit(&slot->seq, k + 1, memory_order_release);
}

/* Faults (FCFAB_FAULT) apply to UC only: dropped, twice, or late (what follows waits behind it). */
static void transmit(struct fc_qp *qp, const struct ibv_send_wr *wr, uint64_t total)
{
    int drop = 0, copies = 1;
    uint32_t delay_us = 0;
    if (qp->ibv.qp_type == IBV_QPT_UC)
        fc_faults_for_next_send(&drop, &copies, &delay_us);
    if (drop)
        return;
    uint64_t not_before = delay_us ? fc_now_ns() + (uint64_t)delay_us * 1000u : 0;
    for (int i = 0; i < copies; i++)
        deliver(qp, wr, total, not_before);
}

static void to_error(struct fc_qp *qp)
{
    qp->ibv.state = IBV_QPS_ERR;
    fc_qp_publish_state(qp);
}

/* Checks that fail the post itself, as a provider's post_send does; 0 when it may go. */
static int post_check(const struct fc_qp *qp, const struct ibv_send_wr *wr, uint64_t *total)
{
    if (qp->ibv.state != IBV_QPS_RTS && qp->ibv.state != IBV_QPS_ERR)
        return EINVAL;
    if ((wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) ||
        (wr->send_flags & ~(unsigned)FC_SEND_FLAGS) || wr->num_sge < 0 ||
        (uint32_t)wr->num_sge > qp->init.cap.max_send_sge || (wr->num_sge > 0 && !wr->sg_list))
        return EINVAL;
    if (qp->sq_posted - qp->sq_done >= qp->init.cap.max_send_wr)
        return ENOMEM;
    *total = 0;
    for (int i = 0; i < wr->num_sge; i++)
        *total += wr->sg_list[i].length;
    if ((wr->send_flags & IBV_SEND_INLINE) && *total > qp->init.cap.max_inline_data)
        return EINVAL;
    return 0;
}

static int send_one(struct fc_ctx *ctx, struct fc_qp *qp, const struct ibv_send_wr *wr)
{
    uint64_t total;
    int e = post_check(qp, wr, &total);
    if (e)
        return e;
    enum ibv_wc_status status = IBV_WC_SUCCESS;
    int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
    for (int i = 0; i < wr->num_sge && !inl && status == IBV_WC_SUCCESS; i++)
        if (!fc_sge_ok(ctx, qp->ibv.pd, &wr->sg_list[i], 0))
            status = IBV_WC_LOC_PROT_ERR;
    if (qp->ibv.state == IBV_QPS_ERR)
        status = IBV_WC_WR_FLUSH_ERR;
    else if (status == IBV_WC_SUCCESS && total > FC_MAX_MSG)
        status = IBV_WC_LOC_LEN_ERR;
    if (status == IBV_WC_SUCCESS)
        transmit(qp, wr, total);
    else
        to_error(qp);  /* an error completion takes the QP to ERR, as on hardware */
    struct fc_cqe c = {.qp = qp, .sq_index = qp->sq_posted++, .is_send = 1};
    if (status == IBV_WC_SUCCESS && !(wr->send_flags & IBV_SEND_SIGNALED) && !qp->init.sq_sig_all)
        return 0;  /* unsignaled: its slot frees when a later signaled completion is polled */
    c.wc = (struct ibv_wc){.wr_id = wr->wr_id, .status = status, .opcode = IBV_WC_SEND,
                           .byte_len = (uint32_t)(total > UINT32_MAX ? UINT32_MAX : total),
                           .qp_num = qp->ibv.qp_num};
    if (fc_cq_push((struct fc_cq *)(void *)qp->ibv.send_cq, &c) != 0)
        to_error(qp);
    return 0;
}

int fc_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fc_ctx *ctx = fc_ctx_of(ibqp->context);
    struct fc_qp *qp = (struct fc_qp *)(void *)ibqp;
    int e = 0;
    pthread_mutex_lock(&ctx->lock);
    for (; wr; wr = wr->next)
        if ((e = send_one(ctx, qp, wr)) != 0)
            break;
    pthread_mutex_unlock(&ctx->lock);
    if (e && bad)
        *bad = wr;
    return e;
}
