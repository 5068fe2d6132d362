/* Trading queue-pair addresses with the peer over the link's TCP socket: the job's connection to
 * that rank, already authenticated, so that only the rank this link is for can attach to its
 * queue pair. One fixed-size, versioned message each way, every field checked against its bounds,
 * then a "ready" each way once both queue pairs can receive. Each side writes before it reads, so
 * ranks that open their links in ascending (peer, channel) order never wait on each other in a
 * circle; every wait ends at the setup's deadline. */
#include "fc_verbs.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#else
#define SEND_FLAGS MSG_DONTWAIT /* macOS: Python ignores SIGPIPE, and EPIPE is still reported */
#endif

#define SETUP_BYTES 64
#define READY_BYTES 8
#define VERSION 1

static const uint8_t SETUP_MAGIC[4] = {'F', 'C', 'V', 'S'};
static const uint8_t READY_MAGIC[4] = {'F', 'C', 'V', 'R'};

static void pack(uint8_t m[SETUP_BYTES], const fc_verbs_addr *a)
{
    memset(m, 0, SETUP_BYTES);
    memcpy(m, SETUP_MAGIC, 4);
    m[4] = VERSION;
    m[6] = a->reliable ? 1 : 0;
    fc_put32(m + 8, a->qpn);
    fc_put32(m + 12, a->psn);
    m[16] = (uint8_t)a->lid, m[17] = (uint8_t)(a->lid >> 8);
    m[18] = a->mtu;
    m[19] = a->has_gid;
    memcpy(m + 20, a->gid, 16);
    fc_put32(m + 36, a->slots);
    fc_put32(m + 40, a->slot_bytes);
}

static int zeros(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* The peer's message into *a, every field within its bounds. 0, or -1 with why. */
static int unpack(const uint8_t m[SETUP_BYTES], int reliable, fc_verbs_addr *a, char *why, size_t why_len)
{
    const char *bad = NULL;
    memset(a, 0, sizeof *a);
    a->qpn = fc_get32(m + 8), a->psn = fc_get32(m + 12);
    a->lid = (uint16_t)(m[16] | m[17] << 8);
    a->mtu = m[18], a->has_gid = m[19];
    memcpy(a->gid, m + 20, 16);
    a->slots = fc_get32(m + 36), a->slot_bytes = fc_get32(m + 40);
    a->reliable = m[6];
    if (memcmp(m, SETUP_MAGIC, 4) != 0)
        bad = "its answer is not an RDMA setup message (is its link of another kind?)";
    else if (m[4] != VERSION || m[5] != 0)
        bad = "it speaks another version of the RDMA setup";
    else if (m[6] > 1 || m[7] || !zeros(m + 44, SETUP_BYTES - 44))
        bad = "its setup message has fields this version does not know";
    else if (a->reliable != (reliable != 0))
        bad = reliable ? "it asked for unreliable-connected queue pairs, this side for reliable-connected ones"
                       : "it asked for reliable-connected queue pairs, this side for unreliable-connected ones";
    else if (a->qpn == 0 || a->qpn > 0xffffffu || a->psn > 0xffffffu)
        bad = "its queue pair number or packet sequence number is out of range";
    else if (a->mtu < IBV_MTU_256 || a->mtu > IBV_MTU_4096 || a->has_gid > 1 || (!a->has_gid && !a->lid))
        bad = "its MTU or address is out of range";
    else if (a->slots < FC_VERBS_MIN_SLOTS || a->slots > FC_VERBS_MAX_SLOTS ||
             a->slot_bytes < FC_VERBS_MIN_SLOT_BYTES || a->slot_bytes > FC_VERBS_MAX_SLOT_BYTES)
        bad = "its receive slots are out of bounds";
    if (bad)
        snprintf(why, why_len, "the peer's RDMA setup was refused: %s", bad);
    return bad ? -1 : 0;
}

/* Until fd is ready for `events` or the deadline: 1 ready, 0 timed out, -1 failed. */
static int wait_fd(int fd, short events, fc_ns deadline)
{
    for (;;) {
        fc_ns left = deadline - fc_now();
        if (left <= 0)
            return 0;
        int ms = left > 3600 * FC_NS_PER_S ? 3600 * 1000 : (int)((left + 999999) / 1000000);
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static int write_all(int fd, const uint8_t *buf, size_t n, fc_ns deadline, char *why, size_t why_len)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = send(fd, buf + done, n - done, SEND_FLAGS);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        int w = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? wait_fd(fd, POLLOUT, deadline)
                                                                                       : -1;
        if (w <= 0) {
            snprintf(why, why_len, "could not send the RDMA setup to the peer (%s)",
                     w == 0 ? "its connection took nothing before the setup timeout" : strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int read_all(int fd, uint8_t *buf, size_t n, fc_ns deadline, double secs, char *why, size_t why_len)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = recv(fd, buf + done, n - done, MSG_DONTWAIT);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        int w = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? wait_fd(fd, POLLIN, deadline)
                                                                                       : -1;
        if (k == 0)
            snprintf(why, why_len, "the peer closed its connection during the RDMA setup");
        else if (w == 0)
            snprintf(why, why_len, "the peer sent no RDMA setup within %.1f s (does it open an RDMA link too?)",
                     secs);
        else if (w < 0)
            snprintf(why, why_len, "the connection failed during the RDMA setup (%s)", strerror(errno));
        if (k == 0 || w <= 0)
            return -1;
    }
    return 0;
}

int fc_verbs_exchange(int fd, const fc_verbs_addr *mine, fc_verbs_addr *peer, fc_ns deadline, double secs,
                      char *why, size_t why_len)
{
    uint8_t m[SETUP_BYTES];
    pack(m, mine);
    if (write_all(fd, m, sizeof m, deadline, why, why_len) ||
        read_all(fd, m, sizeof m, deadline, secs, why, why_len))
        return -1;
    return unpack(m, mine->reliable, peer, why, why_len);
}

int fc_verbs_ready(int fd, fc_ns deadline, double secs, char *why, size_t why_len)
{
    uint8_t m[READY_BYTES] = {0};
    memcpy(m, READY_MAGIC, 4);
    m[4] = VERSION;
    if (write_all(fd, m, sizeof m, deadline, why, why_len) ||
        read_all(fd, m, sizeof m, deadline, secs, why, why_len))
        return -1;
    if (memcmp(m, READY_MAGIC, 4) != 0 || m[4] != VERSION || !zeros(m + 5, 3)) {
        snprintf(why, why_len, "the peer's RDMA setup was refused: its ready message is malformed");
        return -1;
    }
    return 0;
}
