/* What went wrong, as the engine reports it to the binding (fc_err.c): a code, the peer
 * concerned, numbers and a text. The bottom of the core: its state, its waits, its messages and
 * its end all report through it. */
#ifndef FC_ERR_H
#define FC_ERR_H

#include <stddef.h>
#include <stdint.h>

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

#endif
