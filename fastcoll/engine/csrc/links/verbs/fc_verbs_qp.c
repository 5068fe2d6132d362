/* A link's verbs objects: the device, a protection domain, one completion queue, registered
 * page-aligned slots, and the queue pair, brought RESET -> INIT -> RTR -> RTS with the steps MLX's
 * JACCL takes on Apple's RDMA over Thunderbolt (port 1, an IPv4-mapped GID, MTU 1024). */
#include "fc_verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_GIDS 256 /* a bound on the GID table walked (a device reports its length) */

/* Append "name" to a list of device names in out (what a missing device's reason shows). */
static void list_names(const fc_verbs_lib *lib, struct ibv_device **list, int n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < n && list[i] && used + 1 < len; i++) {
        const char *name = lib->get_device_name(list[i]);
        int k = snprintf(out + used, len - used, "%s%s", i ? ", " : "", name ? name : "?");
        if (k < 0)
            break;
        used += (size_t)k;
    }
    if (used >= len && len > 4)
        memcpy(out + len - 4, "...", 4);
}

/* Open the device named `name` into q->ctx. 0, or -1 with why. */
static int open_device(fc_verbs_qp *q, const char *name, char *why, size_t why_len)
{
    const fc_verbs_lib *lib = q->lib;
    if (!name || !name[0]) {
        snprintf(why, why_len, "no RDMA device was named for this link");
        return -1;
    }
    int n = 0;
    struct ibv_device **list = lib->get_device_list(&n);
    if (!list) {
        snprintf(why, why_len, "the verbs library %s lists no RDMA device (%s: is RDMA enabled on this machine?)",
                 lib->path, strerror(errno));
        return -1;
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n && list[i] && !dev; i++) {
        const char *s = lib->get_device_name(list[i]);
        if (s && strcmp(s, name) == 0)
            dev = list[i];
    }
    if (!dev) {
        char names[256];
        list_names(lib, list, n, names, sizeof names);
        lib->free_device_list(list);
        snprintf(why, why_len, "no RDMA device '%s' (the verbs library %s has %s%s)", name, lib->path,
                 names[0] ? "" : "none", names);
        return -1;
    }
    q->ctx = lib->open_device(dev);
    lib->free_device_list(list);
    if (!q->ctx) {
        snprintf(why, why_len, "could not open the RDMA device %s (errno %d)", name, errno);
        return -1;
    }
    return 0;
}

/* The port's LID and MTU, and the index of its IPv4-mapped GID (-1: none), as JACCL picks it:
 * Thunderbolt and RoCE ports are addressed by that GID. 0, or -1 with why. */
static int port_address(fc_verbs_qp *q, char *why, size_t why_len)
{
    struct ibv_port_attr port;
    memset(&port, 0, sizeof port); /* (the library's ibv_query_port may fill only the old prefix) */
    if (q->lib->query_port(q->ctx, FC_VERBS_PORT, &port)) {
        snprintf(why, why_len, "could not query port %d of the RDMA device %s", FC_VERBS_PORT, q->device);
        return -1;
    }
    q->me.lid = port.lid;
    int mtu = port.active_mtu;
    q->me.mtu = (uint8_t)(mtu >= IBV_MTU_256 && mtu < IBV_MTU_1024 ? mtu : IBV_MTU_1024);
    q->gid_index = -1;
    int n = port.gid_tbl_len < MAX_GIDS ? port.gid_tbl_len : MAX_GIDS;
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    for (int i = 0; i < n && q->gid_index < 0; i++) {
        union ibv_gid gid;
        if (q->lib->query_gid(q->ctx, FC_VERBS_PORT, i, &gid) == 0 && memcmp(gid.raw, v4, sizeof v4) == 0) {
            q->gid_index = i;
            memcpy(q->me.gid, gid.raw, sizeof q->me.gid);
            q->me.has_gid = 1;
        }
    }
    if (q->gid_index < 0 && q->me.lid == 0) {
        snprintf(why, why_len, "the RDMA device %s has no IPv4-mapped GID (a Thunderbolt RDMA port publishes "
                 "one once its interface has an IPv4 address) and no LID", q->device);
        return -1;
    }
    return 0;
}

/* Page-aligned slots, registered for the device to write (receives) and read (sends); nothing
 * is open to the peer's RDMA reads or writes. 0, or -1 with why. */
static int register_slots(fc_verbs_qp *q, char *why, size_t why_len)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? (size_t)page : 4096;
    q->rx_bytes = (size_t)FC_VERBS_RX_SLOTS * FC_VERBS_SLOT_BYTES;
    q->tx_bytes = (size_t)FC_VERBS_TX_SLOTS * FC_VERBS_SLOT_BYTES + FC_VERBS_CTL * FC_VERBS_CTL_BYTES;
    void *rx = NULL, *tx = NULL;
    if (posix_memalign(&rx, align, q->rx_bytes) == 0)
        q->rx_mem = rx;
    if (posix_memalign(&tx, align, q->tx_bytes) == 0)
        q->tx_mem = tx;
    if (!q->rx_mem || !q->tx_mem) {
        snprintf(why, why_len, "out of memory for the RDMA link's buffers");
        return -1; /* (fc_verbs_qp_close frees what was had) */
    }
    memset(q->rx_mem, 0, q->rx_bytes);
    memset(q->tx_mem, 0, q->tx_bytes);
    q->rx_mr = q->lib->reg_mr(q->pd, q->rx_mem, q->rx_bytes, IBV_ACCESS_LOCAL_WRITE);
    q->tx_mr = q->rx_mr ? q->lib->reg_mr(q->pd, q->tx_mem, q->tx_bytes, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!q->tx_mr) {
        snprintf(why, why_len, "could not register %zu bytes with the RDMA device %s (errno %d: the locked-memory "
                 "limit?)", q->rx_bytes + q->tx_bytes, q->device, errno);
        return -1;
    }
    return 0;
}

static int create_queues(fc_verbs_qp *q, char *why, size_t why_len)
{
    int sends = FC_VERBS_TX_SLOTS + FC_VERBS_CTL;
    q->cq = q->lib->create_cq(q->ctx, sends + FC_VERBS_RX_SLOTS, NULL, NULL, 0);
    if (!q->cq) {
        snprintf(why, why_len, "could not create a completion queue on the RDMA device %s (errno %d)", q->device,
                 errno);
        return -1;
    }
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    a.send_cq = q->cq;
    a.recv_cq = q->cq;
    a.cap.max_send_wr = (uint32_t)sends;
    a.cap.max_recv_wr = FC_VERBS_RX_SLOTS;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.qp_type = q->reliable ? IBV_QPT_RC : IBV_QPT_UC;
    q->qp = q->lib->create_qp(q->pd, &a);
    if (!q->qp) {
        snprintf(why, why_len, "could not create a%s queue pair on the RDMA device %s (errno %d)",
                 q->reliable ? " reliable-connected" : "n unreliable-connected", q->device, errno);
        return -1;
    }
    q->me.qpn = q->qp->qp_num;
    return 0;
}

/* A packet sequence number to start from: any 24-bit value; a fresh one per queue pair keeps a
 * stale packet of an earlier pair from matching. */
static uint32_t first_psn(const void *salt)
{
    uint64_t x = (uint64_t)fc_now() ^ ((uint64_t)getpid() << 20) ^ (uint64_t)(uintptr_t)salt;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x & 0xffffffu;
}

int fc_verbs_qp_open(fc_verbs_qp *q, const fc_verbs_lib *lib, const char *device, int reliable, char *why,
                     size_t why_len)
{
    memset(q, 0, sizeof *q);
    q->lib = lib;
    q->reliable = reliable;
    q->gid_index = -1;
    snprintf(q->device, sizeof q->device, "%s", device ? device : "");
    if (open_device(q, device, why, why_len) || port_address(q, why, why_len))
        goto fail;
    q->pd = lib->alloc_pd(q->ctx);
    if (!q->pd) {
        snprintf(why, why_len, "could not allocate a protection domain on the RDMA device %s", q->device);
        goto fail;
    }
    if (register_slots(q, why, why_len) || create_queues(q, why, why_len))
        goto fail;
    q->me.psn = first_psn(q);
    q->me.slots = FC_VERBS_RX_SLOTS;
    q->me.slot_bytes = FC_VERBS_SLOT_BYTES;
    q->me.reliable = reliable;
    return 0;
fail:
    fc_verbs_qp_close(q);
    return -1;
}

static int modify(fc_verbs_qp *q, struct ibv_qp_attr *a, int mask, const char *state, char *why, size_t why_len)
{
    int rc = q->lib->modify_qp(q->qp, a, mask);
    if (rc)
        snprintf(why, why_len, "the RDMA device %s refused to bring its queue pair to %s (error %d)", q->device,
                 state, rc);
    return rc ? -1 : 0;
}

int fc_verbs_qp_init(fc_verbs_qp *q, char *why, size_t why_len)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = FC_VERBS_PORT;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE; /* sends only: no remote access to anything */
    return modify(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT", why,
                  why_len);
}

static int to_rtr(fc_verbs_qp *q, const fc_verbs_addr *peer, char *why, size_t why_len)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)q->path_mtu;
    a.rq_psn = peer->psn;
    a.dest_qp_num = peer->qpn;
    a.ah_attr.dlid = peer->lid;
    a.ah_attr.port_num = FC_VERBS_PORT;
    if (peer->has_gid) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.hop_limit = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, sizeof peer->gid);
        a.ah_attr.grh.sgid_index = (uint8_t)q->gid_index;
    }
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (q->reliable) {
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    return modify(q, &a, mask, "RTR", why, why_len);
}

int fc_verbs_qp_connect(fc_verbs_qp *q, const fc_verbs_addr *peer, char *why, size_t why_len)
{
    if (peer->has_gid != (q->gid_index >= 0)) {
        snprintf(why, why_len, "the peer's RDMA device is addressed by %s, this side's (%s) by %s",
                 peer->has_gid ? "GID" : "LID", q->device, q->gid_index >= 0 ? "GID" : "LID");
        return -1;
    }
    q->path_mtu = peer->mtu < q->me.mtu ? peer->mtu : q->me.mtu;
    if (to_rtr(q, peer, why, why_len))
        return -1;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = q->me.psn;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (q->reliable) {
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return modify(q, &a, mask, "RTS", why, why_len);
}

void fc_verbs_qp_close(fc_verbs_qp *q)
{
    const fc_verbs_lib *lib = q->lib;
    if (q->qp)
        lib->destroy_qp(q->qp);
    if (q->rx_mr)
        lib->dereg_mr(q->rx_mr);
    if (q->tx_mr)
        lib->dereg_mr(q->tx_mr);
    if (q->cq)
        lib->destroy_cq(q->cq);
    if (q->pd)
        lib->dealloc_pd(q->pd);
    if (q->ctx)
        lib->close_device(q->ctx);
    free(q->rx_mem);
    free(q->tx_mem);
    memset(q, 0, sizeof *q);
}

int fc_verbs_post_recv(fc_verbs_qp *q, uint32_t slot)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)(q->rx_mem + (size_t)slot * FC_VERBS_SLOT_BYTES),
                          FC_VERBS_SLOT_BYTES, q->rx_mr->lkey};
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uint64_t)FC_WR_RECV << 32 | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(q->qp, &wr, &bad);
}

int fc_verbs_post_send(fc_verbs_qp *q, uint8_t *buf, uint32_t len, uint64_t wr_id)
{
    struct ibv_sge sge = {(uint64_t)(uintptr_t)buf, len, q->tx_mr->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    return ibv_post_send(q->qp, &wr, &bad);
}
