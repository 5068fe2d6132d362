/* fcfab: the directory of inboxes (FCFAB_DIR) and the inbox files themselves, one a queue pair,
 * named by what a peer knows of it: the device and pid in its GID, and its QP number. */
#include "fcfab.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory exists (made 0700 if not), is ours, and nobody else may write in it. */
int fc_dir_ready(const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        fprintf(stderr, "fcfab: cannot make FCFAB_DIR %s: %s\n", dir, strerror(e));
        errno = e;
        return -1;
    }
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 022)) {
        fprintf(stderr, "fcfab: FCFAB_DIR %s must be a directory of this user that no one else may "
                        "write in\n", dir);
        errno = EACCES;
        return -1;
    }
    return 0;
}

/* A file of ours whose process is gone: a killed peer's inbox, or one it was still making. */
static int stale(const char *name)
{
    int dev, used = 0;
    unsigned pid, qpn;
    if (!(sscanf(name, "qp-%d-%u-%x%n", &dev, &pid, &qpn, &used) == 3 && name[used] == '\0') &&
        !(sscanf(name, "tmp-%u-%x%n", &pid, &qpn, &used) == 2 && name[used] == '\0'))
        return 0;
    return pid > 0 && pid < (1u << 24) && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Unlink the inboxes of processes that died without closing them (SIGKILL), so that the
 * directory does not fill up; a live process's files are never touched. */
void fc_dir_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (stale(e->d_name))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

void fc_qp_path(char *out, int dev, uint32_t pid, uint32_t qpn)
{
    snprintf(out, FC_PATH_MAX, "%s/qp-%d-%u-%06x", fc_config()->dir, dev, (unsigned)pid, (unsigned)qpn);
}

static uint64_t inbox_bytes(uint32_t slots)
{
    return FC_HDR_BYTES + (uint64_t)slots * FC_STRIDE;
}

static void inbox_init(struct fc_inbox *in, uint32_t slots, int dev, const struct fc_qp *qp)
{
    in->magic = FC_MAGIC;
    in->version = FC_VERSION;
    in->slots = slots;
    in->stride = FC_STRIDE;
    in->bytes = inbox_bytes(slots);
    in->pid = (uint32_t)getpid();
    in->dev = (uint32_t)dev;
    in->qpn = qp->ibv.qp_num;
    in->qp_type = (uint32_t)qp->ibv.qp_type;
    atomic_init(&in->state, (uint32_t)IBV_QPS_RESET);
    atomic_init(&in->posted, 0);
    atomic_init(&in->claimed, 0);
}

/* Made under a temporary name and renamed into place whole, so a peer never maps half of one. */
int fc_inbox_create(struct fc_qp *qp, int dev)
{
    char tmp[FC_PATH_MAX + 32];
    uint32_t slots = qp->init.cap.max_recv_wr ? qp->init.cap.max_recv_wr : 1;
    size_t bytes = (size_t)inbox_bytes(slots);
    fc_qp_path(qp->path, dev, (uint32_t)getpid(), qp->ibv.qp_num);
    snprintf(tmp, sizeof tmp, "%s/tmp-%d-%06x", fc_config()->dir, (int)getpid(), qp->ibv.qp_num);
    unlink(tmp);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED) {
        unlink(tmp);
        errno = e;
        return -1;
    }
    inbox_init(base, slots, dev, qp);
    if (rename(tmp, qp->path) != 0) {
        e = errno;
        munmap(base, bytes);
        unlink(tmp);
        errno = e;
        return -1;
    }
    qp->self = (struct fc_map){.in = base, .bytes = bytes, .slots = slots};
    return 0;
}

/* The owner leaves its inbox: senders that still map it see FC_RETIRED and look the name up again. */
void fc_inbox_retire(struct fc_qp *qp)
{
    if (!qp->self.in)
        return;
    atomic_store_explicit(&qp->self.in->state, FC_RETIRED, memory_order_release);
    unlink(qp->path);
    fc_map_close(&qp->self);
}

/* Map a peer's inbox; everything later used of its header is checked here, once. */
int fc_map_open(const char *path, struct fc_map *m)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    void *base = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid() &&
        (uint64_t)st.st_size >= inbox_bytes(1) && (uint64_t)st.st_size <= inbox_bytes(FC_MAX_WR))
        base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return -1;
    const struct fc_inbox *in = base;
    uint32_t slots = in->slots;  /* read once: the owner could change it after this check */
    if (in->magic != FC_MAGIC || in->version != FC_VERSION || in->stride != FC_STRIDE || slots < 1 ||
        slots > FC_MAX_WR || inbox_bytes(slots) != (uint64_t)st.st_size) {
        munmap(base, (size_t)st.st_size);
        return -1;
    }
    *m = (struct fc_map){.in = base, .bytes = (size_t)st.st_size, .slots = slots};
    return 0;
}

void fc_map_close(struct fc_map *m)
{
    if (m->in)
        munmap(m->in, m->bytes);
    *m = (struct fc_map){0};
}

struct fc_slot *fc_slot_at(const struct fc_map *m, uint64_t k)
{
    char *base = (char *)m->in;
    return (struct fc_slot *)(void *)(base + FC_HDR_BYTES + (k % m->slots) * FC_STRIDE);
}
