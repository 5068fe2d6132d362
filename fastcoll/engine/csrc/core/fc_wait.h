/* How the engine waits (fc_wait.c): above its state, below the messages that wait. */
#ifndef FC_WAIT_H
#define FC_WAIT_H

#include "fc_state.h"

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

#endif
