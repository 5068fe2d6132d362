/* How the engine ends (fc_close.c): the last words after an abort, the goodbye of a clean
 * finalize, the linger that lets the peers read them, and what a call that close() ended leaves.
 * It is above the messages (fc_engine.h): its goodbye first flushes what is queued. */
#ifndef FC_CLOSE_H
#define FC_CLOSE_H

#include "fc_state.h"

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
/* After close() ended a call under way (the caller holds the run lock): the frames it queued are
 * dropped, and a link with one half-written is cut (nothing more goes out on it, not even the
 * goodbye: the frame's payload may be memory the call has let go of; its peer sees the end of
 * the stream in the middle of a message). */
void fc_engine_forget_call(fc_engine *e);

#endif
