/* The fence gate's host half (fastcoll/gate/host/serve.py), for the gate's host mode:
 *
 *     poll ARRIVAL until it holds this gate's sequence number   (the GPU copied x to the mailbox)
 *     gather every rank's send mailbox into the receive mailbox  (an all_gather of the bytes)
 *     store STATUS, then RELEASE = seq                          (the spinning kernel continues)
 *
 * The control page is host memory the GPU also reaches (MLX's managed memory on CUDA, unified
 * memory on Apple silicon): its words are loaded with acquire and stored with release, so the
 * mailboxes are read only after ARRIVAL is seen and written before RELEASE is stored, on weakly
 * ordered CPUs too. The one rule: the GPU is never left waiting. Every failure stores RELEASE
 * with an error STATUS for every gate issued so far; the status is sticky and RELEASE never moves
 * backwards, whoever stores it (this thread, or Python's failure path through fc_gate_release).
 */
#ifndef FC_GATE_H
#define FC_GATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/fc_algo.h"

/* Word indices and status codes, as fastcoll/gate/protocol/layout.py defines them (the binding
 * fills them from fc_gate_page.h, generated from it), and one page's mailboxes. */
typedef struct fc_gate_layout {
    size_t arrival, release, status, ack, spin_iters, spin_failed;
    size_t send_offset, recv_offset, mailbox_bytes;
    int ranks;
    uint32_t ok, error, closed;
} fc_gate_layout;

/* One served gate as the profile records it (FASTCOLL_GATE_PROFILE=1); microseconds. */
typedef struct fc_gate_timing {
    uint32_t seq;
    double arrival_us, exchange_us, host_us, release_us; /* release_us < 0: not acknowledged */
    uint32_t spin_iters;
} fc_gate_timing;

typedef struct fc_gate {
    uint8_t *page;
    fc_gate_layout l;
    pthread_mutex_t lock; /* the stores of STATUS and RELEASE */
    uint32_t released, status;
    uint32_t submitted; /* the newest gate handed to the service */
    _Atomic int outstanding; /* handed to the service and not yet served (or given up) */
    _Atomic int stop;
    fc_ns spin_ns, max_nap_ns;
    int profile;
    fc_gate_timing *timings; /* not yet taken by Python */
    size_t timing_count, timing_cap;
} fc_gate;

int fc_gate_init(fc_gate *g, uint8_t *page, const fc_gate_layout *l, uint32_t start_seq, int profile);
void fc_gate_free(fc_gate *g);
/* Store STATUS (sticky once an error) then RELEASE = seq (never backwards). */
void fc_gate_release(fc_gate *g, uint32_t seq, uint32_t status);
/* Release every gate up to the newest submitted one with `status`. */
void fc_gate_release_submitted(fc_gate *g, uint32_t status);
void fc_gate_submitted(fc_gate *g, uint32_t seq);
/* Serve gate `seq` of `nbytes`: wait for its arrival, run `exchange` (the all_gather of the
 * receive mailbox, c->deadline set when it starts, limit_s after), release it. 0, or -1 with
 * c->err set (FC_E_GATE_CLOSED, FC_E_GATE_PROTOCOL, an exchange's error). */
int fc_gate_serve(fc_gate *g, fc_call *c, fc_op *exchange, uint32_t seq, size_t nbytes, double limit_s);
/* Take the recorded timings: copies up to `cap` into out; how many. */
size_t fc_gate_take_timings(fc_gate *g, fc_gate_timing *out, size_t cap);

#endif
