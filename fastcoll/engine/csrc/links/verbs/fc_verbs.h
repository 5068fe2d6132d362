/* The verbs link's own parts (fc_link_verbs.c is the kind; this header is shared by its files).
 *
 * One queue pair per link, unreliable-connected as Apple's RDMA over Thunderbolt offers it (or
 * reliable-connected where asked), carrying the link's byte stream in messages of at most one
 * slot each. Every message starts with a link header: its frame number, its length, the
 * credits it returns, and how many of the peer's frames its sender has had. A receive is posted
 * ahead for every slot; a side sends only while it holds a credit for one of the peer's posted
 * receives (an unreliable connection drops a message that finds none, silently), and the peer
 * returns each credit once the engine has taken the slot's
 * bytes and the slot is posted again: in the header of its next message, in a credit-only
 * message (length 0) when many are owed, or, where no message can go now, over the TCP socket
 * (fc_verbs_credit.c says why that path must exist). A frame number out of order is a lost or a
 * doubled frame: the stream fails with a reason, never with wrong data.
 *
 * Nothing that arrives over verbs wakes a thread asleep in poll(): a side about to sleep says so
 * in a credit-only message's flags, with the frames it has had, and the other side rings the
 * socket once: at once if it had sent more than that, else when it next sends. A side that could
 * not say so (no credit) wakes within the link's nap (1 ms) instead.
 *
 * Where the peer runs on this machine (the test fabric, a loopback device), every header also
 * says which CPU its sender last waited on, as the shared-memory rings do, so that the engine
 * can part two ranks that the scheduler put on one CPU (fc_wait.c's step_aside).
 */
#ifndef FC_VERBS_H
#define FC_VERBS_H

#include <stddef.h>
#include <stdint.h>

#include "base/fc_clock.h"
#include "links/fc_link.h"
#include "fc_verbs_lib.h"

#define FC_VERBS_RX_SLOTS 32        /* receives posted ahead: the credits the peer starts with */
#define FC_VERBS_TX_SLOTS 32        /* registered send buffers, each one message */
#define FC_VERBS_CTL 16             /* small buffers for credit-only messages */
#define FC_VERBS_CTL_BYTES 64
#define FC_VERBS_SLOT_BYTES 65536   /* one message, link header included */
#define FC_VERBS_HEAD 20            /* the link header: frame, length, credits, flags, frames had, CPU */
#define FC_VERBS_MAX_CPU (1u << 20) /* a bound on the CPU number a header may carry */
#define FC_VERBS_ASLEEP 1u          /* a header's flag: its sender sleeps in poll(); ring its socket */
#define FC_VERBS_PORT 1

/* The bounds a peer's setup message must keep (fc_verbs_setup.c). */
#define FC_VERBS_MIN_SLOTS 2
#define FC_VERBS_MAX_SLOTS 1024
#define FC_VERBS_MIN_SLOT_BYTES 256
#define FC_VERBS_MAX_SLOT_BYTES (1u << 20)

/* What one side tells the other to connect its queue pair (fc_verbs_setup.c's message). */
typedef struct fc_verbs_addr {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t mtu;     /* enum ibv_mtu */
    uint8_t has_gid; /* 0: routed by LID */
    uint8_t gid[16];
    uint32_t slots, slot_bytes; /* its receive slots */
    int reliable;
} fc_verbs_addr;

/* The verbs objects of one link (fc_verbs_qp.c). */
typedef struct fc_verbs_qp {
    const fc_verbs_lib *lib;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *rx_mr, *tx_mr;
    uint8_t *rx_mem, *tx_mem; /* page-aligned: receive slots; send slots then credit buffers */
    size_t rx_bytes, tx_bytes;
    int reliable;
    int gid_index; /* the IPv4-mapped GID's, or -1 (routed by LID) */
    fc_verbs_addr me;
    uint8_t path_mtu; /* the MTU both ends use */
    char device[64];
} fc_verbs_qp;

/* Where a work request's completion belongs: its kind in the high half of wr_id. */
enum { FC_WR_RECV = 1, FC_WR_SEND = 2, FC_WR_CTL = 3 };

/* A link's state (l->state). */
typedef struct fc_verbs {
    fc_verbs_qp q;
    /* receiving: this side's posted slots */
    uint32_t expect;                        /* the next frame number */
    uint32_t arrived[FC_VERBS_RX_SLOTS];    /* slots that hold stream bytes, oldest first */
    uint32_t arrived_len[FC_VERBS_RX_SLOTS];/* their payload bytes, by slot */
    uint32_t first, count, first_off;       /* (a ring over `arrived`; first_off: taken of the oldest) */
    size_t avail;
    uint32_t owed;                          /* slots posted again whose credit the peer has not had */
    /* sending: the peer's slots */
    uint32_t peer_slots, max_payload, credits, seq;
    uint64_t tx_posted, tx_done, cx_posted, cx_done;
    uint32_t tx_len[FC_VERBS_TX_SLOTS];
    int peer_asleep; /* the peer said it sleeps: ring its socket with the next message */
    int announced;   /* this side said it sleeps, and nothing has come since */
    int same_host;   /* the peer is on this machine: the CPUs below mean something */
    uint32_t my_cpu; /* the CPU this side last waited on, + 1, said in every header (0: not said) */
    int peer_cpu;    /* the CPU the peer's last header said, or -1 */
    /* the socket: credits that came over it (8-byte messages), and what waits to go there */
    uint8_t sock_in[8];
    uint32_t sock_in_len;
    uint64_t sock_credits;    /* credit messages that came over the socket (for tests) */
    uint8_t sock_out[64];
    uint32_t sock_out_len;
    char detail[128];
} fc_verbs;

/* fc_verbs_qp.c: the device's objects, and the queue pair brought up to send. */
int fc_verbs_qp_open(fc_verbs_qp *q, const fc_verbs_lib *lib, const char *device, int reliable, char *why,
                     size_t why_len);
int fc_verbs_qp_init(fc_verbs_qp *q, char *why, size_t why_len);
int fc_verbs_qp_connect(fc_verbs_qp *q, const fc_verbs_addr *peer, char *why, size_t why_len);
void fc_verbs_qp_close(fc_verbs_qp *q);
/* Post receive slot `slot` (0, or an errno). */
int fc_verbs_post_recv(fc_verbs_qp *q, uint32_t slot);
/* Post `len` bytes at `buf` (in tx_mem) as one message; wr_id says what it was (0, or an errno). */
int fc_verbs_post_send(fc_verbs_qp *q, uint8_t *buf, uint32_t len, uint64_t wr_id);

/* fc_verbs_setup.c: trading addresses with the peer over the TCP socket, before `deadline`. */
int fc_verbs_exchange(int fd, const fc_verbs_addr *mine, fc_verbs_addr *peer, fc_ns deadline, double secs,
                      char *why, size_t why_len);
int fc_verbs_ready(int fd, fc_ns deadline, double secs, char *why, size_t why_len);

/* fc_verbs_credit.c: completions, frames, credits. */
int fc_verbs_drain(fc_link *l);             /* data slots that arrived, or -1 (the link failed) */
void fc_verbs_repost(fc_link *l, uint32_t slot); /* a slot taken: post it again, its credit owed */
void fc_verbs_settle(fc_link *l);           /* return what credits are due */
void fc_verbs_announce_sleep(fc_link *l);   /* about to sleep in poll(): ask the peer to ring */
int fc_verbs_read_socket(fc_link *l);       /* credits and the end of the stream: 0, or -1 */
int fc_verbs_send_data(fc_link *l);         /* 1 if bytes went out, 0 none could, -1 failed */
void fc_verbs_fail(fc_link *l, int send, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Little-endian fields of the wire messages. */
static inline void fc_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t fc_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
