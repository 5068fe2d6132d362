/* Two processes (this one and a child it forks) talk through the fabric, each loading it with
 * dlopen/dlsym, exchanging QP numbers and GIDs over a socketpair and bringing their queue pairs
 * up as JACCL does. Usage: pingpong [--rc] [--keep] MODE ARGS, where MODE is
 *   ping ITERS SIZE...    both ways, every size ITERS times: bytes, lengths, imm checked
 *   stream COUNT SIZE MS  A sends COUNT messages; B prints the sequence numbers it got in MS
 *   noreceive             A sends 1 before B posts a receive, 2 after: B prints what it got
 *   kill                  B posts receives and dies; A sends to it and prints its completions
 *   lenerr                A sends 128 bytes into B's 64-byte receive: B prints its completion
 * --keep leaves every object open at exit (for FCFAB_REPORT); --rc uses RC queue pairs. */
#include "pp_verbs.h"

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static struct verbs V;
static struct pp_end E;
static int sock, side; /* side 0: A, the parent; 1: B, the child */
static pid_t child;

static void xio(void *p, size_t n, int out)
{
    for (size_t done = 0; done < n;) {
        ssize_t r = out ? write(sock, (char *)p + done, n - done) : read(sock, (char *)p + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        PP_CHECK(r > 0, "socket %s: %s", out ? "write" : "read", r ? strerror(errno) : "closed");
        done += (size_t)r;
    }
}

/* Both sides reach the same point. */
static void meet(char tag)
{
    char got = 0;
    xio(&tag, 1, 1);
    xio(&got, 1, 0);
    PP_CHECK(got == tag, "out of step: %c against %c", got, tag);
}

static unsigned char pattern(uint64_t seq, uint32_t i)
{
    return (unsigned char)((seq * 31u + i) & 0xff);
}

static void fill(uint32_t off, uint64_t seq, uint32_t len)
{
    memcpy(E.buf + off, &seq, sizeof seq);
    for (uint32_t i = sizeof seq; i < len; i++)
        E.buf[off + i] = (char)pattern(seq, i);
}

/* The sequence number of the message at `off`, its bytes checked. */
static uint64_t check(uint32_t off, uint32_t len)
{
    uint64_t seq;
    PP_CHECK(len >= sizeof seq, "message of %u bytes", len);
    memcpy(&seq, E.buf + off, sizeof seq);
    for (uint32_t i = sizeof seq; i < len; i++)
        PP_CHECK((unsigned char)E.buf[off + i] == pattern(seq, i), "message %llu: byte %u wrong",
                 (unsigned long long)seq, i);
    return seq;
}

static const char *status_name(int s)
{
    static char other[32];
    if (s == IBV_WC_SUCCESS) return "SUCCESS";
    if (s == IBV_WC_LOC_LEN_ERR) return "LOC_LEN_ERR";
    if (s == IBV_WC_LOC_PROT_ERR) return "LOC_PROT_ERR";
    if (s == IBV_WC_WR_FLUSH_ERR) return "WR_FLUSH_ERR";
    snprintf(other, sizeof other, "status%d", s);
    return other;
}

/* Wait for one send and one receive completion (any order); the receive's is returned. */
static struct ibv_wc send_and_recv(void)
{
    struct ibv_wc wc, rwc = {0};
    for (int sends = 0, recvs = 0; sends < 1 || recvs < 1;) {
        PP_CHECK(pp_poll(&E, &wc, 5000), "no completion in 5 s");
        PP_CHECK(wc.status == IBV_WC_SUCCESS, "completion %s", status_name(wc.status));
        if (wc.opcode == IBV_WC_SEND) {
            sends++;
        } else {
            rwc = wc;
            recvs++;
        }
    }
    return rwc;
}

static void ping_one(uint64_t seq, uint32_t size)
{
    int imm = (int)(seq & 1);
    struct ibv_wc wc;
    if (side == 0) {
        fill(PP_HALF, seq, size);
        PP_CHECK(pp_post_send(&E, seq, PP_HALF, size, imm, (uint32_t)seq) == 0, "send");
        wc = send_and_recv();
    } else {
        PP_CHECK(pp_poll(&E, &wc, 5000) && wc.status == IBV_WC_SUCCESS, "no receive of %llu",
                 (unsigned long long)seq);
    }
    PP_CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == size && wc.qp_num == E.me.qpn, "receive: op %d len %u",
             wc.opcode, wc.byte_len);
    PP_CHECK(check(0, size) == seq, "message out of order at %llu", (unsigned long long)seq);
    PP_CHECK(!!(wc.wc_flags & IBV_WC_WITH_IMM) == imm && (!imm || ntohl(wc.imm_data) == seq), "imm");
    PP_CHECK(pp_post_recv(&E, seq + 1, 0, PP_HALF) == 0, "post_recv");
    if (side == 1) {
        memcpy(E.buf + PP_HALF, E.buf, size);  /* echo */
        PP_CHECK(pp_post_send(&E, seq, PP_HALF, size, imm, (uint32_t)seq) == 0, "send");
        PP_CHECK(pp_poll(&E, &wc, 5000) && wc.opcode == IBV_WC_SEND && wc.status == IBV_WC_SUCCESS, "echo");
    }
}

static void ping(int argc, char **argv)
{
    PP_CHECK(argc >= 2, "ping ITERS SIZE...");
    int iters = atoi(argv[0]);
    uint64_t seq = 0;
    PP_CHECK(pp_post_recv(&E, 0, 0, PP_HALF) == 0, "post_recv");
    meet('p');
    for (int s = 1; s < argc; s++)
        for (int i = 0; i < iters; i++)
            ping_one(++seq, (uint32_t)atoi(argv[s]));
    printf("%c: ping ok %llu\n", 'A' + side, (unsigned long long)seq);
}

/* B: every message that lands within `ms` after A is done, in order, with the earliest arrival. */
static void collect(unsigned ms, uint32_t slot, uint64_t t0)
{
    struct ibv_wc wc;
    uint64_t end = pp_now_us() + (uint64_t)ms * 1000u, first = 0;
    printf("B: got");
    while (pp_now_us() < end)
        if (pp_poll(&E, &wc, 10)) {
            uint64_t at = pp_now_us();
            PP_CHECK(wc.status == IBV_WC_SUCCESS, "receive %s", status_name(wc.status));
            printf(" %llu", (unsigned long long)check((uint32_t)wc.wr_id * slot, wc.byte_len));
            first = first ? first : at;
        }
    printf("\nB: first_us %llu\n", (unsigned long long)(first ? first - t0 : 0));
}

static void stream(int argc, char **argv)
{
    PP_CHECK(argc == 3, "stream COUNT SIZE MS");
    uint32_t count = (uint32_t)atoi(argv[0]), size = (uint32_t)atoi(argv[1]), slot = PP_HALF / 64;
    PP_CHECK(count >= 1 && count + 4 <= 64 && size >= 8 && size <= slot, "stream: bad COUNT or SIZE");
    uint64_t t0 = 0;
    for (uint32_t i = 0; side == 1 && i < count + 4; i++)
        PP_CHECK(pp_post_recv(&E, i, i * slot, slot) == 0, "post_recv");
    meet('r');
    if (side == 0) {
        struct ibv_wc wc;
        t0 = pp_now_us();
        for (uint32_t i = 1; i <= count; i++) {
            fill(PP_HALF + i * size, i, size);
            PP_CHECK(pp_post_send(&E, i, PP_HALF + i * size, size, 0, 0) == 0, "send %u", i);
            PP_CHECK(pp_poll(&E, &wc, 5000) && wc.status == IBV_WC_SUCCESS, "send completion %u", i);
        }
        printf("A: sent %u\n", count);
    }
    xio(&t0, sizeof t0, side == 0);
    if (side == 1)
        collect((unsigned)atoi(argv[2]), slot, t0);
    meet('z');
}

/* A send with no receive posted on the peer is dropped (UC); one sent after it posts lands. */
static void noreceive(void)
{
    struct ibv_wc wc;
    meet('r');
    for (uint64_t seq = 1; seq <= 2; seq++) {
        if (side == 0) {
            fill(PP_HALF, seq, 64);
            PP_CHECK(pp_post_send(&E, seq, PP_HALF, 64, 0, 0) == 0, "send");
            PP_CHECK(pp_poll(&E, &wc, 5000) && wc.status == IBV_WC_SUCCESS, "send completion");
        }
        meet('s');
        if (side == 1 && seq == 1)
            PP_CHECK(pp_post_recv(&E, 0, 0, 4096) == 0, "post_recv");
        meet('p');
    }
    if (side == 1)
        collect(300, 0, pp_now_us());
    meet('z');
}

/* A sends to a peer that died: every completion is a success and nothing else comes. */
static void kill_peer(void)
{
    struct ibv_wc wc;
    int ok = 0, errors = 0, extra = 0, status;
    for (int i = 0; side == 1 && i < 4; i++)
        PP_CHECK(pp_post_recv(&E, (uint64_t)i, (uint32_t)i * 4096, 4096) == 0, "post_recv");
    meet('r');
    if (side == 1)
        raise(SIGKILL);
    PP_CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status), "B did not die");
    child = 0;
    for (uint64_t seq = 1; seq <= 8; seq++) {
        fill(PP_HALF, seq, 256);
        PP_CHECK(pp_post_send(&E, seq, PP_HALF, 256, 0, 0) == 0, "send");
        PP_CHECK(pp_poll(&E, &wc, 5000), "no send completion");
        if (wc.status == IBV_WC_SUCCESS)
            ok++;
        else
            errors++;
    }
    while (pp_poll(&E, &wc, 300))
        extra++;
    printf("A: sends 8 success %d errors %d extra %d\n", ok, errors, extra);
}

static void lenerr(void)
{
    struct ibv_wc wc;
    if (side == 1)
        PP_CHECK(pp_post_recv(&E, 1, 0, 64) == 0, "post_recv");
    meet('r');
    if (side == 0) {
        fill(PP_HALF, 1, 128);
        PP_CHECK(pp_post_send(&E, 1, PP_HALF, 128, 0, 0) == 0, "send");
    }
    PP_CHECK(pp_poll(&E, &wc, 5000), "no completion");
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    PP_CHECK(V.query_qp(E.qp, &qa, IBV_QP_STATE, &qi) == 0, "query_qp");
    printf("%c: %s %s state %d\n", 'A' + side, side ? "recv" : "send", status_name(wc.status), qa.qp_state);
    meet('z');
}

static void run(const char *mode, int argc, char **argv)
{
    if (strcmp(mode, "ping") == 0)
        ping(argc, argv);
    else if (strcmp(mode, "stream") == 0)
        stream(argc, argv);
    else if (strcmp(mode, "noreceive") == 0)
        noreceive();
    else if (strcmp(mode, "kill") == 0)
        kill_peer();
    else if (strcmp(mode, "lenerr") == 0)
        lenerr();
    else
        PP_CHECK(0, "unknown mode %s", mode);
}

int main(int argc, char **argv)
{
    int rc = 0, keep = 0, fds[2], status;
    for (; argc > 1 && strncmp(argv[1], "--", 2) == 0; argc--, argv++) {
        PP_CHECK(strcmp(argv[1], "--rc") == 0 || strcmp(argv[1], "--keep") == 0, "unknown %s", argv[1]);
        *(strcmp(argv[1], "--rc") == 0 ? &rc : &keep) = 1;
    }
    PP_CHECK(argc >= 2, "usage: pingpong [--rc] [--keep] MODE ARGS");
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);  /* a bound on everything, in both processes */
    PP_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair");
    PP_CHECK((child = fork()) >= 0, "fork");
    side = child == 0;
    sock = fds[side];
    close(fds[!side]);
#ifdef __linux__
    if (side == 1)
        prctl(PR_SET_PDEATHSIG, SIGKILL);  /* never outlive A */
#endif
    pp_load(&V);
    pp_setup(&V, &E, side ? "fcfab1" : "fcfab0", rc ? IBV_QPT_RC : IBV_QPT_UC, 32, 256);
    struct pp_dest peer;
    xio(&E.me, sizeof E.me, 1);  /* a few bytes: the socket holds both sides' at once */
    xio(&peer, sizeof peer, 0);
    pp_connect(&V, &E, &peer);
    run(argv[1], argc - 2, argv + 2);
    if (!keep)
        pp_teardown(&V, &E);
    if (side == 1 || child == 0)
        return 0;
    PP_CHECK(waitpid(child, &status, 0) == child, "waitpid");
    PP_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "B failed (status %d)", status);
    return 0;
}
