/* The frame header: msgpack [kind, seq, sig, chunk, nbytes] behind a 4-byte length. */
#include "fc_wire.h"

#include <string.h>

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

static uint64_t get_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The shortest msgpack integer for v (as msgpack-python writes it); its size. */
static size_t pack_int(uint8_t *p, int64_t v)
{
    if (v >= 0) {
        uint64_t u = (uint64_t)v;
        if (u < 0x80) { p[0] = (uint8_t)u; return 1; }
        if (u <= 0xff) { p[0] = 0xcc; p[1] = (uint8_t)u; return 2; }
        if (u <= 0xffff) { p[0] = 0xcd; put_be(p + 1, u, 2); return 3; }
        if (u <= 0xffffffffu) { p[0] = 0xce; put_be(p + 1, u, 4); return 5; }
        p[0] = 0xcf; put_be(p + 1, u, 8); return 9;
    }
    if (v >= -32) { p[0] = (uint8_t)(0xe0 | (uint8_t)(v + 32)); return 1; }
    if (v >= -128) { p[0] = 0xd0; put_be(p + 1, (uint64_t)v & 0xff, 1); return 2; }
    if (v >= -32768) { p[0] = 0xd1; put_be(p + 1, (uint64_t)v & 0xffff, 2); return 3; }
    if (v >= -2147483647LL - 1) { p[0] = 0xd2; put_be(p + 1, (uint64_t)v & 0xffffffffu, 4); return 5; }
    p[0] = 0xd3; put_be(p + 1, (uint64_t)v, 8); return 9;
}

size_t fc_wire_pack(uint8_t *out, size_t cap, int kind, int64_t seq, const uint8_t *sig, size_t sig_len,
                    int64_t chunk, int64_t nbytes)
{
    /* the array, three integers of at most 9 bytes, the string's own header of at most 5 */
    size_t body_max = 1 + 9 + 5 + sig_len + 9 + 9 + 1;
    if (sig_len > FC_MAX_HEADER || cap < FC_PREFIX + body_max)
        return 0;
    uint8_t *p = out + FC_PREFIX;
    *p++ = 0x95;
    p += pack_int(p, kind);
    p += pack_int(p, seq);
    if (sig_len < 32) {
        *p++ = (uint8_t)(0xa0 | sig_len);
    } else if (sig_len <= 0xff) {
        *p++ = 0xd9;
        *p++ = (uint8_t)sig_len;
    } else {
        *p++ = 0xda;
        put_be(p, sig_len, 2);
        p += 2;
    }
    if (sig_len)
        memcpy(p, sig, sig_len);
    p += sig_len;
    p += pack_int(p, chunk);
    p += pack_int(p, nbytes);
    size_t body = (size_t)(p - (out + FC_PREFIX));
    if (body > FC_MAX_HEADER)
        return 0;
    out[0] = (uint8_t)(body & 0xff);
    out[1] = (uint8_t)((body >> 8) & 0xff);
    out[2] = (uint8_t)((body >> 16) & 0xff);
    out[3] = (uint8_t)((body >> 24) & 0xff);
    return FC_PREFIX + body;
}

uint32_t fc_wire_body_length(const uint8_t prefix[FC_PREFIX], uint32_t *announced)
{
    uint32_t n = (uint32_t)prefix[0] | (uint32_t)prefix[1] << 8 | (uint32_t)prefix[2] << 16 |
                 (uint32_t)prefix[3] << 24;
    *announced = n;
    return (n == 0 || n > FC_MAX_HEADER) ? 0 : n;
}

/* A cursor over a header body; every read checks what is left. */
typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

static int take(cursor *c, size_t n, const uint8_t **at)
{
    if ((size_t)(c->end - c->p) < n)
        return -1;
    *at = c->p;
    c->p += n;
    return 0;
}

/* A msgpack integer that fits in int64. */
static int read_int(cursor *c, int64_t *v)
{
    const uint8_t *t;
    if (take(c, 1, &t))
        return -1;
    uint8_t b = t[0];
    if (b < 0x80) { *v = b; return 0; }
    if (b >= 0xe0) { *v = (int64_t)b - 256; return 0; }
    int n = 0, is_signed = 0;
    switch (b) {
    case 0xcc: n = 1; break;
    case 0xcd: n = 2; break;
    case 0xce: n = 4; break;
    case 0xcf: n = 8; break;
    case 0xd0: n = 1; is_signed = 1; break;
    case 0xd1: n = 2; is_signed = 1; break;
    case 0xd2: n = 4; is_signed = 1; break;
    case 0xd3: n = 8; is_signed = 1; break;
    default: return -1;
    }
    if (take(c, (size_t)n, &t))
        return -1;
    uint64_t u = get_be(t, n);
    if (!is_signed) {
        if (u > (uint64_t)INT64_MAX)
            return -1;
        *v = (int64_t)u;
        return 0;
    }
    if (n < 8 && (u >> (8 * n - 1)) & 1)
        u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    memcpy(v, &u, sizeof *v);
    return 0;
}

static int read_str(cursor *c, const uint8_t **s, uint32_t *len)
{
    const uint8_t *t;
    if (take(c, 1, &t))
        return -1;
    uint8_t b = t[0];
    uint64_t n;
    if ((b & 0xe0) == 0xa0) {
        n = b & 0x1f;
    } else {
        int w = b == 0xd9 ? 1 : b == 0xda ? 2 : b == 0xdb ? 4 : 0;
        if (!w || take(c, (size_t)w, &t))
            return -1;
        n = get_be(t, w);
    }
    if (n > FC_MAX_HEADER || take(c, (size_t)n, s))
        return -1;
    *len = (uint32_t)n;
    return 0;
}

/* Whether s[0..n) is well-formed UTF-8 (no overlong forms, no surrogates, nothing past
 * U+10FFFF): what Python's strict decoder takes, so both engines refuse the same signatures. */
static int utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        size_t len = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || b == 0xc0 || b == 0xc1 || b > 0xf4 || n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
        uint8_t b1 = len > 1 ? s[i + 1] : 0;
        if ((b == 0xe0 && b1 < 0xa0) || (b == 0xed && b1 > 0x9f) || (b == 0xf0 && b1 < 0x90) ||
            (b == 0xf4 && b1 > 0x8f))
            return 0; /* overlong, a surrogate, or past U+10FFFF */
        i += len;
    }
    return 1;
}

static int read_array5(cursor *c)
{
    const uint8_t *t;
    if (take(c, 1, &t))
        return -1;
    if (t[0] == 0x95)
        return 0;
    int w = t[0] == 0xdc ? 2 : t[0] == 0xdd ? 4 : 0;
    if (!w || take(c, (size_t)w, &t))
        return -1;
    return get_be(t, w) == 5 ? 0 : -1;
}

int fc_wire_unpack(const uint8_t *body, size_t len, fc_header *h, const char **why)
{
    cursor c = {body, body + len};
    int64_t kind;
    if (read_array5(&c)) {
        *why = "malformed header: not a 5-field array";
        return -1;
    }
    if (read_int(&c, &kind) || read_int(&c, &h->seq) || read_str(&c, &h->sig, &h->sig_len) ||
        read_int(&c, &h->chunk) || read_int(&c, &h->nbytes)) {
        *why = "malformed header: field of the wrong type";
        return -1;
    }
    if (c.p != c.end) {
        *why = "malformed header: extra data after the header";
        return -1;
    }
    if (kind < FC_DATA || kind > FC_CLOSE || h->nbytes < 0) {
        *why = "malformed header: field of the wrong type";
        return -1;
    }
    if (!utf8_valid(h->sig, h->sig_len)) {
        *why = "malformed header: the signature is not UTF-8";
        return -1;
    }
    h->kind = (int)kind;
    return 0;
}
