/* An fc_err, the engine's report of a failure to the binding (fc_err.h). */
#include "fc_err.h"

#include <stdio.h>
#include <string.h>

void fc_err_set(fc_err *err, int code, int peer)
{
    err->code = code;
    err->peer = peer;
    err->waiting_for = -1;
    err->sys_errno = 0;
    memset(err->n, 0, sizeof err->n);
    err->text_len = 0;
    err->text[0] = 0;
}

void fc_err_text(fc_err *err, const void *text, size_t len)
{
    if (len >= FC_TEXT_MAX)
        len = FC_TEXT_MAX - 1;
    if (len)
        memcpy(err->text, text, len);
    err->text[len] = 0;
    err->text_len = (uint32_t)len;
}

void fc_err_no_link(fc_err *err, int peer, int ch)
{
    char text[96];
    int n = snprintf(text, sizeof text, "no link to rank %d on channel %d was added", peer, ch);
    fc_err_set(err, FC_E_INTERNAL, peer);
    fc_err_text(err, text, n > 0 ? (size_t)n : 0);
}
