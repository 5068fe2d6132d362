/* The service thread, its queue, the run lock and completions (see fc_service.h). */
#include "fc_service.h"

#include <errno.h>
#include <stdlib.h>

static void *loop(void *arg)
{
    fc_service *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->first && !s->stopping)
            pthread_cond_wait(&s->cond, &s->lock);
        fc_item *it = s->first;
        if (!it)
            break; /* stopping, and nothing left */
        s->first = it->next;
        if (!s->first)
            s->last = NULL;
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_lock(&s->run);
        it->run(it);
        pthread_mutex_unlock(&s->run);
        pthread_mutex_lock(&s->lock);
        s->queued--;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int fc_service_start(fc_service *s)
{
    s->first = s->last = NULL;
    s->queued = 0;
    s->stopping = 0;
    s->started = 0;
    if (pthread_mutex_init(&s->lock, NULL) || pthread_cond_init(&s->cond, NULL) ||
        pthread_mutex_init(&s->run, NULL))
        return -1;
    if (pthread_create(&s->thread, NULL, loop, s))
        return -1;
    s->started = 1;
    return 0;
}

void fc_service_submit(fc_service *s, fc_item *it, int urgent)
{
    pthread_mutex_lock(&s->lock);
    if (s->stopping && !s->started) {
        pthread_mutex_unlock(&s->lock);
        it->drop(it);
        return;
    }
    s->queued++;
    if (urgent) {
        it->next = s->first;
        s->first = it;
        if (!s->last)
            s->last = it;
    } else {
        it->next = NULL;
        if (s->last)
            s->last->next = it;
        else
            s->first = it;
        s->last = it;
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

int fc_service_try_claim(fc_service *s)
{
    pthread_mutex_lock(&s->lock);
    int r = 0;
    if (!s->queued)
        r = pthread_mutex_trylock(&s->run) == 0 ? 1 : -1;
    pthread_mutex_unlock(&s->lock);
    return r;
}

int fc_service_claim_if_idle(fc_service *s)
{
    pthread_mutex_lock(&s->lock);
    int r = 0;
    if (!s->queued) { /* only another caller's inline run can hold the lock now */
        pthread_mutex_lock(&s->run);
        r = 1;
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

void fc_service_release(fc_service *s)
{
    pthread_mutex_unlock(&s->run);
}

int fc_service_lock_by(fc_service *s, fc_ns until)
{
    /* a loop of tries, not pthread_mutex_timedlock: macOS has none, and it waits on the
     * realtime clock */
    for (;;) {
        if (pthread_mutex_trylock(&s->run) == 0)
            return 1;
        if (fc_now() >= until)
            return 0;
        struct timespec nap = {0, 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

void fc_service_stop(fc_service *s)
{
    if (!s->started)
        return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->lock);
    s->started = 0;
    fc_item *it = s->first; /* submitted while the thread was ending */
    s->first = s->last = NULL;
    pthread_mutex_unlock(&s->lock);
    while (it) {
        fc_item *next = it->next;
        it->drop(it);
        it = next;
    }
}

fc_done *fc_done_new(void)
{
    fc_done *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    if (pthread_mutex_init(&d->lock, NULL) || pthread_cond_init(&d->cond, NULL)) {
        free(d);
        return NULL;
    }
    atomic_init(&d->refs, 1);
    return d;
}

void fc_done_ref(fc_done *d)
{
    atomic_fetch_add(&d->refs, 1);
}

void fc_done_unref(fc_done *d)
{
    if (d && atomic_fetch_sub(&d->refs, 1) == 1) {
        pthread_mutex_destroy(&d->lock);
        pthread_cond_destroy(&d->cond);
        free(d);
    }
}

void fc_done_finish(fc_done *d, int code)
{
    pthread_mutex_lock(&d->lock);
    d->finished = 1;
    d->code = code;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

int fc_done_wait(fc_done *d, fc_ns until)
{
    pthread_mutex_lock(&d->lock);
    while (!d->finished) {
        fc_ns now = fc_now();
        if (now >= until)
            break;
        /* condition variables time out on the realtime clock: wait in short slices of it */
        fc_ns slice = until - now < 50 * 1000 * 1000LL ? until - now : 50 * 1000 * 1000LL;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)slice;
        ts.tv_sec += ts.tv_nsec / FC_NS_PER_S;
        ts.tv_nsec %= FC_NS_PER_S;
        pthread_cond_timedwait(&d->cond, &d->lock, &ts);
    }
    int done = d->finished;
    pthread_mutex_unlock(&d->lock);
    return done;
}

int fc_done_finished(fc_done *d)
{
    pthread_mutex_lock(&d->lock);
    int done = d->finished;
    pthread_mutex_unlock(&d->lock);
    return done;
}
