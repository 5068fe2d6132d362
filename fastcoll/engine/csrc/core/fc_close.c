/* How the engine ends: the last words after an abort, the goodbye of a clean finalize, the
 * linger that lets the peers read them, and what a call that close() ended leaves. It is above
 * the messages (its goodbye flushes); the links themselves are closed with the engine's state
 * (fc_state.c), which opened them. */
#include "fc_close.h"
#include "fc_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static void nap(fc_ns ns)
{
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

/* Push every link whose words are due (1: the notice not yet queued behind its half-written
 * frame; 2: queued, not all out); 1 when every link has said them (3) or cannot (its peer gone). */
static int say(fc_engine *e, const uint8_t *frame, size_t len)
{
    int done = 1;
    for (int i = 0; i < e->size * e->channels; i++) {
        fc_chan *c = &e->chans[i];
        fc_link *l = &c->link;
        if (c->words != 1 && c->words != 2)
            continue;
        if (l->out_count)
            fc_link_push(l);
        if (c->words == 1 && !l->out_count && !l->send_errno && fc_link_queue(l, frame, len, NULL, 0) == 0) {
            c->words = 2;
            fc_link_push(l);
        }
        if (l->send_errno || (c->words == 2 && !l->out_count))
            c->words = 3;
        else
            done = 0;
    }
    return done;
}

/* Mark every open link whose peer still listens as due `frame`, keeping only its half-written
 * frame (written in the middle of one, the notice would corrupt the stream). */
static void due(fc_engine *e, int drop)
{
    for (int i = 0; i < e->size * e->channels; i++) {
        fc_chan *c = &e->chans[i];
        c->words = c->open && !c->link.send_errno && !e->finalized[fc_chan_peer(e, c)] ? 1 : 0;
        if (c->words && drop)
            fc_link_drop_unstarted(&c->link);
    }
}

static void shut_all(fc_engine *e)
{
    for (int i = 0; i < e->size * e->channels; i++)
        if (e->chans[i].open)
            shutdown(e->chans[i].link.fd, SHUT_WR); /* also wakes a peer's reads */
}

/* Say `frame` on every link it is due on, until `until`; the links still busy then are cut. */
static void say_until(fc_engine *e, const uint8_t *frame, size_t len, fc_ns until)
{
    while (!say(e, frame, len) && fc_now() < until)
        nap(200 * 1000);
    for (int i = 0; i < e->size * e->channels; i++)
        if (e->chans[i].words == 1 || e->chans[i].words == 2)
            e->chans[i].cut = 1;
}

int fc_engine_last_words(fc_engine *e, const uint8_t *frame, size_t len)
{
    atomic_store(&e->aborted, 1);
    free(e->words_frame);
    e->words_frame = malloc(len ? len : 1);
    if (!e->words_frame)
        return 1; /* no notice then: the shutdown still tells the peers */
    memcpy(e->words_frame, frame, len);
    e->words_len = len;
    due(e, 1);
    if (!say(e, frame, len))
        return 0;
    shut_all(e);
    return 1;
}

void fc_engine_last_words_finish(fc_engine *e, fc_ns until)
{
    if (e->words_frame)
        say_until(e, e->words_frame, e->words_len, until);
    shut_all(e);
}

void fc_engine_say_goodbye(fc_engine *e, fc_ns flush_until, fc_ns until)
{
    fc_err err;
    fc_engine_flush(e, flush_until, &err); /* what fails here was the peer's to report */
    uint8_t frame[64];
    size_t len = fc_wire_pack(frame, sizeof frame, FC_CLOSE, -1, NULL, 0, 0, 0);
    due(e, 0);
    say_until(e, frame, len, until);
}

/* Whether a link's peer may still lose what this rank said (a socket's unacknowledged bytes are
 * discarded by the reset that its next send to a closed socket meets): 1 yes, 2 perhaps (its
 * kind cannot tell), 0 no. */
static int unheard(fc_engine *e, fc_chan *c)
{
    int peer = fc_chan_peer(e, c);
    if (!c->open || e->gave_up[peer] || e->finalized[peer])
        return 0;
    size_t n = fc_link_in_flight(&c->link);
    return n == FC_IN_FLIGHT_UNKNOWN ? 2 : n > 0;
}

/* A moment for the peers to read the notice where a link cannot tell whether they have. */
#define LINGER_UNKNOWN_NS (50 * 1000 * 1000LL)

void fc_engine_linger(fc_engine *e, fc_ns until)
{
    for (;;) {
        int busy = 0, unknown = 0;
        for (int i = 0; i < e->size * e->channels && !busy; i++) {
            int u = unheard(e, &e->chans[i]);
            busy = u == 1;
            unknown |= u == 2;
        }
        fc_ns now = fc_now();
        if (!busy && unknown && until - now > 0) /* (no portable way to ask what a socket holds) */
            nap(until - now < LINGER_UNKNOWN_NS ? until - now : LINGER_UNKNOWN_NS);
        if (!busy || now >= until)
            return;
        nap(2 * 1000 * 1000);
    }
}

void fc_engine_forget_call(fc_engine *e)
{
    for (int i = 0; i < e->size * e->channels; i++) {
        fc_chan *c = &e->chans[i];
        if (c->open && fc_link_drop_unstarted(&c->link)) {
            c->cut = 1;
            if (!c->link.send_errno)
                c->link.send_errno = ECANCELED; /* its next push drops the frame unwritten */
        }
    }
}
