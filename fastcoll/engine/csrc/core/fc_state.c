/* The engine's state: made (its channels and their links added), unmade (the links closed, the
 * memory freed), and a channel's next header parsed, which both the waits and the messages read. */
#include "fc_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fc_engine_init(fc_engine *e, int rank, int size, int channels, fc_ns spin_ns, fc_ns yield_ns,
                   fc_ns long_wait_ns)
{
    memset(e, 0, sizeof *e);
    if (size < 1 || channels < 1 || rank < 0 || rank >= size)
        return -1;
    e->rank = rank;
    e->size = size;
    e->channels = channels;
    e->spin_ns = spin_ns;
    e->yield_ns = yield_ns;
    e->long_wait_ns = long_wait_ns;
    e->call_kind = -1;
    size_t n = (size_t)size * (size_t)channels;
    e->chans = calloc(n, sizeof *e->chans);
    e->finalized = calloc((size_t)size, 1);
    e->gave_up = calloc((size_t)size, 1);
    e->pfd = calloc(n, sizeof *e->pfd);
    e->pfd_chan = calloc(n, sizeof *e->pfd_chan);
    if (!e->chans || !e->finalized || !e->gave_up || !e->pfd || !e->pfd_chan) {
        fc_engine_free(e);
        return -1;
    }
    return 0;
}

int fc_engine_add_link(fc_engine *e, int peer, int ch, const fc_link_kind *kind, const fc_link_params *p,
                       char *why, size_t why_len)
{
    if (peer < 0 || peer >= e->size || peer == e->rank || ch < 0 || ch >= e->channels)
        return -1;
    fc_chan *c = &e->chans[peer * e->channels + ch];
    if (c->open)
        return -1;
    if (fc_link_open(&c->link, kind, p, why, why_len))
        return -2;
    c->open = 1;
    c->watched = 1;
    return 0;
}

void fc_engine_close_links(fc_engine *e)
{
    if (!e->chans)
        return;
    for (int i = 0; i < e->size * e->channels; i++) {
        if (e->chans[i].open)
            fc_link_close(&e->chans[i].link);
        e->chans[i].open = 0;
    }
}

void fc_engine_free(fc_engine *e)
{
    fc_engine_close_links(e);
    free(e->chans);
    free(e->finalized);
    free(e->gave_up);
    free(e->pfd);
    free(e->pfd_chan);
    free(e->words_frame);
    e->words_frame = NULL;
    e->chans = NULL;
    e->finalized = e->gave_up = NULL;
    e->pfd = NULL;
    e->pfd_chan = NULL;
}

int64_t fc_peek_body_length(fc_link *l, uint32_t *announced)
{
    if (fc_link_have(l) < FC_PREFIX)
        return -1;
    uint8_t prefix[FC_PREFIX];
    fc_link_peek(l, prefix, FC_PREFIX, 0);
    return fc_wire_body_length(prefix, announced);
}

int fc_chan_parse(fc_engine *e, fc_chan *c, fc_err *err)
{
    fc_link *l = &c->link;
    uint32_t announced;
    int64_t body = fc_peek_body_length(l, &announced);
    if (body < 0)
        return 0;
    const char *why = NULL;
    char bad[64];
    if (!body) {
        snprintf(bad, sizeof bad, "header length %u outside 1..%d", announced, FC_MAX_HEADER);
        why = bad;
    } else {
        if (fc_link_have(l) < FC_PREFIX + (size_t)body)
            return 0;
        fc_link_peek(l, c->store, body, FC_PREFIX);
        fc_link_take(l, NULL, FC_PREFIX + (size_t)body);
        if (!fc_wire_unpack(c->store, body, &c->header, &why)) {
            fc_header *h = &c->header; /* an ABORT's chunk is 1 + the rank its sender waited for */
            if (h->kind != FC_ABORT || (h->chunk >= 0 && h->chunk <= e->size))
                return 1;
            why = FC_WIRE_ABORT_RANK;
        }
    }
    fc_err_set(err, FC_E_MALFORMED, fc_chan_peer(e, c));
    fc_err_text(err, why, strlen(why));
    return -1;
}
