/* The engine: this rank's connections to every peer and the messages over them.
 *
 * It is the pure-Python TCP transport (fastcoll/transport/tcp.py) in C, message for message:
 * the same frames, the same header checks, and the same rules for what a wait watches. While
 * it waits for one link it looks at every other one too, so that an abort notice or a closed
 * connection anywhere ends the wait at once; a header that runs ahead on another link is held
 * until its turn; a peer lost while this rank waits on another is reported when it is next
 * needed. A wait spins, then yields the CPU, then sleeps in poll() (fc_wait.c). The engine is
 * used by one thread at a time (the service's run lock, fc_service.h), except that after an
 * abort the service thread says the last words while the failing thread reads the notices.
 */
#ifndef FC_ENGINE_H
#define FC_ENGINE_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/fc_clock.h"
#include "links/fc_link.h"
#include "fc_wire.h"

/* What went wrong; fastcoll/engine/native.py turns each into the pure-Python engine's error. */
enum fc_code {
    FC_OK = 0,
    FC_E_TIMEOUT_WAIT,    /* peer: who did not answer; n[0] us since its payload last moved (-1: never) */
    FC_E_TIMEOUT_PAYLOAD, /* peer; n[0] of n[1] bytes arrived, none for n[2] us */
    FC_E_TIMEOUT_SEND,    /* peer (or -1): data moved both ways with it until n[0] us ago (-1: not) */
    FC_E_CLOSED,          /* peer closed its connection */
    FC_E_CLOSED_MID,      /* ... in the middle of a message */
    FC_E_CONN,            /* a receive from peer failed: sys_errno */
    FC_E_FINALIZED,       /* peer called finalize() while this rank needed it */
    FC_E_MALFORMED,       /* peer sent a malformed frame: text says why */
    FC_E_ABORT,           /* peer's abort notice: text, n[0] its chunk; waiting_for */
    FC_E_MISMATCH_CALL,   /* peer called n[0] (seq) text (sig) */
    FC_E_MISMATCH_CHUNK,  /* expected chunk n[0] of n[1] bytes, peer sent n[2] of n[3] */
    FC_E_INTERRUPTED,     /* Engine.interrupt() */
    FC_E_SIGNAL,          /* a Python signal handler raised (Ctrl-C): its exception is set */
    FC_E_BROKEN,          /* a send to peer failed (sys_errno): read what it said first */
    FC_E_NOMEM,
    FC_E_INTERNAL,        /* text */
    FC_E_GATE_CLOSED,     /* the gate was closed before gate n[0] arrived */
    FC_E_GATE_PROTOCOL,   /* waiting for gate n[0], the GPU published n[1] */
    FC_E_GATE_SPIN,       /* a release spin hit its bound (the page says which) */
    FC_E_SHUT,            /* this rank's engine was closed (finalize()) while the call ran */
};

/* fc_engine.interrupted: 0, FC_INTERRUPT_USER (Engine.interrupt(): FC_E_INTERRUPTED), or
 * FC_INTERRUPT_SHUT (close() ends a call under way: FC_E_SHUT). */
#define FC_INTERRUPT_USER 1
#define FC_INTERRUPT_SHUT 2

#define FC_TEXT_MAX (FC_MAX_HEADER + 1)

typedef struct fc_err {
    int code;
    int peer;        /* the job rank concerned, or -1 */
    int waiting_for; /* FC_E_ABORT: whom this rank waited for when the notice came (-1: none) */
    int sys_errno;
    int64_t n[4];
    uint32_t text_len;
    char text[FC_TEXT_MAX];
} fc_err;

void fc_err_set(fc_err *err, int code, int peer);
void fc_err_text(fc_err *err, const void *text, size_t len);
/* A call that needs a link never added (an Engine used before its links are) is this error,
 * never a queue of no capacity: FC_E_INTERNAL naming the peer and channel. */
void fc_err_no_link(fc_err *err, int peer, int ch);

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

static inline fc_chan *fc_chan_of(fc_engine *e, int peer, int64_t chunk)
{
    return &e->chans[peer * e->channels + (int)(chunk % e->channels)];
}

/* ----- messages (fc_engine.c) ----- */

/* Queue a frame to `peer` (its channel: chunk % channels) and write what can go now; the
 * payload must stay unchanged until fc_engine_flush returns. A peer whose connection broke
 * gets nothing (fc_engine_flush reports it). */
int fc_engine_send(fc_engine *e, int peer, int kind, int64_t seq, const uint8_t *sig, size_t sig_len,
                   int64_t chunk, const void *payload, size_t n, fc_err *err);
/* Until every queued frame has gone out: FC_E_TIMEOUT_SEND past the deadline, FC_E_BROKEN for a
 * peer whose connection broke. */
int fc_engine_flush(fc_engine *e, fc_ns deadline, fc_err *err);
/* The next header from `peer` on chunk's channel, watching every link meanwhile; an ABORT or
 * CLOSE from it is an error (FC_E_ABORT, FC_E_FINALIZED). */
int fc_engine_next_header(fc_engine *e, int peer, int64_t chunk, fc_ns deadline, fc_header *h, fc_err *err);
/* The payload after the header just taken from that link, into dst. */
int fc_engine_read_payload(fc_engine *e, int peer, int64_t chunk, void *dst, size_t n, fc_ns deadline, fc_err *err);
/* Hold the header just taken from that link: it is the next one read from it. */
void fc_engine_keep_unread(fc_engine *e, int peer, int64_t chunk);
/* The header of message (seq, sig, chunk) of n payload bytes from `peer`, its payload still to
 * read (fc_engine_read_payload): FC_E_MISMATCH_* if it is another. */
int fc_engine_recv_header(fc_engine *e, int peer, int64_t seq, const uint8_t *sig, size_t sig_len, int64_t chunk,
                          size_t n, fc_ns deadline, fc_err *err);
/* Message (seq, sig, chunk) from `peer` into dst[0..n): FC_E_MISMATCH_* if it is another. */
int fc_engine_recv(fc_engine *e, int peer, int64_t seq, const uint8_t *sig, size_t sig_len, int64_t chunk,
                   void *dst, size_t n, fc_ns deadline, fc_err *err);

/* The peer of a channel. */
static inline int fc_chan_peer(fc_engine *e, fc_chan *c)
{
    return (int)((c - e->chans) / e->channels);
}

/* The error of c's link once its stream ended or failed (`mid`: in the middle of a message):
 * a peer that closed, a receive that failed, or a peer that wrote something malformed where the
 * link reads it (a shared-memory ring's counters: recv_errno EBADMSG); the link's why says how. */
void fc_chan_lost(fc_engine *e, fc_chan *c, int mid, fc_err *err);

/* Read the next header from c's link into c->header (its signature in c->store): 1 read,
 * 0 not all of it has arrived, -1 malformed (err: FC_E_MALFORMED). */
int fc_chan_parse(fc_engine *e, fc_chan *c, fc_err *err);

/* ----- waiting (fc_wait.c) ----- */

#define FC_SIGNAL_CHECK_NS (50 * 1000 * 1000LL)

/* A step a wait repeats: 1 done, 0 not yet (*moved: bytes moved), -1 failed (err set). */
typedef int (*fc_step)(fc_engine *e, void *ctx, int *moved, fc_err *err);

/* Repeat `step` until it is done, writing queued frames meanwhile; spin, then yield, then sleep
 * in poll() while nothing moves: on the links with frames to write and, when `awaited` (the
 * channel step reads) is given, on every watched link too.
 * 0 done; 1 the deadline passed; -1 failed (err set: a step's error, another link's timeout
 * notice, an interrupt or a signal). */
int fc_engine_wait(fc_engine *e, fc_step step, void *ctx, fc_chan *awaited, fc_ns deadline, fc_err *err);
/* Write what every link takes now; 1 if bytes went out. */
int fc_engine_push_all(fc_engine *e);
/* Around one collective (fc_run): its kind (below 32) and the bytes it moves, which the waits
 * weigh; at its end, whether its waits idled long enough to leave the yields out of the next. */
void fc_engine_call_begin(fc_engine *e, int kind, size_t bytes);
void fc_engine_call_end(fc_engine *e);

/* ----- the end (fc_close.c) ----- */

/* From the thread that runs calls (it holds the run lock), once a call failed: from now on only
 * the abort notice `frame` goes out. Said at once on every link whose stream is whole; 1 if that
 * was every link (each is then shut for writing), 0 if some have a frame half-written first, for
 * fc_engine_last_words_finish to finish, on a thread of its own, while this one reads notices. */
int fc_engine_last_words(fc_engine *e, const uint8_t *frame, size_t len);
/* Finish the last words until `until` (the links still busy then are cut), then shut every link
 * for writing. It only writes: the thread that runs calls may read meanwhile. */
void fc_engine_last_words_finish(fc_engine *e, fc_ns until);
/* Queued frames finished, then CLOSE on every link (until `until`). */
void fc_engine_say_goodbye(fc_engine *e, fc_ns flush_until, fc_ns until);
/* Until `until` at most: until the peers have taken what the sockets still hold. */
void fc_engine_linger(fc_engine *e, fc_ns until);
/* Close every link. */
void fc_engine_close_links(fc_engine *e);
/* After close() ended a call under way (the caller holds the run lock): the frames it queued are
 * dropped, and a link with one half-written is cut (nothing more goes out on it, not even the
 * goodbye: the frame's payload may be memory the call has let go of; its peer sees the end of
 * the stream in the middle of a message). */
void fc_engine_forget_call(fc_engine *e);

#endif
