/* The wire format shared with the pure-Python engine (fastcoll/wire.py):
 *
 *     <u32 little-endian header length> <msgpack [kind, seq, sig, chunk, nbytes]> <nbytes bytes>
 *
 * Every length read from the wire is bounded before it is used: the header length to
 * 1..FC_MAX_HEADER, the signature to what the header holds; a header that breaks a rule is
 * malformed, never partly believed. Only the msgpack types the Python side writes are read
 * (a fixed array of 5; integers; a string), anything else is malformed.
 */
#ifndef FC_WIRE_H
#define FC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define FC_MAX_HEADER 4096
#define FC_PREFIX 4

enum { FC_DATA = 0, FC_ABORT = 1, FC_CLOSE = 2 };

typedef struct fc_header {
    int kind;
    int64_t seq;
    int64_t chunk;
    int64_t nbytes;
    uint32_t sig_len;
    const uint8_t *sig; /* points into the buffer the header was unpacked from */
} fc_header;

/* Pack a frame header (prefix and msgpack body) into out[0..cap); its length, or 0 when it does
 * not fit in cap or in FC_MAX_HEADER. */
size_t fc_wire_pack(uint8_t *out, size_t cap, int kind, int64_t seq, const uint8_t *sig, size_t sig_len,
                    int64_t chunk, int64_t nbytes);

/* The header length a 4-byte prefix announces (*announced: as it reads, for a message), or 0
 * when it lies outside 1..FC_MAX_HEADER. */
uint32_t fc_wire_body_length(const uint8_t prefix[FC_PREFIX], uint32_t *announced);

/* Why an ABORT whose chunk (1 + the rank its sender waited for, 0 for none) names no rank of the
 * job is malformed (the receiver knows the job's size: fc_state.c checks it). */
#define FC_WIRE_ABORT_RANK "malformed header: an ABORT that names no rank of the job"

/* Unpack a header body of `len` bytes (the signature well-formed UTF-8, as Python decodes it).
 * 0, or -1 with *why naming what is malformed. */
int fc_wire_unpack(const uint8_t *body, size_t len, fc_header *h, const char **why);

#endif
