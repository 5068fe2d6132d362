/* A link: one connection to one peer, over a TCP socket or a pair of shared-memory rings.
 *
 * Every call here is non-blocking; waiting is the engine's (fc_wait.c). The send side is a queue
 * of frames (a header copied here, a payload left in the caller's buffer until it has gone out),
 * written in order as the connection takes them. The receive side reads what has arrived: a
 * TCP link through a buffer that batches headers and small payloads into few system calls, a
 * shared-memory link straight from its ring. On a shared-memory link the socket only carries
 * one-byte doorbells (a wake-up for a side asleep in poll()) and, when a rank exits, the end of
 * the stream.
 */
#ifndef FC_LINK_H
#define FC_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fc_shmring.h"

#define FC_INLINE_HEADER 160
#define FC_READ_BUFFER (256 * 1024)

typedef struct fc_frame {
    uint8_t head[FC_INLINE_HEADER];
    uint8_t *head_heap; /* the header, when it is longer than FC_INLINE_HEADER */
    uint32_t head_len;
    const uint8_t *payload;
    size_t payload_len;
    size_t done; /* bytes of header and payload written so far */
} fc_frame;

typedef struct fc_link {
    int fd;
    int shm;       /* 1: the bytes go through tx and rx */
    fc_ring tx, rx;
    /* sending */
    fc_frame *out; /* a circular queue */
    size_t out_cap, out_first, out_count;
    int send_errno; /* a send failed (the peer is gone): nothing more goes out */
    /* receiving (TCP: a buffer; shared memory reads its ring) */
    uint8_t *rbuf;
    size_t rstart, rend;
    int eof;        /* the peer's end of the stream was seen */
    int recv_errno; /* a receive failed */
} fc_link;

/* Make a link over a connected socket (which it takes: it is made non-blocking and closed by
 * fc_link_close); for shared memory also the rings (tx_mem, rx_mem: FC_RING_CONTROL + cap each).
 * 0, or -1 (out of memory). */
int fc_link_init(fc_link *l, int fd, uint8_t *tx_mem, uint8_t *rx_mem, size_t cap);
void fc_link_close(fc_link *l);

/* Queue a frame: `head` is copied, `payload` must stay unchanged until it has gone out. */
int fc_link_queue(fc_link *l, const uint8_t *head, size_t head_len, const void *payload, size_t n);
/* Drop the queued frames that have not started to go out; 1 if one is half-written. */
int fc_link_drop_unstarted(fc_link *l);
/* Write what the connection takes now. 1: bytes went out; 0: none could; -1: the send failed
 * (send_errno set; the queue is dropped). */
int fc_link_push(fc_link *l);
/* A shared-memory writer whose ring is full asks the reader for a doorbell: 1 if still full. */
int fc_link_wait_room(fc_link *l);

/* Read what has arrived (TCP: into the buffer; shared memory: take the doorbells). 1: something
 * arrived; 0: nothing; -1: the stream ended or failed (eof or recv_errno set). */
int fc_link_pull(fc_link *l);
/* Bytes that have arrived and not been taken. */
size_t fc_link_have(fc_link *l);
/* Copy n arrived bytes at offset `off` without taking them. */
void fc_link_peek(fc_link *l, void *dst, size_t n, size_t off);
/* Take up to n arrived bytes into dst (NULL: drop them); how many. */
size_t fc_link_take(fc_link *l, void *dst, size_t n);
/* TCP, with nothing buffered: receive straight into dst (a large payload). >0 bytes, 0 none
 * now, -1 ended or failed. */
ssize_t fc_link_recv_direct(fc_link *l, void *dst, size_t n);
/* Before sleeping in poll(): 1 if nothing has arrived that poll() would not report (for shared
 * memory: the ring is empty, and the writer will ring). */
int fc_link_may_sleep(fc_link *l);

#endif
