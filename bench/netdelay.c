/* A one-way delay on the bed's data links, since this kernel has no netem: every packet that
 * iptables queues to NFQUEUE 0 is let through DELAY_US microseconds after it was queued, in the
 * order it came. bench/tp_hosts.py compiles it and runs one in each host's namespace beside
 *   iptables-legacy -A OUTPUT -o d0 -j NFQUEUE --queue-num 0 --queue-bypass
 *
 *   netdelay DELAY_US
 *
 * Only the packet's metadata is copied to user space. A packet that finds the queue here full
 * is let through at once (a delay lost, never a packet); --queue-bypass lets packets through
 * when no netdelay runs. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_HELD 65536

struct held {
    uint32_t id;
    long long due;
};

static struct held queue[MAX_HELD];
static size_t head, tail; /* the packets held: queue[head % MAX_HELD] .. queue[(tail - 1) % MAX_HELD] */
static long long delay_ns;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *q, struct nfgenmsg *msg, struct nfq_data *d, void *arg)
{
    (void)msg, (void)arg;
    struct nfqnl_msg_packet_hdr *h = nfq_get_msg_packet_hdr(d);
    if (h == NULL)
        return 0;
    uint32_t id = ntohl(h->packet_id);
    if (tail - head >= MAX_HELD)
        return nfq_set_verdict(q, id, NF_ACCEPT, 0, NULL);
    queue[tail % MAX_HELD] = (struct held){id, now_ns() + delay_ns};
    tail++;
    return 0;
}

/* Let through every held packet whose time has come. */
static void release_due(struct nfq_q_handle *q)
{
    long long t = now_ns();
    while (head < tail && queue[head % MAX_HELD].due <= t) {
        nfq_set_verdict(q, queue[head % MAX_HELD].id, NF_ACCEPT, 0, NULL);
        head++;
    }
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long long us = argc == 2 ? strtoll(argv[1], &end, 10) : -1;
    if (argc != 2 || *end != '\0' || us < 0 || us > 10 * 1000 * 1000) {
        fprintf(stderr, "usage: netdelay DELAY_US (0 to 10000000)\n");
        return 2;
    }
    delay_ns = us * 1000LL;
    prctl(PR_SET_TIMERSLACK, 1UL); /* wake within a microsecond of the due time, not 50 */
    struct nfq_handle *h = nfq_open();
    struct nfq_q_handle *q = h ? nfq_create_queue(h, 0, on_packet, NULL) : NULL;
    if (q == NULL || nfq_set_mode(q, NFQNL_COPY_META, 0) < 0) {
        perror("netdelay: cannot take NFQUEUE 0");
        return 1;
    }
    nfq_set_queue_maxlen(q, 16384);
    int fd = nfq_fd(h);
    static char buf[1 << 16];
    fprintf(stderr, "netdelay: %lld us\n", us);
    for (;;) {
        struct timespec wait, *timeout = NULL;
        if (head < tail) {
            long long left = queue[head % MAX_HELD].due - now_ns();
            left = left < 0 ? 0 : left;
            wait = (struct timespec){left / 1000000000LL, left % 1000000000LL};
            timeout = &wait;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (ppoll(&p, 1, timeout, NULL) < 0 && errno != EINTR) {
            perror("netdelay: ppoll");
            return 1;
        }
        ssize_t n;
        while ((n = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
            nfq_handle_packet(h, buf, (int)n);
        release_due(q);
    }
}
