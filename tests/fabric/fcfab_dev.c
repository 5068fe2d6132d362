/* fcfab: devices, contexts, ports and GIDs, protection domains, memory regions, and the count of
 * what is still open that FCFAB_REPORT writes at exit. */
#include "fcfab.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ibv_device devs[FC_MAX_DEV];
static struct fc_config cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static _Atomic int counts[FC_N_KINDS];
static _Atomic uint32_t next_key = 0x1000;
/* Every open context, so that exit can unlink the inboxes of queue pairs left open. */
static pthread_mutex_t ctxs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fc_ctx *ctxs;

void fc_config_error(struct fc_config *c, const char *fmt, const char *what)
{
    if (c->error)
        return;
    snprintf(c->error_buf, sizeof c->error_buf, fmt, what);
    c->error = c->error_buf;
    fprintf(stderr, "fcfab: %s\n", c->error);
}

static void config_devices(void)
{
    const char *s = getenv("FCFAB_DEVICES");
    char *end = NULL;
    cfg.devices = FC_DEFAULT_DEV;
    if (!s || !*s)
        return;
    long n = strtol(s, &end, 10);
    if (*end || n < 1 || n > FC_MAX_DEV)
        fc_config_error(&cfg, "FCFAB_DEVICES=%s: want a number of devices from 1 to 16", s);
    else
        cfg.devices = (int)n;
}

static void config_init(void)
{
    config_devices();
    const char *dir = getenv("FCFAB_DIR");
    if (dir && *dir) {
        if (strlen(dir) >= FC_DIR_MAX)
            fc_config_error(&cfg, "FCFAB_DIR is longer than %s characters", "399");
        else
            snprintf(cfg.dir, sizeof cfg.dir, "%s", dir);
    } else {
        snprintf(cfg.dir, sizeof cfg.dir, "/dev/shm/fcfab-%u", (unsigned)getuid());
    }
    fc_faults_parse(getenv("FCFAB_FAULT"), &cfg);
    for (int i = 0; i < FC_MAX_DEV; i++) {
        struct ibv_device *d = &devs[i];
        d->node_type = IBV_NODE_CA;
        d->transport_type = IBV_TRANSPORT_IB;
        snprintf(d->name, sizeof d->name, "fcfab%d", i);
        snprintf(d->dev_name, sizeof d->dev_name, "uverbs%d", i);
        snprintf(d->dev_path, sizeof d->dev_path, "/sys/class/infiniband_verbs/uverbs%d", i);
        snprintf(d->ibdev_path, sizeof d->ibdev_path, "/sys/class/infiniband/fcfab%d", i);
    }
}

const struct fc_config *fc_config(void)
{
    pthread_once(&cfg_once, config_init);
    return &cfg;
}

void fc_count(enum fc_count kind, int delta)
{
    atomic_fetch_add(&counts[kind], delta);
}

struct fc_ctx *fc_ctx_of(struct ibv_context *c)
{
    return (struct fc_ctx *)(void *)c;  /* ibv is fc_ctx's first member */
}

/* Index 1 is ::ffff:A.B.C.D with A = 10 + device and B.C.D the pid (Linux pids fit 22 bits);
 * index 0 is fe80::2fc:fa<dev>:<pid>. Both name this process's device, so a peer can find it. */
void fc_gid(int dev, int index, union ibv_gid *gid)
{
    uint32_t pid = (uint32_t)getpid();
    memset(gid, 0, sizeof *gid);
    if (index == 1) {
        gid->raw[10] = gid->raw[11] = 0xff;
        gid->raw[12] = (uint8_t)(10 + dev);
    } else {
        gid->raw[0] = 0xfe;
        gid->raw[1] = 0x80;
        gid->raw[8] = 0x02;
        gid->raw[9] = 0xfc;
        gid->raw[10] = 0xfa;
        gid->raw[11] = (uint8_t)dev;
        gid->raw[12] = (uint8_t)(pid >> 24);
    }
    gid->raw[13] = (uint8_t)(pid >> 16);
    gid->raw[14] = (uint8_t)(pid >> 8);
    gid->raw[15] = (uint8_t)pid;
}

int fc_gid_lookup(const union ibv_gid *gid, int *dev, uint32_t *pid)
{
    const uint8_t *r = gid->raw;
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t ll[11] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xfc, 0xfa};
    uint32_t low = (uint32_t)r[13] << 16 | (uint32_t)r[14] << 8 | r[15];
    if (memcmp(r, v4, sizeof v4) == 0 && r[12] >= 10 && r[12] < 10 + FC_MAX_DEV) {
        *dev = r[12] - 10;
        *pid = low;
        return 0;
    }
    if (memcmp(r, ll, sizeof ll) == 0 && r[11] < FC_MAX_DEV) {
        *dev = r[11];
        *pid = (uint32_t)r[12] << 24 | low;
        return 0;
    }
    return -1;
}

FC_API struct ibv_device **ibv_get_device_list(int *num_devices)
{
    const struct fc_config *c = fc_config();
    if (num_devices)
        *num_devices = 0;
    if (c->error) {
        errno = EINVAL;
        return NULL;
    }
    struct ibv_device **list = calloc((size_t)c->devices + 1, sizeof *list);
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < c->devices; i++)
        list[i] = &devs[i];
    if (num_devices)
        *num_devices = c->devices;
    return list;
}

FC_API void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

FC_API const char *ibv_get_device_name(struct ibv_device *device)
{
    return device ? device->name : NULL;
}

static void ctx_init(struct fc_ctx *ctx, struct ibv_device *device, int dev)
{
    struct ibv_context *c = &ctx->ibv;
    c->device = device;
    c->cmd_fd = -1;
    c->async_fd = -1;
    c->num_comp_vectors = 1;
    c->abi_compat = NULL;  /* not an extended context: verbs.h's *_ex wrappers take their legacy path */
    c->ops.post_send = fc_post_send;
    c->ops.post_recv = fc_post_recv;
    c->ops.poll_cq = fc_poll_cq;
    c->ops.req_notify_cq = fc_req_notify_cq;
    pthread_mutex_init(&c->mutex, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->dev = dev;
}

FC_API struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    const struct fc_config *c = fc_config();
    int dev = -1;
    for (int i = 0; i < c->devices; i++)
        if (device == &devs[i])
            dev = i;
    if (c->error || dev < 0 || getpid() >= (1 << 24)) {
        errno = c->error ? EINVAL : ENODEV;
        return NULL;
    }
    if (fc_dir_ready(c->dir) != 0)
        return NULL;
    fc_dir_sweep(c->dir);
    struct fc_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        errno = ENOMEM;
        return NULL;
    }
    ctx_init(ctx, device, dev);
    pthread_mutex_lock(&ctxs_lock);
    ctx->next = ctxs;
    ctxs = ctx;
    pthread_mutex_unlock(&ctxs_lock);
    fc_count(FC_N_CTX, 1);
    return &ctx->ibv;
}

FC_API int ibv_close_device(struct ibv_context *context)
{
    struct fc_ctx *ctx = fc_ctx_of(context);
    pthread_mutex_lock(&ctx->lock);
    int busy = ctx->objects > 0 || ctx->qps || ctx->mrs;
    pthread_mutex_unlock(&ctx->lock);
    if (busy)
        return EBUSY;  /* stricter than rdma-core, which frees them: a test should see the leak */
    pthread_mutex_lock(&ctxs_lock);
    for (struct fc_ctx **p = &ctxs; *p; p = &(*p)->next)
        if (*p == ctx) {
            *p = ctx->next;
            break;
        }
    pthread_mutex_unlock(&ctxs_lock);
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&context->mutex);
    free(ctx);
    fc_count(FC_N_CTX, -1);
    return 0;
}

FC_API int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    struct fc_ctx *ctx = fc_ctx_of(context);
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "fcfab 1");
    a->node_guid = htobe64(0x02fcfab000000000ULL | (uint64_t)ctx->dev);
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = UINT64_MAX;
    a->page_size_cap = 4096;
    a->max_qp = 4096;
    a->max_qp_wr = FC_MAX_WR;
    a->max_sge = FC_MAX_SGE;
    a->max_sge_rd = FC_MAX_SGE;
    a->max_cq = 4096;
    a->max_cqe = FC_MAX_CQE;
    a->max_mr = 1 << 20;
    a->max_pd = 4096;
    a->max_qp_rd_atom = a->max_qp_init_rd_atom = a->max_res_rd_atom = FC_MAX_RD_ATOM;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->phys_port_cnt = 1;
    return 0;
}

/* verbs.h declares the exported symbol with an opaque compat struct; callers pass the real one. */
FC_API int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                          struct _compat_ibv_port_attr *compat)
{
    struct ibv_port_attr *a = (struct ibv_port_attr *)(void *)compat;
    (void)context;
    if (port_num != 1 || !a)
        return EINVAL;
    memset(a, 0, sizeof *a);
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = FC_ACTIVE_MTU;
    a->gid_tbl_len = FC_GID_LEN;
    a->max_msg_sz = FC_MAX_MSG;
    a->pkey_tbl_len = 1;
    a->active_width = 1;   /* 1X */
    a->active_speed = 32;  /* EDR */
    a->phys_state = 5;     /* LinkUp */
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

FC_API int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    if (port_num != 1 || index < 0 || index >= FC_GID_LEN || !gid) {
        errno = EINVAL;
        return -1;
    }
    fc_gid(fc_ctx_of(context)->dev, index, gid);
    return 0;
}

FC_API struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct fc_ctx *ctx = fc_ctx_of(context);
    struct fc_pd *pd = calloc(1, sizeof *pd);
    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->ibv.context = context;
    pd->ibv.handle = atomic_fetch_add(&next_key, 1);
    pthread_mutex_lock(&ctx->lock);
    ctx->objects++;
    pthread_mutex_unlock(&ctx->lock);
    fc_count(FC_N_PD, 1);
    return &pd->ibv;
}

FC_API int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
    struct fc_pd *pd = (struct fc_pd *)(void *)ibpd;
    struct fc_ctx *ctx = fc_ctx_of(ibpd->context);
    pthread_mutex_lock(&ctx->lock);
    int busy = pd->users > 0;
    if (!busy)
        ctx->objects--;
    pthread_mutex_unlock(&ctx->lock);
    if (busy)
        return EBUSY;
    free(pd);
    fc_count(FC_N_PD, -1);
    return 0;
}

#define FC_ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
                       IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)
#define FC_ACCESS_NEEDS_LOCAL (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

FC_API struct ibv_mr *ibv_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, int access)
{
    unsigned a = (unsigned)access;
    /* As the kernel: remote write or atomic access needs local write too. */
    if (!ibpd || !addr || length == 0 || (a & ~(unsigned)FC_ACCESS_ALL) ||
        ((a & FC_ACCESS_NEEDS_LOCAL) && !(a & IBV_ACCESS_LOCAL_WRITE)) ||
        (uintptr_t)addr + length < (uintptr_t)addr) {
        errno = EINVAL;
        return NULL;
    }
    struct fc_mr *mr = calloc(1, sizeof *mr);
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    struct fc_ctx *ctx = fc_ctx_of(ibpd->context);
    mr->ibv.context = ibpd->context;
    mr->ibv.pd = ibpd;
    mr->ibv.addr = addr;
    mr->ibv.length = length;
    mr->ibv.handle = mr->ibv.lkey = mr->ibv.rkey = atomic_fetch_add(&next_key, 1);
    mr->access = access;
    pthread_mutex_lock(&ctx->lock);
    mr->next = ctx->mrs;
    ctx->mrs = mr;
    ((struct fc_pd *)(void *)ibpd)->users++;
    pthread_mutex_unlock(&ctx->lock);
    fc_count(FC_N_MR, 1);
    return &mr->ibv;
}

FC_API int ibv_dereg_mr(struct ibv_mr *ibmr)
{
    struct fc_ctx *ctx = fc_ctx_of(ibmr->context);
    int found = 0;
    pthread_mutex_lock(&ctx->lock);
    for (struct fc_mr **p = &ctx->mrs; *p; p = &(*p)->next)
        if (&(*p)->ibv == ibmr) {
            *p = (*p)->next;
            found = 1;
            ((struct fc_pd *)(void *)ibmr->pd)->users--;
            break;
        }
    pthread_mutex_unlock(&ctx->lock);
    if (!found)
        return EINVAL;
    free((struct fc_mr *)(void *)ibmr);
    fc_count(FC_N_MR, -1);
    return 0;
}

/* At exit (or dlclose): unlink the inboxes of queue pairs left open, as the kernel would free
 * them, and write the count of what was left open where FCFAB_REPORT says. */
__attribute__((destructor)) static void fc_at_exit(void)
{
    pthread_mutex_lock(&ctxs_lock);
    for (struct fc_ctx *c = ctxs; c; c = c->next)
        if (pthread_mutex_trylock(&c->lock) == 0) {  /* a thread still in a call keeps its own */
            for (struct fc_qp *q = c->qps; q; q = q->next)
                unlink(q->path);
            pthread_mutex_unlock(&c->lock);
        }
    pthread_mutex_unlock(&ctxs_lock);
    const char *path = getenv("FCFAB_REPORT");
    if (!path || !*path || strlen(path) > FC_PATH_MAX)
        return;
    char name[FC_PATH_MAX + 32], line[160];
    snprintf(name, sizeof name, "%s.%d", path, (int)getpid());
    int n = snprintf(line, sizeof line, "%d ctx %d pd %d mr %d cq %d qp %d\n", (int)getpid(),
                     counts[FC_N_CTX], counts[FC_N_PD], counts[FC_N_MR], counts[FC_N_CQ], counts[FC_N_QP]);
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)n) != n)
        fprintf(stderr, "fcfab: could not write %s\n", name);
    close(fd);
}
