/* The agreement of a call in which some ranks only send (fastcoll/algorithms/__init__.py's
 * Call.agree, message for message): every rank first tells every peer what it calls, a
 * header-only message of the call's signature, and reads every peer's before it first waits
 * (its first receive, or flush) and before the call returns. So ranks that disagree on an
 * argument that only some of them would otherwise check (a broadcast's root: the root receives
 * nothing; the counts of an all_to_all_v pair) all raise a MismatchError, and no rank returns a
 * result meanwhile. All are read before the first wait: one left unread would be held ahead of
 * what its peer says next (a timeout's notice) while this rank waits on another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fc_algo.h"

/* The most a pair's part adds to the call's signature. */
#define PAIR_EXTRA 128

static int counts_agree(const fc_op *op)
{
    return op->kind == FC_K_ALL_TO_ALL && op->agree_counts;
}

int fc_agree_needed(const fc_op *op)
{
    int k = op->kind;
    return k == FC_K_BROADCAST || k == FC_K_SCATTER || k == FC_K_GATHER || k == FC_K_REDUCE || counts_agree(op);
}

/* The elements this rank sends group rank `peer` and expects from it, in an all_to_all. */
static void pair_counts(const fc_call *c, int peer, int64_t *sends, int64_t *receives)
{
    const int64_t *b = c->agreeing->bounds + 2 * peer, *rb = c->agreeing->recv_bounds + 2 * peer;
    *sends = b[1] - b[0];
    *receives = rb[1] - rb[0];
}

/* The signature of the agreement message between this rank and group rank `peer`, either way:
 * the call's own, or with counts fastcoll.wire.pair_signature's (the pair's job ranks, lower
 * first, and the elements each sends the other as this rank's bounds say). *len: its length. */
static const uint8_t *signature_of(fc_call *c, int peer, size_t *len)
{
    *len = c->sig_len;
    if (!counts_agree(c->agreeing))
        return c->sig;
    int64_t sends, receives;
    pair_counts(c, peer, &sends, &receives);
    int me = (int)c->ranks[c->rank], other = (int)c->ranks[peer], low = me < other;
    char tail[PAIR_EXTRA];
    int n = snprintf(tail, sizeof tail, " [elements rank %d -> rank %d: %lld, rank %d -> rank %d: %lld]",
                     low ? me : other, low ? other : me, (long long)(low ? sends : receives),
                     low ? other : me, low ? me : other, (long long)(low ? receives : sends));
    if (n < 0 || (size_t)n >= sizeof tail)
        n = 0; /* (cannot happen: the numbers are bounded) */
    if (c->sig_len)
        memcpy(c->pair_sig, c->sig, c->sig_len);
    memcpy(c->pair_sig + c->sig_len, tail, (size_t)n);
    *len = c->sig_len + (size_t)n;
    return c->pair_sig;
}

int fc_agree_begin(fc_call *c, const fc_op *op)
{
    c->agreeing = op;
    c->owed = calloc((size_t)c->size, 1);
    if (counts_agree(op))
        c->pair_sig = malloc(c->sig_len + PAIR_EXTRA);
    if (!c->owed || (counts_agree(op) && !c->pair_sig)) {
        fc_err_set(c->err, FC_E_NOMEM, -1);
        return -1;
    }
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank)
            continue;
        size_t len;
        const uint8_t *sig = signature_of(c, p, &len);
        if (fc_engine_send(c->e, c->ranks[p], FC_DATA, c->seq, sig, len, 0, NULL, 0, c->err))
            return -1;
        c->owed[p] = 1;
    }
    return 0;
}

static int take(fc_call *c, int peer)
{
    size_t len;
    const uint8_t *sig = signature_of(c, peer, &len);
    c->owed[peer] = 0;
    int rc = c->trace ? fc_trace_recv(c, c->ranks[peer], sig, len, 0, NULL, 0)
                      : fc_engine_recv(c->e, c->ranks[peer], c->seq, sig, len, 0, NULL, 0, c->deadline, c->err);
    if (!rc)
        return 0;
    if (c->err->code == FC_E_MISMATCH_CALL && counts_agree(c->agreeing)) {
        /* what this rank expected, for the message (fastcoll/engine/native.py's error_from) */
        int64_t sends, receives;
        pair_counts(c, peer, &sends, &receives);
        c->err->n[1] = 1 + receives;
        c->err->n[2] = 1 + sends;
    }
    return -1;
}

int fc_agree_take_all(fc_call *c)
{
    for (int p = 0; p < c->size; p++)
        if (c->owed[p] && take(c, p))
            return -1;
    return 0;
}

int fc_agree_end(fc_call *c, int ok)
{
    int rc = ok && c->owed ? fc_agree_take_all(c) : ok ? 0 : -1;
    free(c->owed);
    free(c->pair_sig);
    c->owed = c->pair_sig = NULL;
    c->agreeing = NULL;
    return rc;
}
