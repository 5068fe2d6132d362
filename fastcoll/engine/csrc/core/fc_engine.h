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

/* The core's door for the rooms above (algorithms, gate, binding): the messages, and below them
 * the state (fc_state.h) and the waits (fc_wait.h: fc_engine_call_begin/end around a call). The
 * end (fc_close.h) is above this file: its goodbye flushes. */
#include "fc_wait.h"

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

/* The error of c's link once its stream ended or failed (`mid`: in the middle of a message):
 * a peer that closed, a receive that failed, or a peer that wrote something malformed where the
 * link reads it (a shared-memory ring's counters: recv_errno EBADMSG); the link's why says how. */
void fc_chan_lost(fc_engine *e, fc_chan *c, int mid, fc_err *err);

#endif
