/* The engine's state: this rank's channels to every peer (a link each, and what the engine knows
 * of it), their making and unmaking, and the small helpers over a channel that every file of the
 * core shares. It is below the waits (fc_wait.h), the messages (fc_engine.h) and the end
 * (fc_close.h), which all take these types; it calls none of them. Its links are opened here
 * (fc_engine_add_link), so they are closed here too (fc_engine_close_links), which
 * fc_engine_free needs. */
#ifndef FC_STATE_H
#define FC_STATE_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/fc_clock.h"
#include "links/fc_link.h"
#include "fc_err.h"
#include "fc_wire.h"

/* fc_engine.interrupted: 0, FC_INTERRUPT_USER (Engine.interrupt(): FC_E_INTERRUPTED), or
 * FC_INTERRUPT_SHUT (close() ends a call under way: FC_E_SHUT). */
#define FC_INTERRUPT_USER 1
#define FC_INTERRUPT_SHUT 2

/* A link and what the engine knows of it. */
typedef struct fc_chan {
    fc_link link;
    int open;     /* a link was added here */
    int watched;  /* looked at while the engine waits on another link */
    int held;     /* `header` was read and not taken yet */
    int lost;     /* an fc_code: lost while the engine waited on another link (fc_chan_lost says how) */
    int cut;      /* a frame was given up half-written: no last words on it */
    int words;    /* the last words: 0 none due, 1 due, 2 queued, 3 said (fc_close.c) */
    fc_ns sent_at; /* when a wait last wrote bytes on the link (0: never) */
    fc_ns recv_at; /* when payload bytes last arrived on it (0: never) */
    fc_header header;
    uint8_t store[FC_MAX_HEADER]; /* the last header read (its signature points here) */
} fc_chan;

typedef struct fc_engine {
    int rank, size, channels;
    fc_chan *chans;    /* [peer * channels + ch] */
    uint8_t *finalized; /* per peer: it sent CLOSE */
    uint8_t *gave_up;   /* per peer: it sent ABORT, or its connection ended */
    fc_ns spin_ns, yield_ns;
    /* A call whose wait once idled this long leaves the yields out of the next call of its kind
     * (0: never; fc_wait.c, yield_of). */
    fc_ns long_wait_ns;
    size_t call_bytes;   /* what the call now running moves (fc_run): a large one does not spin */
    int call_kind;       /* the collective now running (fc_run's kind), -1 outside one */
    fc_ns call_idle_most; /* the longest that a wait of the call now running has idled */
    uint32_t long_kinds; /* bit k: the last call of kind k idled long_wait_ns or more */
    fc_ns stepped_aside; /* when a wait last moved this thread off its peer's CPU (fc_wait.c) */
    _Atomic int interrupted;
    _Atomic int aborted; /* the abort notice is going out: no other frame may */
    uint8_t *words_frame; /* the abort notice */
    size_t words_len;
    /* Called every FC_SIGNAL_CHECK_NS while a wait sleeps, on the thread that may run Python's
     * signal handlers: nonzero when one raised (the wait then ends with FC_E_SIGNAL). */
    int (*check_signals)(void *ctx);
    void *signals_ctx;
    struct pollfd *pfd;
    int *pfd_chan;
} fc_engine;

int fc_engine_init(fc_engine *e, int rank, int size, int channels, fc_ns spin_ns, fc_ns yield_ns,
                   fc_ns long_wait_ns);
/* Hand the engine the link to `peer` on channel `ch`, of `kind` over p (see fc_link_open). 0; -1 a
 * bad peer or channel, or one added twice; -2 the kind's open failed (its reason in why). */
int fc_engine_add_link(fc_engine *e, int peer, int ch, const fc_link_kind *kind, const fc_link_params *p,
                       char *why, size_t why_len);
void fc_engine_free(fc_engine *e);
/* Close every link. */
void fc_engine_close_links(fc_engine *e);

static inline fc_chan *fc_chan_of(fc_engine *e, int peer, int64_t chunk)
{
    return &e->chans[peer * e->channels + (int)(chunk % e->channels)];
}

/* The peer of a channel. */
static inline int fc_chan_peer(fc_engine *e, fc_chan *c)
{
    return (int)((c - e->chans) / e->channels);
}

/* The length of the header body l's buffered prefix announces (0: outside 1..FC_MAX_HEADER;
 * *announced: the length as it reads), or -1 before the whole prefix has come: the one reading
 * of a prefix that both parsing and the poll loop's "is a whole header here" use. */
int64_t fc_peek_body_length(fc_link *l, uint32_t *announced);

/* Read the next header from c's link into c->header (its signature in c->store): 1 read,
 * 0 not all of it has arrived, -1 malformed (err: FC_E_MALFORMED). */
int fc_chan_parse(fc_engine *e, fc_chan *c, fc_err *err);

#endif
