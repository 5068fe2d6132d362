/* The fence gate's host half: arrival, exchange, release (see fc_gate.h). */
#include "fc_gate.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long the arrival poll spins before it naps (the GPU usually arrives within the time a
 * layer's kernels take), and the longest nap. Neither holds the GIL. */
#define ARRIVAL_SPIN_NS (2 * 1000 * 1000LL)
#define ARRIVAL_MAX_NAP_NS (100 * 1000LL)
/* When profiling: how long to wait for the spinning kernel's acknowledgement of a release. */
#define ACK_WAIT_NS (10 * 1000 * 1000LL)

static _Atomic uint32_t *word(fc_gate *g, size_t index)
{
    return (_Atomic uint32_t *)(void *)(g->page + 4 * index);
}

static int reached(uint32_t word_value, uint32_t seq)
{
    return (int32_t)(word_value - seq) >= 0; /* wrap-aware, as the kernels compare */
}

int fc_gate_init(fc_gate *g, uint8_t *page, const fc_gate_layout *l, uint32_t start_seq, int profile)
{
    memset(g, 0, sizeof *g);
    g->page = page;
    g->l = *l;
    g->released = g->submitted = start_seq - 1;
    g->status = l->ok;
    g->spin_ns = ARRIVAL_SPIN_NS;
    g->max_nap_ns = ARRIVAL_MAX_NAP_NS;
    g->profile = profile;
    return pthread_mutex_init(&g->lock, NULL) ? -1 : 0;
}

void fc_gate_free(fc_gate *g)
{
    pthread_mutex_destroy(&g->lock);
    free(g->timings);
    g->timings = NULL;
}

static void release_locked(fc_gate *g, uint32_t seq, uint32_t status)
{
    if (status != g->l.ok && g->status == g->l.ok)
        g->status = status;
    if ((int32_t)(seq - g->released) < 0)
        seq = g->released;
    atomic_store_explicit(word(g, g->l.status), g->status, memory_order_release);
    atomic_store_explicit(word(g, g->l.release), seq, memory_order_release);
    g->released = seq;
}

void fc_gate_release(fc_gate *g, uint32_t seq, uint32_t status)
{
    pthread_mutex_lock(&g->lock);
    release_locked(g, seq, status);
    pthread_mutex_unlock(&g->lock);
}

void fc_gate_release_submitted(fc_gate *g, uint32_t status)
{
    pthread_mutex_lock(&g->lock);
    release_locked(g, g->submitted, status);
    pthread_mutex_unlock(&g->lock);
}

void fc_gate_submitted(fc_gate *g, uint32_t seq)
{
    pthread_mutex_lock(&g->lock);
    if ((int32_t)(seq - g->submitted) > 0)
        g->submitted = seq;
    pthread_mutex_unlock(&g->lock);
}

static void nap(fc_ns ns)
{
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

/* Until ARRIVAL reaches seq: 0, or -1 once the gate is stopped (closed). */
static int await_arrival(fc_gate *g, uint32_t seq)
{
    fc_ns start = fc_now(), nap_ns = 1000;
    for (;;) {
        if (reached(atomic_load_explicit(word(g, g->l.arrival), memory_order_acquire), seq))
            return 0;
        if (atomic_load_explicit(&g->stop, memory_order_relaxed))
            return -1;
        if (fc_now() - start < g->spin_ns) {
            sched_yield();
            continue;
        }
        nap(nap_ns);
        nap_ns = nap_ns * 2 < g->max_nap_ns ? nap_ns * 2 : g->max_nap_ns;
    }
}

static void record(fc_gate *g, const fc_gate_timing *t)
{
    pthread_mutex_lock(&g->lock);
    if (g->timing_count == g->timing_cap) {
        size_t cap = g->timing_cap ? 2 * g->timing_cap : 64;
        fc_gate_timing *more = realloc(g->timings, cap * sizeof *more);
        if (!more) {
            pthread_mutex_unlock(&g->lock);
            return; /* a profile record is not worth failing a gate for */
        }
        g->timings = more;
        g->timing_cap = cap;
    }
    g->timings[g->timing_count++] = *t;
    pthread_mutex_unlock(&g->lock);
}

/* When profiling: how long the spinning kernel took to acknowledge release `seq` (us), -1 if it
 * did not within ACK_WAIT_NS. */
static double acknowledged(fc_gate *g, uint32_t seq, fc_ns stored)
{
    while (!reached(atomic_load_explicit(word(g, g->l.ack), memory_order_acquire), seq)) {
        if (fc_now() - stored > ACK_WAIT_NS)
            return -1;
    }
    return (double)(fc_now() - stored) / 1e3;
}

int fc_gate_serve(fc_gate *g, fc_call *c, fc_op *exchange, uint32_t seq, size_t nbytes, double limit_s)
{
    fc_ns t0 = fc_now();
    if (atomic_load_explicit(word(g, g->l.spin_failed), memory_order_acquire)) {
        fc_err_set(c->err, FC_E_GATE_SPIN, -1); /* a spin hit its bound: Python says which */
        return -1;
    }
    if (await_arrival(g, seq)) {
        fc_err_set(c->err, FC_E_GATE_CLOSED, -1);
        c->err->n[0] = seq;
        return -1;
    }
    uint32_t arrived = atomic_load_explicit(word(g, g->l.arrival), memory_order_acquire);
    if (arrived != seq) {
        fc_err_set(c->err, FC_E_GATE_PROTOCOL, -1);
        c->err->n[0] = seq;
        c->err->n[1] = arrived;
        return -1;
    }
    fc_ns t_arrived = fc_now();
    /* the host only moves bytes: every rank's x into the receive mailbox, in rank order */
    if (nbytes)
        memcpy(exchange->dst + (size_t)c->rank * nbytes, g->page + g->l.send_offset, nbytes);
    c->deadline = fc_deadline_in(limit_s); /* the wait on peers starts now, not at issue */
    if (fc_run(c, exchange))
        return -1;
    fc_ns t_exchanged = fc_now();
    fc_gate_release(g, seq, g->l.ok);
    if (g->profile) {
        fc_ns stored = fc_now();
        fc_gate_timing t = {seq, (double)(t_arrived - t0) / 1e3, (double)(t_exchanged - t_arrived) / 1e3,
                            (double)(stored - t_arrived) / 1e3, acknowledged(g, seq, stored), 0};
        t.spin_iters = atomic_load_explicit(word(g, g->l.spin_iters), memory_order_acquire);
        record(g, &t);
    }
    return 0;
}

size_t fc_gate_take_timings(fc_gate *g, fc_gate_timing *out, size_t cap)
{
    pthread_mutex_lock(&g->lock);
    size_t n = g->timing_count < cap ? g->timing_count : cap;
    if (n) {
        memcpy(out, g->timings, n * sizeof *out);
        memmove(g->timings, g->timings + n, (g->timing_count - n) * sizeof *out);
        g->timing_count -= n;
    }
    pthread_mutex_unlock(&g->lock);
    return n;
}
