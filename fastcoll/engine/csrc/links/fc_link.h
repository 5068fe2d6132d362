/* A link: one connection to one peer, whatever carries its bytes.
 *
 * Every link presents the same thing to the engine: an ordered, reliable byte stream each way,
 * a queue of frames to send and the bytes that have arrived. What carries them is the link's
 * kind (a table of operations, fc_link_kind, in the manner of Gloo's transport::Pair): a TCP
 * socket (fc_link_tcp.c), a pair of shared-memory rings (fc_link_shm.c) or RDMA queue pairs
 * (fc_link_verbs.c). A new kind is one new file plus one line in fc_link_kinds.c.
 *
 * Every call here is non-blocking; waiting is the engine's (fc_wait.c). The send side is a queue
 * of frames (a header copied here, a payload left in the caller's buffer until it has gone out),
 * written in order as the connection takes them. Every kind keeps a TCP socket (`fd`) to its
 * peer for the job's life: the data itself for a TCP link, and for the others the doorbells that
 * wake a side asleep in poll() and, when a rank exits, the end of the stream, which is how a dead
 * peer is seen where the data path reports nothing (shared memory, unreliable RDMA).
 */
#ifndef FC_LINK_H
#define FC_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FC_INLINE_HEADER 160
#define FC_LINK_WHY 160

typedef struct fc_frame {
    uint8_t head[FC_INLINE_HEADER];
    uint8_t *head_heap; /* the header, when it is longer than FC_INLINE_HEADER */
    uint32_t head_len;
    const uint8_t *payload;
    size_t payload_len;
    size_t done; /* bytes of header and payload written so far */
} fc_frame;

typedef struct fc_link fc_link;

/* What a kind needs to open a link; each kind reads its own fields. */
typedef struct fc_link_params {
    int fd;                /* the connected TCP socket to the peer (every kind takes it) */
    uint8_t *tx_mem;       /* shared memory: the ring this side writes (FC_RING_CONTROL + cap) */
    uint8_t *rx_mem;       /* ... and the one it reads */
    size_t cap;
    const char *library;   /* verbs: the library to load (NULL: the platform's) */
    const char *device;    /* verbs: the device toward this peer */
    int reliable;          /* verbs: reliable-connected queue pairs instead of unreliable */
    int64_t setup_ns;      /* verbs: how long the exchange of queue-pair numbers may take */
    int same_host;         /* verbs: the peer runs on this machine (its CPU numbers are this one's) */
} fc_link_params;

/* A kind of link: its operations. A NULL operation is one the kind does not need. */
typedef struct fc_link_kind {
    const char *name; /* "tcp", "shm", "verbs": what transport_info() reports */
    /* Set up l->state from p (l->fd, l->kind and the send queue are set already). 0, or -1 with
     * a one-line reason in why[0..why_len), having freed what it made (close is not called). */
    int (*open)(fc_link *l, const fc_link_params *p, char *why, size_t why_len);
    void (*close)(fc_link *l); /* free l->state (l->fd is closed by fc_link_close) */
    /* Write what the connection takes now from the queue (fc_link_written advances it).
     * 1: bytes went out; 0: none could; -1: the send failed (set l->send_errno). */
    int (*push)(fc_link *l);
    /* Take in what has arrived, cheaply: the hot path calls it while it waits.
     * 1: something arrived; 0: nothing; -1: the stream ended or failed (eof or recv_errno). */
    int (*pull)(fc_link *l);
    /* After poll() reported fd readable, for kinds whose fd carries only doorbells and the end
     * of the stream: take those in (-1: the stream ended). NULL where the data is on fd. */
    int (*wake)(fc_link *l);
    size_t (*have)(fc_link *l);                                 /* arrived bytes not taken */
    void (*peek)(fc_link *l, void *dst, size_t n, size_t off);  /* n + off <= have */
    size_t (*take)(fc_link *l, void *dst, size_t n);            /* dst NULL: drop them */
    /* Nothing buffered: receive straight into dst (a large payload). >0 bytes, 0 none now, -1
     * ended or failed. NULL: the kind has no such path (pull, then take). */
    ssize_t (*recv_direct)(fc_link *l, void *dst, size_t n);
    /* Before sleeping in poll(): 1 if nothing has arrived that poll() on fd would not report. */
    int (*may_sleep)(fc_link *l);
    /* A writer whose queue cannot move: 1 if it still cannot (sleep, watching fd for
     * room_event), 0 if room came. NULL: always 1. */
    int (*wait_room)(fc_link *l);
    short room_event; /* POLLOUT where room is the socket's; POLLIN where the reader rings */
    /* The longest a sleep in poll() may last while this link is watched, in ms (0: no bound):
     * for kinds whose arrivals poll() cannot see and whose peer cannot ring. */
    int nap_ms;
    /* Bytes sent that the peer has not yet taken in (a socket's unacknowledged bytes), so that
     * a rank that exits does not discard its last words; FC_IN_FLIGHT_UNKNOWN where some may be
     * and the kind cannot tell (the engine then waits a moment). NULL: none can be lost so. */
    size_t (*in_flight)(fc_link *l);
    /* Kinds whose peer may share this machine (shared memory; verbs to a peer on this host): say
     * which CPU this side runs on; the CPU the peer's writer last ran on, or -1 (fc_wait.c keeps
     * a pair that the scheduler put on one CPU apart). NULL elsewhere. */
    void (*say_cpu)(fc_link *l, int cpu);
    int (*peer_cpu)(fc_link *l);
    /* What this link is, in a few words, for transport_info() (verbs: its device, UC or RC, the
     * MTU). NULL: the kind's name says it all. */
    void (*describe)(fc_link *l, char *out, size_t len);
} fc_link_kind;

struct fc_link {
    int fd;
    const fc_link_kind *kind;
    void *state; /* the kind's own (its file defines it) */
    /* sending */
    fc_frame *out; /* a circular queue */
    size_t out_cap, out_first, out_count;
    int send_errno; /* a send failed (the peer is gone): nothing more goes out */
    /* receiving */
    int eof;        /* the peer's end of the stream was seen */
    /* A receive failed (EPROTO: the peer broke the kind's protocol; EBADMSG: it wrote something
     * malformed where this side reads it, which the engine reports as a malformed frame). */
    int recv_errno;
    /* What send_errno or recv_errno means here, where the kind can say more than an errno (a
     * frame lost on an unreliable RDMA link), for the engine's error; "" where it cannot. */
    char why[FC_LINK_WHY];
};

#define FC_IN_FLIGHT_UNKNOWN SIZE_MAX

/* The kind named `name`, or NULL (fc_link_kinds.c: the registry); the i-th kind this build has,
 * or NULL past the last. */
const fc_link_kind *fc_link_kind_named(const char *name);
const fc_link_kind *fc_link_kind_at(size_t i);

/* Make a link of `kind` over p->fd (which it takes: it is made non-blocking and closed by
 * fc_link_close). 0, or -1 with a one-line reason in why (the fd is then still the caller's). */
int fc_link_open(fc_link *l, const fc_link_kind *kind, const fc_link_params *p, char *why, size_t why_len);
void fc_link_close(fc_link *l);

/* ----- the send queue, common to every kind (fc_link.c) ----- */

/* Queue a frame: `head` is copied, `payload` must stay unchanged until it has gone out. */
int fc_link_queue(fc_link *l, const uint8_t *head, size_t head_len, const void *payload, size_t n);
/* Drop the queued frames that have not started to go out; 1 if one is half-written. */
int fc_link_drop_unstarted(fc_link *l);
/* Drop every queued frame (a failed send). */
void fc_link_drop_all(fc_link *l);
/* The queue's i-th frame from the front (i < out_count), and its header's bytes. */
fc_frame *fc_link_frame(fc_link *l, size_t i);
const uint8_t *fc_frame_head(const fc_frame *f);
/* Advance the queue past `n` written bytes. */
void fc_link_written(fc_link *l, size_t n);

/* ----- the kind's operations, for the engine (a NULL operation gets its default above) ----- */

/* Write what the connection takes now. 1: bytes went out; 0: none could; -1: the send failed
 * (send_errno set; the queue is dropped). pull, wake and recv_direct: -1 at once once the
 * stream has ended or failed. */
int fc_link_push(fc_link *l);
int fc_link_pull(fc_link *l);
int fc_link_wake(fc_link *l);
size_t fc_link_have(fc_link *l);
void fc_link_peek(fc_link *l, void *dst, size_t n, size_t off);
size_t fc_link_take(fc_link *l, void *dst, size_t n);
ssize_t fc_link_recv_direct(fc_link *l, void *dst, size_t n);
int fc_link_may_sleep(fc_link *l);
int fc_link_wait_room(fc_link *l);
size_t fc_link_in_flight(fc_link *l);
void fc_link_say_cpu(fc_link *l, int cpu);
int fc_link_peer_cpu(fc_link *l);

#endif
