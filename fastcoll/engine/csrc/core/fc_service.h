/* The service: one thread that runs queued calls in call order, and the run lock.
 *
 * A synchronous call on an idle engine runs on the caller's own thread instead
 * (fc_service_claim_if_idle): handing a small collective to another thread and back costs a
 * wake-up on each side. Whoever runs a call holds the run lock, so the connections have one user
 * at a time and calls still run in call order. The thread never takes the GIL to run a native
 * call; an item that must run Python takes it itself.
 */
#ifndef FC_SERVICE_H
#define FC_SERVICE_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/fc_clock.h"

typedef struct fc_item fc_item;
struct fc_item {
    void (*run)(fc_item *it);  /* on the service thread, holding the run lock */
    void (*drop)(fc_item *it); /* instead of run, for an item still queued when the service stops */
    fc_item *next;
};

typedef struct fc_service {
    pthread_mutex_t lock; /* the queue and the count */
    pthread_cond_t cond;
    fc_item *first, *last;
    int queued; /* submitted and not yet finished */
    int stopping;
    pthread_mutex_t run; /* held by whoever runs a call */
    pthread_t thread;
    int started;
} fc_service;

int fc_service_start(fc_service *s);
/* Queue `it` (at the front with `urgent`: the last words after an abort). */
void fc_service_submit(fc_service *s, fc_item *it, int urgent);
/* 1: nothing is queued or running and the run lock is now the caller's (blocking only on
 * another caller's inline run); 0: calls are queued, so this one must queue too. */
int fc_service_claim_if_idle(fc_service *s);
/* As fc_service_claim_if_idle, never blocking: -1 where it would have to wait for the run lock. */
int fc_service_try_claim(fc_service *s);
void fc_service_release(fc_service *s);
/* Take the run lock by `until` (a monotonic deadline): 1, or 0 if its holder kept it. */
int fc_service_lock_by(fc_service *s, fc_ns until);
/* Run what is queued, then stop the thread (items queued after that are dropped). */
void fc_service_stop(fc_service *s);

/* A call's completion, which its Work waits on. */
typedef struct fc_done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int finished;
    int code; /* FC_OK, or the fc_code it failed with */
    _Atomic int refs;
} fc_done;

fc_done *fc_done_new(void);
void fc_done_ref(fc_done *d);
void fc_done_unref(fc_done *d);
void fc_done_finish(fc_done *d, int code);
/* 1 once finished, 0 if `until` came first. */
int fc_done_wait(fc_done *d, fc_ns until);
int fc_done_finished(fc_done *d);

#endif
