/* The Engine's end: the last words after an abort, and close() (finalize()), which may come
 * while another thread of the program is inside a collective.
 *
 * Such a call uses the links, their queues and the shared-memory rings until it returns, so
 * close() first ends it: it interrupts it (the call fails with FC_E_SHUT, which Python reports
 * as "this group was finalized") and takes the run lock, within a bound. Only then does it say
 * goodbye, close the links and let go of the rings. A call that does not let go of the run lock
 * within the bound keeps everything it uses: the sockets are only shut (the peers see the end of
 * the stream) and the rest is freed when the engine object goes, when no call can be running.
 */
#include "py_common.h"

#include "base/fc_mem.h"
#include "core/fc_close.h"

#include <string.h>
#include <sys/socket.h>

/* How long close() waits for an interrupted call to let go of the run lock: the call sees the
 * interrupt within one sleep of its wait (FC_SIGNAL_CHECK_NS), then reports its error in Python. */
#define LET_GO_SECONDS 5.0

static void *finish_words(void *arg)
{
    EngineObject *self = arg;
    fc_engine_last_words_finish(&self->engine, self->words_until);
    return NULL;
}

/* abort(frame, seconds), from the thread that runs calls (it holds the run lock): from now on
 * only the abort notice `frame` goes out. It goes out at once on every link whose stream is
 * whole; a link with a frame half-written gets it behind that frame, within `seconds`, from a
 * thread of its own (a full buffer must not hold up the caller's error, nor the notices it
 * reads meanwhile). Nothing once the engine is closing: a call that close() interrupted fails,
 * and close() says goodbye instead (the peers hear that this rank finalized). */
PyObject *py_engine_abort(EngineObject *self, PyObject *args)
{
    Py_buffer frame;
    double seconds;
    if (!PyArg_ParseTuple(args, "y*d", &frame, &seconds))
        return NULL;
    if (!self->ready || atomic_load(&self->closed)) {
        PyBuffer_Release(&frame);
        Py_RETURN_NONE;
    }
    atomic_store(&self->failed, 1);
    int said = atomic_load(&self->engine.aborted) ? 1 : fc_engine_last_words(&self->engine, frame.buf, (size_t)frame.len);
    PyBuffer_Release(&frame);
    if (!said && !self->words_started) {
        self->words_until = fc_deadline_in(seconds);
        if (pthread_create(&self->words_thread, NULL, finish_words, self) == 0)
            self->words_started = 1;
        else
            fc_engine_last_words_finish(&self->engine, 0); /* no thread: shut at least */
    }
    Py_RETURN_NONE;
}

/* The end of the engine's threads (without the GIL): no gate waits on, the service thread has
 * run or dropped what was queued, the last words' thread is done. */
static void stop_threads(EngineObject *self)
{
    if (self->gated)
        atomic_store(&self->gate.stop, 1);
    fc_service_stop(&self->service);
    if (self->words_started) {
        pthread_join(self->words_thread, NULL);
        self->words_started = 0;
    }
}

static void release_memory(EngineObject *self)
{
    fc_scratch_trim(); /* the scratch blocks kept for the next call: finalize gives them back */
    for (size_t i = 0; i < self->nsegments; i++)
        PyBuffer_Release(&self->segments[i]);
    PyMem_Free(self->segments);
    self->segments = NULL;
    self->nsegments = 0;
    if (self->gated) {
        fc_gate_free(&self->gate);
        PyBuffer_Release(&self->page);
        self->gated = 0;
    }
}

/* End the call another thread runs inline, if one does (without the GIL): interrupt it, and
 * wait by `until` for it to let go of the run lock. 0 if it kept it. A call queued on the
 * service thread is left to finish, as finalize() promises. */
static int end_call_under_way(EngineObject *self, fc_ns until)
{
    if (!atomic_load(&self->inline_call))
        return 1;
    atomic_store(&self->engine.interrupted, FC_INTERRUPT_SHUT);
    if (!fc_service_lock_by(&self->service, until))
        return 0;
    /* Before anything else runs: what the ended call left queued must never go out (its
     * payloads may be memory it has let go of). */
    fc_engine_forget_call(&self->engine);
    int shut = FC_INTERRUPT_SHUT; /* the queued calls still run (or fail with the job's error) */
    atomic_compare_exchange_strong(&self->engine.interrupted, &shut, 0);
    fc_service_release(&self->service);
    return 1;
}

/* The end of the links, once nobody else uses them (the caller holds the run lock): unless the
 * job aborted, the queued frames are finished and CLOSE said on every link (but those a call
 * that close() ended left cut). */
static void end_links(EngineObject *self, double flush_s, double linger_s)
{
    if (atomic_load(&self->engine.aborted))
        fc_engine_linger(&self->engine, fc_deadline_in(linger_s));
    else
        fc_engine_say_goodbye(&self->engine, fc_deadline_in(flush_s), fc_deadline_in(1.0));
    fc_engine_close_links(&self->engine);
}

/* A call kept the run lock past the bound: leave it what it uses, and shut the sockets so that
 * the peers see the end of the stream (and its reads end too). */
static void abandon_links(EngineObject *self)
{
    fc_engine *e = &self->engine;
    for (int i = 0; i < e->size * e->channels; i++)
        if (e->chans[i].open)
            shutdown(e->chans[i].link.fd, SHUT_RDWR);
}

/* close(flush_seconds, linger_until_seconds): end the call another thread runs, if any; run
 * what is queued; then, if the job did not abort, finish the queued frames and say CLOSE on
 * every link (within flush_seconds, then 1 s); if it did, wait (up to linger seconds) for the
 * peers to take the abort notice. */
PyObject *py_engine_close(EngineObject *self, PyObject *args)
{
    double flush_s, linger_s;
    if (!PyArg_ParseTuple(args, "dd", &flush_s, &linger_s))
        return NULL;
    if (!self->ready || py_forked(self) || atomic_exchange(&self->closed, 1))
        Py_RETURN_NONE; /* (a forked child's copy: its parent says goodbye) */
    int held;
    Py_BEGIN_ALLOW_THREADS
    held = end_call_under_way(self, fc_deadline_in(LET_GO_SECONDS));
    if (held) {
        py_graph_close(self);
        stop_threads(self);
        /* Only a caller that passed its check before the close can still take it: it finds the
         * engine closed and lets go at once. */
        held = fc_service_lock_by(&self->service, fc_deadline_in(LET_GO_SECONDS));
    }
    if (held) {
        end_links(self, flush_s, linger_s);
        fc_service_release(&self->service);
        self->ended = 1;
    } else {
        abandon_links(self);
    }
    Py_END_ALLOW_THREADS
    py_reap(self);
    if (self->ended)
        release_memory(self);
    Py_RETURN_NONE;
}

/* The engine object goes (no call can be running: each holds a reference). */
void py_engine_end(EngineObject *self)
{
    if (!self->ready || py_forked(self))
        return; /* a forked child's copy is left alone: its threads are not here, its locks may be held */
    atomic_store(&self->closed, 1);
    if (!self->ended) {
        Py_BEGIN_ALLOW_THREADS
        py_graph_close(self);
        stop_threads(self);
        Py_END_ALLOW_THREADS
    }
    py_reap(self);
    py_graph_free(self);
    fc_engine_free(&self->engine);
    release_memory(self);
    pthread_mutex_destroy(&self->dead_lock);
}
