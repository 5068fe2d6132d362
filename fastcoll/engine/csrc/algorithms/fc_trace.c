/* A traced call's primitives (FASTCOLL_TRACE): each send, wait for a header, payload received
 * and flush noted as its phase, with its peer and bytes, in the call's bounded buffer, as the
 * pure-Python engine's Call and transport record them. An untraced call never comes here: its
 * primitives take one branch on c->trace (fc_algo.c). */
#include "fc_algo.h"

void fc_trace_note(fc_trace *t, int phase, int peer, size_t bytes, fc_ns start)
{
    if (t->n >= t->cap) { /* bounded: a call of more phases keeps its first and counts the rest */
        t->dropped++;
        return;
    }
    fc_span *s = &t->spans[t->n++];
    s->start = start;
    s->end = fc_now();
    s->bytes = bytes > INT64_MAX ? INT64_MAX : (int64_t)bytes;
    s->peer = peer;
    s->phase = phase;
}

int fc_trace_send(fc_call *c, int peer, int64_t chunk, const uint8_t *p, size_t count)
{
    fc_ns start = fc_now();
    int rc = fc_engine_send(c->e, c->ranks[peer], FC_DATA, c->seq, c->sig, c->sig_len, chunk, p,
                            count * c->itemsize, c->err);
    fc_trace_note(c->trace, FC_P_SEND, c->ranks[peer], count * c->itemsize, start);
    return rc;
}

/* The header's wait, then its payload (none for a header-only message): two phases. */
int fc_trace_recv(fc_call *c, int job_peer, const uint8_t *sig, size_t sig_len, int64_t chunk, uint8_t *p,
                  size_t bytes)
{
    fc_ns start = fc_now();
    int rc = fc_engine_recv_header(c->e, job_peer, c->seq, sig, sig_len, chunk, bytes, c->deadline, c->err);
    fc_trace_note(c->trace, FC_P_WAIT, job_peer, 0, start);
    if (rc || !bytes)
        return rc;
    start = fc_now();
    rc = fc_engine_read_payload(c->e, job_peer, chunk, p, bytes, c->deadline, c->err);
    fc_trace_note(c->trace, FC_P_RECEIVE, job_peer, bytes, start);
    return rc;
}

int fc_trace_flush(fc_call *c)
{
    fc_ns start = fc_now();
    int rc = fc_engine_flush(c->e, c->deadline, c->err);
    fc_trace_note(c->trace, FC_P_FLUSH, -1, 0, start);
    return rc;
}
