/* The shaped links of the bed on the lent machine (tests/netbed.py): a switch in user space
 * between tap devices, one a host, that holds each frame for a one-way delay and serializes it
 * at a link rate. That machine's kernel has no netem (and no fq for a timestamped delay), and no
 * tc or iptables command for an NFQUEUE rule; a tap and this program need neither.
 *
 *   bedlink MAX_SECONDS FD...
 *
 * Each FD is an open tap (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, made non-blocking) whose device
 * lives in a host's namespace. Standard input takes lines
 *   set DELAY_NS RATE_BPS     (RATE_BPS 0: no rate limit)
 *   stats                     (one line of counters on standard output; lateness since the last)
 * and end of input ends the program, as does MAX_SECONDS.
 *
 * The model: a frame read from port p at `now` occupies p's uplink for its wire time, then the
 * receiving port's downlink (a second sender to the same port waits for it), and reaches its
 * host `delay` after its last bit: due = max(uplink free, downlink free + wire) + delay. Frames
 * of a GSO batch (virtio_net_hdr) are one unit, charged the wire bytes of their segments. A port
 * is read only while its uplink is free, so a busy link leaves frames in the sender's queue,
 * where TCP sees them. Broadcasts (ARP) and frames to a MAC not learned yet go out at once.
 * It polls without sleeping: it owns a core of its own, and a sleep would add its wake-up to
 * the delay. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 8
#define SLOTS 1024
#define SLOT_BYTES (72 * 1024) /* a 64 KiB GSO batch, its Ethernet header and virtio_net_hdr */
#define VNET_HDR 10
#define WIRE_EXTRA 24 /* preamble, inter-frame gap and FCS of one Ethernet frame */

struct frame {
    long long due;
    int len;
    unsigned char *data;
};

struct port {
    int fd;
    unsigned char mac[6];
    int mac_known;
    long long up_free, down_free;
    int queue[SLOTS]; /* slot numbers, in due order */
    size_t head, count;
    unsigned long long frames_in, bytes_in, frames_out, bytes_out;
};

static struct port ports[MAX_PORTS];
static int nports;
static struct frame slots[SLOTS];
static int free_slots[SLOTS];
static int nfree;
static long long delay_ns, rate_bps;
static long long late_max_ns, late_sum_ns;
static unsigned long long late_n, truncated, write_errors, flooded;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Bytes on the wire for one read: every segment of a GSO batch repeats the headers. */
static long long wire_bytes(const unsigned char *buf, int len)
{
    int payload = len - VNET_HDR;
    unsigned gso_type = buf[1];
    unsigned hdr_len = buf[2] | (unsigned)buf[3] << 8;
    unsigned gso_size = buf[4] | (unsigned)buf[5] << 8;
    if (gso_type == 0 || gso_size == 0 || hdr_len >= (unsigned)payload)
        return payload + WIRE_EXTRA;
    long long segs = (payload - hdr_len + gso_size - 1) / gso_size;
    return payload + (segs - 1) * hdr_len + segs * WIRE_EXTRA;
}

static long long wire_ns(long long bytes)
{
    return rate_bps > 0 ? bytes * 8 * 1000000000LL / rate_bps : 0;
}

static int port_of_mac(const unsigned char *mac)
{
    for (int q = 0; q < nports; q++)
        if (ports[q].mac_known && memcmp(ports[q].mac, mac, 6) == 0)
            return q;
    return -1;
}

static void send_frame(int q, const unsigned char *buf, int len)
{
    if (write(ports[q].fd, buf, (size_t)len) != len) {
        write_errors++;
        return;
    }
    ports[q].frames_out++;
    ports[q].bytes_out += (unsigned long long)len;
}

static void flood(int from, const unsigned char *buf, int len)
{
    flooded++;
    for (int q = 0; q < nports; q++)
        if (q != from)
            send_frame(q, buf, len);
}

/* Queue the frame in slot `s`, read from port p at `now`, for the port its MAC belongs to. */
static void route(int p, int s, long long now)
{
    unsigned char *eth = slots[s].data + VNET_HDR;
    struct port *in = &ports[p];
    memcpy(in->mac, eth + 6, 6);
    in->mac_known = 1;
    int q = (eth[0] & 1) ? -1 : port_of_mac(eth);
    if (q < 0 || q == p) {
        flood(p, slots[s].data, slots[s].len);
        free_slots[nfree++] = s;
        return;
    }
    long long wire = wire_ns(wire_bytes(slots[s].data, slots[s].len));
    long long start = in->up_free > now ? in->up_free : now;
    in->up_free = start + wire;
    long long down = ports[q].down_free + wire;
    ports[q].down_free = in->up_free > down ? in->up_free : down;
    slots[s].due = ports[q].down_free + delay_ns;
    struct port *out = &ports[q];
    out->queue[(out->head + out->count) % SLOTS] = s;
    out->count++;
}

/* Read what port p has, while its uplink is free and a slot is left; returns frames read. Each
 * frame's clock is read after its read returns: a loop's clock may be old by a preemption, and
 * a frame stamped with it would be held less than the delay. */
static int take(int p)
{
    int got = 0;
    while (nfree > 0 && ports[p].up_free <= now_ns()) {
        int s = free_slots[nfree - 1];
        ssize_t n = read(ports[p].fd, slots[s].data, SLOT_BYTES);
        if (n <= 0)
            break;
        if (n == SLOT_BYTES || n < VNET_HDR + 14) {
            truncated++;
            continue;
        }
        nfree--;
        slots[s].len = (int)n;
        ports[p].frames_in++;
        ports[p].bytes_in += (unsigned long long)n;
        route(p, s, now_ns());
        got++;
    }
    return got;
}

/* Write the frames of port q that are due; returns frames written. */
static int give(int q, long long now)
{
    struct port *out = &ports[q];
    int sent = 0;
    while (out->count > 0) {
        int s = out->queue[out->head];
        if (slots[s].due > now)
            break;
        long long late = now - slots[s].due;
        late_sum_ns += late;
        late_n++;
        if (late > late_max_ns)
            late_max_ns = late;
        send_frame(q, slots[s].data, slots[s].len);
        free_slots[nfree++] = s;
        out->head = (out->head + 1) % SLOTS;
        out->count--;
        sent++;
    }
    return sent;
}

static void print_stats(void)
{
    printf("stats delay_ns=%lld rate_bps=%lld late_n=%llu late_mean_ns=%lld late_max_ns=%lld "
           "truncated=%llu write_errors=%llu flooded=%llu",
           delay_ns, rate_bps, late_n, late_n ? late_sum_ns / (long long)late_n : 0, late_max_ns,
           truncated, write_errors, flooded);
    for (int p = 0; p < nports; p++)
        printf(" port%d=%llu/%llu/%llu/%llu", p, ports[p].frames_in, ports[p].bytes_in,
               ports[p].frames_out, ports[p].bytes_out);
    printf("\n");
    fflush(stdout);
    late_max_ns = late_sum_ns = 0; /* each report counts lateness since the last */
    late_n = 0;
}

/* One command line from standard input; returns 0 when it ends the program. */
static int command(const char *line)
{
    long long d, r;
    if (sscanf(line, "set %lld %lld", &d, &r) == 2 && d >= 0 && d <= 1000000000LL && r >= 0) {
        delay_ns = d;
        rate_bps = r;
        printf("ok delay_ns=%lld rate_bps=%lld\n", d, r);
        fflush(stdout);
    } else if (strncmp(line, "stats", 5) == 0) {
        print_stats();
    } else {
        fprintf(stderr, "bedlink: unknown command: %s", line);
    }
    return 1;
}

/* Reads what standard input holds (non-blocking); returns 0 at its end. */
static int poll_input(void)
{
    static char line[256];
    static size_t used;
    for (;;) {
        ssize_t n = read(0, line + used, 1);
        if (n == 0)
            return 0;
        if (n < 0)
            return errno == EAGAIN || errno == EINTR;
        if (line[used] == '\n' || used + 2 >= sizeof line) {
            line[used + 1] = '\0';
            used = 0;
            command(line);
        } else {
            used++;
        }
    }
}

static int setup(int argc, char **argv, long long *end)
{
    if (argc < 3 || argc - 2 > MAX_PORTS) {
        fprintf(stderr, "usage: bedlink MAX_SECONDS FD... (2 to %d taps)\n", MAX_PORTS);
        return -1;
    }
    long long seconds = atoll(argv[1]);
    if (seconds <= 0 || seconds > 86400) {
        fprintf(stderr, "bedlink: MAX_SECONDS must be 1..86400, not %s\n", argv[1]);
        return -1;
    }
    *end = now_ns() + seconds * 1000000000LL;
    nports = argc - 2;
    for (int p = 0; p < nports; p++) {
        char *rest;
        long fd = strtol(argv[p + 2], &rest, 10);
        if (*rest != '\0' || fd < 3 || fcntl((int)fd, F_GETFD) < 0) {
            fprintf(stderr, "bedlink: %s is not an open file descriptor\n", argv[p + 2]);
            return -1;
        }
        ports[p].fd = (int)fd;
        fcntl((int)fd, F_SETFL, fcntl((int)fd, F_GETFL) | O_NONBLOCK);
    }
    for (int s = 0; s < SLOTS; s++) {
        slots[s].data = malloc(SLOT_BYTES);
        if (slots[s].data == NULL) {
            fprintf(stderr, "bedlink: out of memory\n");
            return -1;
        }
        free_slots[nfree++] = SLOTS - 1 - s;
    }
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    return 0;
}

int main(int argc, char **argv)
{
    long long end;
    if (setup(argc, argv, &end) != 0)
        return 2;
    printf("ready ports=%d\n", nports);
    fflush(stdout);
    unsigned long spins = 0;
    for (;;) {
        long long now = now_ns();
        for (int q = 0; q < nports; q++)
            give(q, now);
        for (int p = 0; p < nports; p++)
            take(p);
        if ((++spins & 1023) == 0 && (!poll_input() || now > end))
            break;
    }
    print_stats();
    return 0;
}
