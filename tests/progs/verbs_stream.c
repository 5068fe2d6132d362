/* tests/test_verbs_link.py's stream: the verbs link on its own (no engine), two processes, each
 * streaming 3 MiB to the other through a verbs link on the test fabric, with the manners that
 * starve a link of credits: both sides send before either reads, so each fills the other's slots
 * and stops; side 0 takes side 1's bytes a frame at a time while side 1 makes no call on its
 * link, so the credits side 0 owes cannot all go as messages (it spent its last credit on the
 * first); then side 1 sends the rest while side 0 makes no call (as an engine that took a peer's
 * bytes and then waits on a third rank): side 1 finishes only if those credits came over the
 * socket. Then both take everything, every byte checked. Prints "side S: ok, N credit messages
 * over the socket" per side.
 *
 *     verbs_stream LIBRARY
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "links/fc_link.h"
#include "links/verbs/fc_verbs.h"

extern const fc_link_kind fc_link_verbs;

#define BYTES (3u << 20) /* 49 slots: 31 fill the other side, the other 18 fit once it has read them */
#define FRAME (64u << 10)
#define FRAMES (BYTES / FRAME)
#define HEAD 8

typedef struct side {
    int me;
    fc_link l;
    uint8_t *out, *in;
    size_t got;      /* bytes of the other side's stream taken */
    fc_ns deadline;
} side;

static uint8_t byte_of(int from, size_t i)
{
    return (uint8_t)(i * 7 + (i >> 16) + (unsigned)from * 101);
}

static void fail(side *s, const char *what)
{
    const fc_verbs *v = s->l.state;
    printf("side %d: %s (sent all: %s, taken %zu of %u; credits %u, %llu credit messages over the socket; link: "
           "%s)\n", s->me, what, s->l.out_count ? "no" : "yes", s->got, FRAMES * (FRAME + HEAD), v ? v->credits : 0,
           v ? (unsigned long long)v->sock_credits : 0ULL, s->l.why);
    exit(1);
}

static void check_time(side *s, const char *phase)
{
    if (fc_now() > s->deadline)
        fail(s, phase);
}

/* Push what the link takes; a failed push fails the run. */
static void push(side *s)
{
    if (s->l.out_count && fc_link_push(&s->l) < 0)
        fail(s, "a push failed");
}

/* Take what has arrived of the other side's stream, at most one frame's worth a call (as the
 * engine takes a header, then a payload), checking every byte. */
static int take_some(side *s)
{
    size_t total = (size_t)FRAMES * (FRAME + HEAD);
    if (fc_link_pull(&s->l) < 0 && !fc_link_have(&s->l))
        fail(s, "the stream ended");
    size_t have = fc_link_have(&s->l), want = total - s->got;
    size_t n = have < want ? have : want;
    if (n > FRAME)
        n = FRAME;
    if (!n)
        return 0;
    fc_link_take(&s->l, s->in + s->got, n);
    s->got += n;
    return 1;
}

/* Until `done`: push, take if asked, and sleep in poll() as the engine does when nothing moves. */
static void run_until(side *s, int taking, int (*done)(side *), const char *phase)
{
    while (!done(s)) {
        check_time(s, phase);
        push(s);
        if (taking && take_some(s))
            continue;
        if (s->l.out_count && !fc_link_wait_room(&s->l))
            continue;
        if (taking && !fc_link_may_sleep(&s->l))
            continue;
        struct pollfd p = {s->l.fd, POLLIN, 0};
        if (poll(&p, 1, 1) > 0 && fc_link_wake(&s->l) < 0)
            fail(s, "the peer's socket ended");
    }
}

static int all_sent(side *s)
{
    return s->l.out_count == 0;
}

static int all_taken(side *s)
{
    return s->got == (size_t)FRAMES * (FRAME + HEAD);
}

static int both(side *s)
{
    return all_sent(s) && all_taken(s);
}

static void open_side(side *s, int fd, const char *lib)
{
    fc_link_params p;
    memset(&p, 0, sizeof p);
    p.fd = fd, p.library = lib, p.device = s->me ? "fcfab1" : "fcfab0", p.setup_ns = 10 * FC_NS_PER_S;
    char why[256] = "";
    if (fc_link_open(&s->l, &fc_link_verbs, &p, why, sizeof why)) {
        printf("side %d: open failed: %s\n", s->me, why);
        exit(1);
    }
    s->out = malloc((size_t)FRAMES * FRAME);
    s->in = malloc((size_t)FRAMES * (FRAME + HEAD));
    if (!s->out || !s->in)
        fail(s, "out of memory");
    for (size_t i = 0; i < (size_t)FRAMES * FRAME; i++)
        s->out[i] = byte_of(s->me, i);
    for (uint32_t k = 0; k < FRAMES; k++) {
        uint8_t head[HEAD];
        fc_put32(head, k);
        fc_put32(head + 4, (uint32_t)s->me);
        fc_link_queue(&s->l, head, HEAD, s->out + (size_t)k * FRAME, FRAME);
    }
}

static void verify(side *s)
{
    int from = 1 - s->me;
    for (uint32_t k = 0; k < FRAMES; k++) {
        const uint8_t *f = s->in + (size_t)k * (FRAME + HEAD);
        if (fc_get32(f) != k || fc_get32(f + 4) != (uint32_t)from)
            fail(s, "a frame's header is wrong");
        for (size_t j = 0; j < FRAME; j++)
            if (f[HEAD + j] != byte_of(from, (size_t)k * FRAME + j))
                fail(s, "a byte is wrong");
    }
}

/* Write one byte to the other side and wait for its byte: both have finished a step. */
static void meet(side *s, int sync)
{
    char b = 1;
    if (write(sync, &b, 1) != 1 || read(sync, &b, 1) != 1)
        fail(s, "the other side is gone");
}

/* Until nothing has moved for 100 ms: push (and take, if `taking`). */
static void until_still(side *s, int taking)
{
    fc_ns still = fc_now();
    while (fc_now() - still < 100 * 1000000LL) {
        check_time(s, "filling");
        size_t before = s->l.out_count ? fc_link_frame(&s->l, 0)->done : 0, count = s->l.out_count;
        push(s);
        int moved = (taking && take_some(s)) || s->l.out_count != count ||
                    (count && fc_link_frame(&s->l, 0)->done != before);
        if (moved)
            still = fc_now();
    }
}

static void run(side *s, int sync)
{
    until_still(s, 0); /* both: send until the other's slots are full */
    meet(s, sync);
    if (s->me == 0)
        until_still(s, 1); /* take all side 1 sent, a frame at a time; side 1 makes no call */
    meet(s, sync);
    if (s->me == 1) /* side 0 makes no call now: the credits it owes came over the socket */
        run_until(s, 0, all_sent, "sending the rest while the other side makes no call");
    meet(s, sync);
    run_until(s, 1, both, "taking");
    verify(s);
    meet(s, sync); /* (neither closes before the other has taken everything) */
    printf("side %d: ok, %llu credit messages over the socket\n", s->me,
           (unsigned long long)((fc_verbs *)s->l.state)->sock_credits);
    fflush(stdout);
    fc_link_close(&s->l);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: verbs_stream LIBRARY\n");
        return 2;
    }
    int link[2], sync[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, link) || socketpair(AF_UNIX, SOCK_STREAM, 0, sync))
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    side s;
    memset(&s, 0, sizeof s);
    s.me = pid == 0;
    s.deadline = fc_now() + 20 * FC_NS_PER_S;
    close(link[s.me ? 0 : 1]);
    close(sync[s.me ? 0 : 1]);
    open_side(&s, link[s.me], argv[1]);
    run(&s, sync[s.me]);
    free(s.out);
    free(s.in);
    if (s.me)
        return 0;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
