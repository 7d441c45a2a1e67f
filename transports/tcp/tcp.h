/* SPDX-License-Identifier: MIT */
/*
 * tcp.h - the TCP transport's own declarations: constants, the queued
 * write, the connection and the transport, and what its files call of
 * each other.  They call downward only:
 *
 *   fr_tcp.c    the design and the wire format; the interface (open,
 *               connect, write, deregister, wait) and the progress pass
 *               with its epoll interest, which calls
 *   tcp_conn.c  everything about a connection before it carries data:
 *               socket options, connect and its retries, the hello and the
 *               reply, accepting and parking incoming connections, the
 *               address blob; it hands the reply to
 *   tcp_data.c  the data path: queued writes leave as header and payload
 *               in one sendmsg(), headers are checked against the region
 *               table and payloads land in registered memory
 *
 * All sit on the shared transport base (../common/tp_base.h) and nothing
 * else of the library but its utilities and logging.
 */
#ifndef FR_TCP_H
#define FR_TCP_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../common/tp_base.h"
#include "transport.h"

#define TCP_MAGIC 0x43545246u /* "FRTC" */
#define TCP_VERSION 1
#define TCP_KIND_HELLO 1
#define TCP_KIND_REPLY 2
#define TCP_HELLO_LEN 24
#define TCP_REPLY_LEN 12
#define TCP_HDR_LEN 32
#define TCP_OP_WRITE_IMM 1

#define TCP_ADDR_LEN FR_SOCKADDR_BLOB_LEN
#define TCP_ADDR_MAGIC 0xfa /* util.h's address blob, tagged as ours */

#define TCP_RKEY_LEN 20
#define TCP_RKEY_MAGIC 0xfc
#define TCP_RKEY_VERSION 1

#define TCP_MAX_SQ_DEPTH 65536
/* Messages gathered into one sendmsg() (two iovecs each). */
#define TCP_TX_BATCH 32
/* Bytes read from one connection per progress call, so a busy peer cannot
 * starve the others. */
#define TCP_RX_BUDGET (8u << 20)
/* Read ahead with a header: small messages then cost one readv, not two. */
#define TCP_RX_AHEAD 512
/*
 * A payload that still lacks this much or more when the socket runs dry
 * sets SO_RCVLOWAT to what it lacks (up to TCP_LOWAT_MAX), so that epoll
 * wakes us once for the rest instead of once per arriving burst (tcp_rx).
 */
#define TCP_LOWAT_MIN (64u << 10)
#define TCP_LOWAT_MAX (4u << 20)
#define TCP_BACKOFF_MIN_MS 10
#define TCP_BACKOFF_MAX_MS 1000

/* A registered region is the base's (struct fr_tpb_mr, tp_base.h): its
 * slot in the region table is its remote key. */

/* A queued write: points at the caller's memory, never copies it. */
struct tcp_sqe {
	struct fr_tpb_sqe b; /* region (NULL once the bytes no longer need
			      * it) and ctx */
	uint8_t hdr[TCP_HDR_LEN];
	const uint8_t *payload;
	size_t len;
};

enum tcp_state {
	/* outgoing: connect() refused, trying again later */
	TCP_RETRY = FR_TPB_RETRY,
	/* established */
	TCP_UP = FR_TPB_UP,
	/* socket closed; error completions may be owed */
	TCP_FAILED = FR_TPB_FAILED,
	/* outgoing: connect() in progress */
	TCP_CONNECTING = FR_TPB_SETUP,
	/* outgoing: sending the hello, awaiting the reply */
	TCP_HELLO,
	/* incoming: reading the peer's hello */
	TCP_GREET,
};

enum tcp_rx_state {
	TCP_RX_HDR,  /* filling rx_hdr */
	TCP_RX_DATA, /* landing a payload at rx_dst */
};

struct fr_tp_conn {
	struct fr_tpb_conn b; /* endpoint, list, peer, state, failure,
			       * establishment deadlines */
	int fd;
	bool ep_added; /* fd is in the epoll set, with ep_events */
	uint32_t ep_events;
	bool readable; /* epoll said so in this progress pass */
	bool writable; /* epoll said EPOLLOUT in this progress pass */
	/*
	 * The socket took less than we offered (or said EAGAIN): it is full,
	 * and another sendmsg() before epoll says EPOLLOUT would only fail.
	 * A stream pacing a slower link otherwise tries once a progress pass.
	 */
	bool tx_full;

	/* establishment */
	struct sockaddr_storage sa;
	socklen_t salen;
	uint8_t hs_in[TCP_HELLO_LEN];
	size_t hs_in_off, hs_in_len;
	uint8_t hs_out[TCP_HELLO_LEN];
	size_t hs_out_off, hs_out_len;

	/* send queue: b.sq, of struct tcp_sqe */
	size_t tx_off; /* bytes of the head message already sent */

	/* receive */
	enum tcp_rx_state rx_state;
	uint8_t rx_hdr[TCP_HDR_LEN];
	size_t rx_off; /* header bytes in rx_hdr */
	/* bytes read with a header beyond it: [rx_ahead_pos, rx_ahead_len) */
	uint8_t rx_ahead[TCP_RX_AHEAD];
	size_t rx_ahead_pos, rx_ahead_len;
	uint8_t *rx_dst;
	size_t rx_len, rx_done;
	uint32_t rx_imm, rx_region, rx_gen;
	/* SO_RCVLOWAT as set on fd: 1 (the kernel's default, and always so
	 * outside a payload), or at most what the payload still lacks */
	int rx_lowat;
};

/* The base (rank, connections, regions, listener, wake eventfd, epoll
 * set, error text) and the completions. */
struct fr_tp {
	struct fr_tpb b;
	struct fr_cqring cq;
	int rcvbuf; /* SO_RCVBUF of every socket; 0: the kernel's autotuning */
};

FR_TPB_FIRST(fr_tp);
FR_TPB_FIRST(fr_tp_conn);
FR_TPB_FIRST(tcp_sqe);

/* ---- small helpers ------------------------------------------------------- */

static inline bool tcp_would_block(int e)
{
	return e == EAGAIN || e == EWOULDBLOCK;
}

/* tcp_conn.c */
int tcp_rcvbuf_choose(struct fr_tp *tp);
void tcp_set_rcvbuf(const struct fr_tp *tp, int fd);
struct fr_tp_conn *tcp_conn_new(struct fr_tp *tp);
void tcp_close_fd(struct fr_tp_conn *c);
int tcp_start_connect(struct fr_tp_conn *c, uint64_t now);
void tcp_out_progress(struct fr_tp_conn *c, uint64_t now);
void tcp_accept_new(struct fr_tp *tp, uint64_t now);
void tcp_greet_progress(struct fr_tp_conn *c, uint64_t now);
int tcp_local_addr(const char *ip, struct sockaddr_storage *sa,
		   socklen_t *salen);
void tcp_addr_encode(uint8_t *b, const struct sockaddr_storage *sa);
int tcp_addr_decode(const void *blob, size_t len, struct sockaddr_storage *sa,
		    socklen_t *salen);

/* tcp_data.c */
void tcp_tx(struct fr_tp_conn *c);
void tcp_rx(struct fr_tp_conn *c);
bool tcp_rx_buffered(const struct fr_tp_conn *c);

#endif /* FR_TCP_H */
