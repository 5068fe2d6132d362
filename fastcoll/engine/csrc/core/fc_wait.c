/* How the engine waits: spin, then yield the CPU, then sleep in poll() on every link.
 *
 * A small exchange's reply is usually microseconds away, and a sleep costs a wake-up that the
 * scheduler may delay by much more, so a wait first spins (spin_ns) and then yields between
 * looks (yield_ns: where ranks outnumber cores the peer that owes the reply may be waiting for
 * this very core). Then it sleeps, so that an idle rank costs no CPU. Asleep, it watches every
 * link, as the pure-Python transport does: a peer's timeout notice on another link ends the wait
 * at once, a header that runs ahead there is held for its turn, a loss is noted for later.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1 /* sched_getcpu */
#endif
#include "fc_wait.h"

#include <errno.h>
#include <sched.h>

/* The CPU this thread runs on now, or -1 where that cannot be asked (the portable path). */
static int this_cpu(void)
{
#if defined(__linux__) && !defined(FC_PORTABLE)
    return sched_getcpu();
#else
    return -1;
#endif
}

/* A peer that waits on a link that shares its memory asks which CPU the other side runs on: say
 * it on every link this rank writes to (the kinds that cannot carry it ignore it). */
static int say_cpu(fc_engine *e)
{
    int cpu = this_cpu();
    for (int i = 0; cpu >= 0 && i < e->size * e->channels; i++)
        if (e->chans[i].open)
            fc_link_say_cpu(&e->chans[i].link, cpu);
    return cpu;
}

/* Whether the peer this wait is for last ran on this rank's own CPU: spinning would keep it from
 * running, so the wait yields at once (two ranks that the scheduler put on one core, a third
 * program busy on the other, spun 200 us each way per exchange: bench/NOTES.md, entry 49). */
static fc_chan *peer_here(fc_engine *e, fc_chan *awaited, int cpu)
{
    if (cpu < 0)
        return NULL;
    for (int i = 0; !awaited && i < e->size * e->channels; i++)
        if (e->chans[i].open && e->chans[i].link.out_count)
            awaited = &e->chans[i]; /* a flush waits for the peer that must take its frames */
    return awaited && fc_link_peer_cpu(&awaited->link) == cpu ? awaited : NULL;
}

/* A spin yields the CPU this often, as MPICH's progress loop does: where the ranks outnumber the
 * CPUs without this process knowing it (hosts that share a machine), the peer that owes the reply
 * may be waiting for this very CPU, behind other spinning ranks that each hold it until they
 * yield; where nothing else is runnable the yield returns at once (bench/NOTES.md, entry 66). */
#define SPIN_YIELD_EVERY_NS (1 * 1000LL)

/* A call that moves this much waits for each piece while its peer copies and reduces MiBs, some
 * hundreds of microseconds: it does not spin, since a spin that long holds a CPU that a busy
 * machine's other work needs, the peer's own included (bench/NOTES.md, entry 65). */
#define NO_SPIN_BYTES ((size_t)16 << 20)

/* How long a wait spins: the configured spin_ns, but for a large call. */
static fc_ns spin_of(const fc_engine *e)
{
    return e->call_bytes >= NO_SPIN_BYTES ? 0 : e->spin_ns;
}

/* A large call yields between looks for this long at most, then sleeps: yielding for the
 * configured 5 ms keeps a rank runnable while its peer, beside a busy core, needs that CPU to
 * copy the piece this rank waits for (bench/NOTES.md, entry 69). The Python engine yields only
 * for a small message at all. */
#define LARGE_YIELD_NS (300 * 1000LL)

/* How long a wait yields: none where the last call of this kind idled long_wait_ns or more in
 * one wait. Such a wait is not a reply a few microseconds away but a peer's work (a pipeline's
 * stage), and yielding through it burns a CPU for nothing: pipelined decode in MLX's graph spent
 * half its job's system time so (bench/NOTES.md 80). A call that idles less brings them back. */
static fc_ns yield_of(const fc_engine *e)
{
    if (e->long_wait_ns && e->call_kind >= 0 && (e->long_kinds >> e->call_kind & 1u))
        return 0;
    return e->call_bytes >= NO_SPIN_BYTES && e->yield_ns > LARGE_YIELD_NS ? LARGE_YIELD_NS : e->yield_ns;
}

void fc_engine_call_begin(fc_engine *e, int kind, size_t bytes)
{
    e->call_kind = kind >= 0 && kind < 32 ? kind : -1;
    e->call_bytes = bytes;
    e->call_idle_most = 0;
}

void fc_engine_call_end(fc_engine *e)
{
    if (e->long_wait_ns && e->call_kind >= 0) {
        uint32_t bit = 1u << e->call_kind;
        e->long_kinds = e->call_idle_most >= e->long_wait_ns ? e->long_kinds | bit : e->long_kinds & ~bit;
    }
    e->call_kind = -1;
    e->call_bytes = 0;
}

/* A stretch of `idle` ns in which nothing moved has ended (the call's longest counts, and only
 * where the long-wait rule is on: otherwise nothing reads it). */
static inline void idled(fc_engine *e, fc_ns idle)
{
    if (e->long_wait_ns && idle > e->call_idle_most)
        e->call_idle_most = idle;
}

/* How often at most a wait moves this thread off the CPU it shares with its peer: the kernel pulls
 * it back whenever the CPU it left goes idle, so a rarer move leaves the pair together (NOTES 57). */
#define STEP_ASIDE_EVERY_NS (5 * 1000 * 1000LL)

/* Two ranks that the scheduler put on one CPU stay there while a third program keeps the other
 * busy (moving either would not even out the load), and each exchange then costs two context
 * switches: move this thread to another CPU it may run on, then give back its own CPU mask, so
 * the user's binding is unchanged (bench/NOTES.md, entry 53). Only the higher rank of the pair
 * moves, so that the two do not swap places; a thread bound to one CPU never moves. 1 if it moved. */
static int step_aside(fc_engine *e, fc_chan *peer, int cpu)
{
#if defined(__linux__) && !defined(FC_PORTABLE)
    fc_ns now = fc_now();
    if (spin_of(e) == 0 || fc_chan_peer(e, peer) > e->rank ||
        (e->stepped_aside && now - e->stepped_aside < STEP_ASIDE_EVERY_NS))
        return 0;
    e->stepped_aside = now;
    cpu_set_t mine, elsewhere;
    if (sched_getaffinity(0, sizeof mine, &mine) || !CPU_ISSET(cpu, &mine) || CPU_COUNT(&mine) < 2)
        return 0;
    elsewhere = mine;
    CPU_CLR(cpu, &elsewhere);
    if (sched_setaffinity(0, sizeof elsewhere, &elsewhere))
        return 0;
    (void)sched_setaffinity(0, sizeof mine, &mine);
    return 1;
#else
    (void)e, (void)peer, (void)cpu;
    return 0;
#endif
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("pause");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int fc_engine_push_all(fc_engine *e)
{
    if (atomic_load_explicit(&e->aborted, memory_order_relaxed))
        return 0; /* only the last words go out now (fc_close.c) */
    int moved = 0;
    int n = e->size * e->channels;
    fc_ns now = 0;
    for (int i = 0; i < n; i++) {
        fc_chan *c = &e->chans[i];
        if (c->open && c->link.out_count && fc_link_push(&c->link) > 0) {
            moved = 1;
            c->sent_at = now ? now : (now = fc_now()); /* a send timeout says whether it still moved */
        }
    }
    return moved;
}

/* What another watched link brought while the engine waits on `awaited`: 0 nothing to report
 * now (a header held, a loss or a finalize noted), -1 a peer's timeout notice or a malformed
 * frame (err set). */
static int look(fc_engine *e, fc_chan *c, fc_chan *awaited, fc_err *err)
{
    int peer = fc_chan_peer(e, c);
    int pulled = fc_link_wake(&c->link); /* (where the socket carries only doorbells: take them) */
    if (pulled >= 0)
        pulled = fc_link_pull(&c->link);
    int got = fc_chan_parse(e, c, err);
    if (got < 0)
        return -1;
    if (!got) {
        if (pulled < 0) { /* lost while this rank waits on another: said when next needed */
            c->lost = c->link.recv_errno ? FC_E_CONN : FC_E_CLOSED;
            c->watched = 0;
            e->gave_up[peer] = 1;
        }
        return 0;
    }
    int awaited_peer = awaited ? fc_chan_peer(e, awaited) : -1;
    if (c->header.kind == FC_CLOSE && peer != awaited_peer) {
        e->finalized[peer] = 1; /* an error only for whoever still needs that peer */
        c->watched = 0;
        return 0;
    }
    if (c->header.kind == FC_ABORT && c->header.chunk > 0) { /* its wait ran out: compare waits */
        e->gave_up[peer] = 1;
        fc_err_set(err, FC_E_ABORT, peer);
        err->waiting_for = awaited_peer;
        err->n[0] = c->header.chunk;
        fc_err_text(err, c->header.sig, c->header.sig_len);
        return -1;
    }
    c->held = 1; /* runs ahead: read when its turn comes */
    c->watched = 0;
    return 0;
}

/* Add c to the poll set for `events`. */
static void watch(fc_engine *e, int *n, fc_chan *c, short events)
{
    e->pfd[*n].fd = c->link.fd;
    e->pfd[*n].events = events;
    e->pfd[*n].revents = 0;
    e->pfd_chan[*n] = (int)(c - e->chans);
    (*n)++;
}

/* Whether a whole header (or a bad length prefix) waits in a link's buffer, which poll() would
 * not report: on TCP it came in one read with what went before it. */
static int header_buffered(fc_link *l)
{
    uint32_t announced;
    int64_t body = fc_peek_body_length(l, &announced);
    return body == 0 || (body > 0 && fc_link_have(l) >= FC_PREFIX + (size_t)body);
}

/* The longest sleep the watched links allow, in ms (0: no bound), narrowed by l's. */
static int nap_of(int nap, const fc_link *l)
{
    int k = l->kind->nap_ms;
    return k > 0 && (nap == 0 || k < nap) ? k : nap;
}

/* Build the poll set (*nap: the longest sleep on it its links allow, ms; 0: no bound). 1:
 * something is ready without sleeping (*ready: a watched link with data to look at, or NULL),
 * 0: sleep on the set. */
static int poll_set(fc_engine *e, fc_chan *awaited, int *n, fc_chan **ready, int *nap)
{
    int pushing = !atomic_load_explicit(&e->aborted, memory_order_relaxed);
    *n = 0;
    *ready = NULL;
    *nap = 0;
    for (int i = 0; i < e->size * e->channels; i++) {
        fc_chan *c = &e->chans[i];
        if (!c->open)
            continue;
        short events = 0;
        if (c == awaited || (awaited && c->watched)) { /* (a flush watches its sends alone, as a
                                                            sender thread of the Python engine does) */
            if (!fc_link_may_sleep(&c->link) || (c != awaited && header_buffered(&c->link))) {
                *ready = c == awaited ? NULL : c;
                return 1;
            }
            events |= POLLIN;
        }
        if (pushing && c->link.out_count && !c->link.send_errno) {
            if (!fc_link_wait_room(&c->link))
                return 1; /* room came */
            events |= c->link.kind->room_event;
        }
        if (events) {
            watch(e, n, c, events);
            *nap = nap_of(*nap, &c->link);
        }
    }
    return 0;
}

static int signalled(fc_engine *e, fc_err *err)
{
    if (e->check_signals && e->check_signals(e->signals_ctx)) {
        fc_err_set(err, FC_E_SIGNAL, -1);
        return 1;
    }
    return 0;
}

/* Sleep in poll() until a link may have changed, the deadline, or the next signal check; then
 * look at what woke it. 0, or -1 (err set). */
static int block(fc_engine *e, fc_chan *awaited, fc_ns deadline, fc_ns *checked, fc_err *err)
{
    int n, nap;
    fc_chan *ready;
    if (poll_set(e, awaited, &n, &ready, &nap)) {
        if (ready)
            return look(e, ready, awaited, err);
        if (awaited)
            fc_link_wake(&awaited->link); /* bytes that never complete: is the writer gone? */
        return 0;
    }
    fc_ns now = fc_now();
    fc_ns wait = deadline - now;
    fc_ns until_check = *checked + FC_SIGNAL_CHECK_NS - now;
    if (wait > until_check)
        wait = until_check;
    int ms = wait <= 0 ? 0 : (int)((wait + 999999) / 1000000);
    if (nap && ms > nap)
        ms = nap; /* a link whose arrivals poll() cannot see */
    int r = poll(e->pfd, (nfds_t)n, ms);
    now = fc_now();
    if ((r < 0 && errno == EINTR) || now - *checked >= FC_SIGNAL_CHECK_NS) {
        *checked = now;
        if (signalled(e, err))
            return -1;
    }
    for (int i = 0; r > 0 && i < n; i++) {
        if (!e->pfd[i].revents)
            continue;
        fc_chan *c = &e->chans[e->pfd_chan[i]];
        fc_link_wake(&c->link); /* take the doorbells; note the end of the stream */
        if (c != awaited && c->watched && look(e, c, awaited, err) < 0)
            return -1;
    }
    return 0;
}

int fc_engine_wait(fc_engine *e, fc_step step, void *ctx, fc_chan *awaited, fc_ns deadline, fc_err *err)
{
    fc_ns idle_since = fc_now(), checked = idle_since;
    int cpu = say_cpu(e);
    fc_ns spin = spin_of(e);
    int looked = 0; /* whether the peer's CPU was looked at since this wait began to idle */
    fc_ns yielded = 0; /* when the spin last yielded, counted from idle_since */
    for (;;) {
        int moved = fc_engine_push_all(e);
        int r = step(e, ctx, &moved, err);
        if (r) {
            if (e->long_wait_ns) /* (the clock read only where the rule reads the result) */
                idled(e, fc_now() - idle_since);
            return r > 0 ? 0 : -1;
        }
        int why = atomic_load_explicit(&e->interrupted, memory_order_relaxed);
        if (why) {
            fc_err_set(err, why == FC_INTERRUPT_SHUT ? FC_E_SHUT : FC_E_INTERRUPTED, -1);
            return -1;
        }
        fc_ns now = fc_now();
        if (now >= deadline) /* while data moves too */
            return 1;
        if (moved) {
            idled(e, now - idle_since);
            idle_since = now;
            looked = 0;
            yielded = 0;
            continue;
        }
        fc_ns idle = now - idle_since;
        if (!looked) {
            looked = 1;
            spin = spin_of(e);
            fc_chan *here = peer_here(e, awaited, cpu);
            if (here) {
                spin = 0;
                if (step_aside(e, here, cpu)) {
                    cpu = say_cpu(e);
                    spin = spin_of(e);
                }
            }
        }
        if (idle < spin) {
            if (idle - yielded >= SPIN_YIELD_EVERY_NS) {
                sched_yield(); /* a rank that owes the reply may be waiting for this very CPU */
                yielded = idle;
            } else {
                relax();
            }
        } else if (idle < spin + yield_of(e)) {
            sched_yield();
        } else if (block(e, awaited, deadline, &checked, err) < 0) {
            return -1;
        }
    }
}
