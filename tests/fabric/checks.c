/* The fabric's checks, in one process: devices and port, the queue-pair state machine, queue
 * depths, inline sends, protection and length errors, busy objects and an overrun CQ. Each part
 * prints "ok NAME"; the first failed check exits 2 naming its line. Queue pairs here are
 * connected to themselves (their own GID and number), which the fabric allows. */
#include "pp_verbs.h"

#include <errno.h>

static struct verbs V;
static struct pp_end E; /* device fcfab0: PD, CQ of 64, buffer, and a UC queue pair (unused) */

static struct ibv_qp *qp_new(enum ibv_qp_type type, uint32_t wr, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = type,
                                  .cap = {.max_send_wr = wr, .max_recv_wr = wr, .max_send_sge = 2,
                                          .max_recv_sge = 2, .max_inline_data = 64}};
    struct ibv_qp *qp = V.create_qp(E.pd, &ia);
    PP_CHECK(qp, "create_qp");
    return qp;
}

static int to_init(struct ibv_qp *qp, int mask)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
    return V.modify_qp(qp, &a, mask);
}

#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN)

static struct ibv_qp_attr rtr_attr(struct ibv_qp *peer)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qp_num,
                            .rq_psn = 7, .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.dgid = E.me.gid;
    return a;
}

/* A queue pair connected to itself, JACCL's way. */
static struct ibv_qp *loop_qp(uint32_t wr, struct ibv_cq *cq)
{
    struct ibv_qp *qp = qp_new(IBV_QPT_UC, wr, cq);
    struct pp_dest me = {.qpn = qp->qp_num, .psn = 7, .gid = E.me.gid};
    struct pp_end e = E;
    e.qp = qp;
    pp_connect(&V, &e, &me);
    return qp;
}

static int send_on(struct ibv_qp *qp, uint32_t off, uint32_t len, uint32_t lkey, unsigned flags)
{
    struct ibv_sge sg = {(uintptr_t)(E.buf + off), len, lkey};
    struct ibv_send_wr wr = {.wr_id = off, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = flags}, *bad = NULL;
    return ibv_post_send(qp, &wr, &bad);
}

static int recv_on(struct ibv_qp *qp, uint32_t off, uint32_t len)
{
    struct ibv_sge sg = {(uintptr_t)(E.buf + off), len, E.mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = off, .sg_list = &sg, .num_sge = 1}, *bad = NULL;
    return ibv_post_recv(qp, &wr, &bad);
}

static enum ibv_qp_state state_of(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    PP_CHECK(V.query_qp(qp, &a, IBV_QP_STATE, &ia) == 0, "query_qp");
    return a.qp_state;
}

static void check_devices(void)
{
    const char *env = getenv("FCFAB_DEVICES");
    int n = 0, want = env ? atoi(env) : 4;
    struct ibv_device **list = V.get_device_list(&n);
    PP_CHECK(list && n == want && list[n] == NULL, "%d devices, want %d", n, want);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "fcfab%d", i);
        PP_CHECK(strcmp(V.get_device_name(list[i]), name) == 0, "device %d is %s", i, V.get_device_name(list[i]));
    }
    V.free_device_list(list);
    printf("ok devices %d\n", n);
}

static void check_port(void)
{
    struct ibv_port_attr p;
    struct ibv_device_attr d;
    union ibv_gid g0, g1, other;
    PP_CHECK(V.query_port(E.ctx, 1, &p) == 0 && V.query_port(E.ctx, 2, &p) != 0, "query_port");
    PP_CHECK(V.query_port(E.ctx, 1, &p) == 0 && p.state == IBV_PORT_ACTIVE && p.active_mtu == IBV_MTU_1024 &&
             p.max_mtu == IBV_MTU_4096 && p.link_layer == IBV_LINK_LAYER_ETHERNET && p.gid_tbl_len >= 2 &&
             p.max_msg_sz == (1u << 20), "port attributes");
    PP_CHECK(V.query_device(E.ctx, &d) == 0 && d.max_qp_wr >= 32 && d.max_sge >= 2 && d.phys_port_cnt == 1, "device");
    PP_CHECK(V.query_gid(E.ctx, 1, 0, &g0) == 0 && g0.raw[0] == 0xfe && g0.raw[1] == 0x80, "gid 0 link-local");
    PP_CHECK(V.query_gid(E.ctx, 1, 1, &g1) == 0 && g1.raw[10] == 0xff && g1.raw[11] == 0xff, "gid 1 IPv4-mapped");
    PP_CHECK(V.query_gid(E.ctx, 1, p.gid_tbl_len, &g0) != 0, "a GID past the table");
    struct ibv_context *c1 = pp_open(&V, "fcfab1");
    PP_CHECK(V.query_gid(c1, 1, 1, &other) == 0 && memcmp(&other, &g1, sizeof g1) != 0, "GIDs differ by device");
    PP_CHECK(V.close_device(c1) == 0, "close fcfab1");
    printf("ok port max_msg_sz %u max_qp_wr %d max_sge %d gid1 %u.%u.%u.%u\n", p.max_msg_sz, d.max_qp_wr,
           d.max_sge, g1.raw[12], g1.raw[13], g1.raw[14], g1.raw[15]);
}

static void check_states(enum ibv_qp_type type)
{
    struct ibv_qp *qp = qp_new(type, 4, E.cq);
    struct ibv_qp_attr a = rtr_attr(qp);
    int rc = type == IBV_QPT_RC, extra = rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0;
    PP_CHECK(V.modify_qp(qp, &a, RTR_MASK | extra) == EINVAL, "RESET -> RTR");
    PP_CHECK(to_init(qp, INIT_MASK & ~IBV_QP_PORT) == EINVAL, "INIT without the port");
    PP_CHECK(to_init(qp, INIT_MASK | IBV_QP_SQ_PSN) == EINVAL, "INIT with a mask bit it does not allow");
    PP_CHECK(to_init(qp, INIT_MASK) == 0 && state_of(qp) == IBV_QPS_INIT, "RESET -> INIT");
    a.qp_state = IBV_QPS_RTS;
    PP_CHECK(V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL, "INIT -> RTS");
    a = rtr_attr(qp);
    PP_CHECK(V.modify_qp(qp, &a, (RTR_MASK & ~IBV_QP_RQ_PSN) | extra) == EINVAL, "RTR without rq_psn");
    PP_CHECK(!rc || V.modify_qp(qp, &a, RTR_MASK) == EINVAL, "RC's RTR without its atomics and RNR timer");
    a.path_mtu = IBV_MTU_4096;
    PP_CHECK(V.modify_qp(qp, &a, RTR_MASK | extra) == EINVAL, "a path MTU over the active MTU");
    a = rtr_attr(qp);
    a.ah_attr.is_global = 0;
    PP_CHECK(V.modify_qp(qp, &a, RTR_MASK | extra) == EINVAL, "RTR without a GRH");
    a = rtr_attr(qp);
    a.ah_attr.grh.dgid.raw[12] = 192;
    PP_CHECK(V.modify_qp(qp, &a, RTR_MASK | extra) == EINVAL, "RTR to a GID the fabric never gave");
    a = rtr_attr(qp);
    PP_CHECK(V.modify_qp(qp, &a, RTR_MASK | extra) == 0 && state_of(qp) == IBV_QPS_RTR, "INIT -> RTR");
    PP_CHECK(send_on(qp, PP_HALF, 8, E.mr->lkey, IBV_SEND_SIGNALED) == EINVAL, "a send before RTS");
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    PP_CHECK(V.modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RTS without sq_psn");
    PP_CHECK(!rc || V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL, "RC's RTS without timeouts");
    int rts = IBV_QP_STATE | IBV_QP_SQ_PSN;
    rts |= rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0;
    PP_CHECK(V.modify_qp(qp, &a, rts) == 0 && state_of(qp) == IBV_QPS_RTS, "RTR -> RTS");
    PP_CHECK(V.destroy_qp(qp) == 0, "destroy_qp");
    printf("ok states %s\n", rc ? "RC" : "UC");
}

/* Queue depths: posting past max_recv_wr or max_send_wr outstanding is ENOMEM; an unsignaled
 * send stays outstanding until a later signaled one's completion is polled. */
static void check_depths(void)
{
    struct ibv_qp *qp = loop_qp(4, E.cq);
    struct ibv_wc wc[8];
    for (uint32_t i = 0; i < 4; i++)
        PP_CHECK(recv_on(qp, i * 4096, 4096) == 0, "receive %u", i);
    PP_CHECK(recv_on(qp, 0, 4096) == ENOMEM, "a fifth receive on max_recv_wr 4");
    for (uint32_t i = 0; i < 4; i++)
        PP_CHECK(send_on(qp, PP_HALF, 100, E.mr->lkey, i == 3 ? IBV_SEND_SIGNALED : 0) == 0, "send %u", i);
    PP_CHECK(send_on(qp, PP_HALF, 100, E.mr->lkey, IBV_SEND_SIGNALED) == ENOMEM, "a fifth send on max_send_wr 4");
    int n = ibv_poll_cq(E.cq, 8, wc);
    PP_CHECK(n == 5, "%d completions, want 4 receives and 1 send", n);
    PP_CHECK(send_on(qp, PP_HALF, 100, E.mr->lkey, IBV_SEND_SIGNALED) == 0, "a send once the queue drained");
    PP_CHECK(pp_poll(&E, wc, 1000) && wc[0].opcode == IBV_WC_SEND, "its completion");
    char stack[64] = "inline from memory no MR covers";
    struct ibv_sge sg = {(uintptr_t)stack, sizeof stack, 0};
    struct ibv_send_wr wr = {.sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED}, *bad;
    PP_CHECK(recv_on(qp, 0, 4096) == 0 && ibv_post_send(qp, &wr, &bad) == 0, "an inline send");
    PP_CHECK(ibv_poll_cq(E.cq, 8, wc) == 2 && memcmp(E.buf, stack, sizeof stack) == 0, "the inline send landed");
    sg.length = 65;
    PP_CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr, "inline past max_inline_data");
    struct ibv_sge three[3] = {sg, sg, sg};
    wr.sg_list = three, wr.num_sge = 3, wr.send_flags = 0;
    PP_CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL, "more sges than max_send_sge");
    PP_CHECK(V.destroy_qp(qp) == 0, "destroy_qp");
    printf("ok depths\n");
}

/* A bad lkey, an sge past its MR, a message over max_msg_sz: error completions (signaled or
 * not), the QP in ERR, and from then on every work request flushed. */
static void check_errors(void)
{
    struct ibv_wc wc;
    struct { uint32_t off, len, lkey; int status; } cases[] = {
        {PP_HALF, 64, E.mr->lkey + 1000, IBV_WC_LOC_PROT_ERR},
        {PP_BUF - 32, 64, E.mr->lkey, IBV_WC_LOC_PROT_ERR},
        {0, (1u << 20) + 1, E.mr->lkey, IBV_WC_LOC_LEN_ERR}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ibv_qp *qp = loop_qp(4, E.cq);
        PP_CHECK(recv_on(qp, 0, 4096) == 0, "receive");
        PP_CHECK(send_on(qp, cases[i].off, cases[i].len, cases[i].lkey, 0) == 0, "post");
        PP_CHECK(pp_poll(&E, &wc, 1000) && (int)wc.status == cases[i].status, "case %zu: status %d", i, wc.status);
        PP_CHECK(state_of(qp) == IBV_QPS_ERR, "case %zu: the QP is in ERR", i);
        PP_CHECK(pp_poll(&E, &wc, 1000) && wc.status == IBV_WC_WR_FLUSH_ERR && wc.opcode == IBV_WC_RECV, "flushed");
        PP_CHECK(send_on(qp, PP_HALF, 8, E.mr->lkey, 0) == 0 && pp_poll(&E, &wc, 1000) &&
                 wc.status == IBV_WC_WR_FLUSH_ERR, "a send in ERR is flushed");
        PP_CHECK(V.destroy_qp(qp) == 0, "destroy_qp");
    }
    printf("ok errors\n");
}

/* Objects in use cannot go; a CQ that overflows fails its polls and overwrites nothing. */
static void check_busy_and_overrun(void)
{
    struct ibv_cq *small = V.create_cq(E.ctx, 2, NULL, NULL, 0);
    PP_CHECK(small, "create_cq");
    struct ibv_qp *qp = loop_qp(8, small);
    struct ibv_wc wc[4];
    PP_CHECK(V.destroy_cq(small) == EBUSY && V.dealloc_pd(E.pd) == EBUSY && V.close_device(E.ctx) == EBUSY,
             "busy objects");
    for (int i = 0; i < 3; i++)
        PP_CHECK(send_on(qp, PP_HALF, 8, E.mr->lkey, IBV_SEND_SIGNALED) == 0, "send %d", i);
    PP_CHECK(ibv_poll_cq(small, 4, wc) < 0, "an overrun CQ's poll fails");
    PP_CHECK(V.destroy_qp(qp) == 0 && V.destroy_cq(small) == 0, "teardown after the overrun");
    printf("ok busy overrun\n");
}

/* RESET empties a QP; brought up again, it works, and its peer (itself) finds it anew. */
static void check_reset(void)
{
    struct ibv_qp *qp = loop_qp(4, E.cq);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
    struct ibv_wc wc;
    PP_CHECK(recv_on(qp, 0, 4096) == 0, "receive");
    PP_CHECK(V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) == EINVAL, "RESET takes no other attribute");
    PP_CHECK(V.modify_qp(qp, &a, IBV_QP_STATE) == 0 && state_of(qp) == IBV_QPS_RESET, "to RESET");
    PP_CHECK(!pp_poll(&E, &wc, 50), "RESET completes nothing");
    struct pp_dest me = {.qpn = qp->qp_num, .psn = 7, .gid = E.me.gid};
    struct pp_end e = E;
    e.qp = qp;
    pp_connect(&V, &e, &me);
    PP_CHECK(recv_on(qp, 0, 4096) == 0 && send_on(qp, PP_HALF, 32, E.mr->lkey, 0) == 0, "post after reset");
    PP_CHECK(pp_poll(&E, &wc, 1000) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 32, "delivered after reset");
    PP_CHECK(V.destroy_qp(qp) == 0, "destroy_qp");
    printf("ok reset\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    pp_load(&V);
    check_devices();
    pp_setup(&V, &E, "fcfab0", IBV_QPT_UC, 4, 64);
    check_port();
    check_states(IBV_QPT_UC);
    check_states(IBV_QPT_RC);
    check_depths();
    check_errors();
    check_busy_and_overrun();
    check_reset();
    pp_teardown(&V, &E);
    printf("ok all\n");
    return 0;
}
