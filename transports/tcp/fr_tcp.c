/* SPDX-License-Identifier: MIT */
/*
 * fr_tcp.c - the TCP transport: one-sided write-with-immediate over sockets.
 *
 * TCP has no one-sided writes, so the receiver does the "NIC" part itself,
 * as libfabric's tcp provider does: every write travels as a header naming
 * the target region and offset, followed by the payload; the receiver checks
 * the header against its own region table and reads the payload straight
 * into the registered memory (no bounce buffer), then raises the RECV
 * completion.  The sender never touches the peer's memory.
 *
 * Design
 *   - One endpoint = one listening socket + one epoll instance (for wait())
 *     + a table of registered regions + a fixed ring of completions.
 *   - Everything is non-blocking.  Progress (accepting sockets, handshakes,
 *     sending, receiving) happens inside poll(), accept() and
 *     connect_done(); wait() only sleeps in epoll_wait().
 *   - Each connection has a fixed send queue of sq_depth descriptors that
 *     point into the caller's registered memory: no allocation and no copy
 *     per message.  Several queued messages leave in one sendmsg() as
 *     header/payload iovec pairs; partial sends resume mid-header or
 *     mid-payload.  A SEND completion is raised once the kernel has the
 *     whole message (the source may then be reused).
 *   - Completions wait in a per-endpoint ring (tp_cqring.h).  Progress
 *     never produces a completion the ring cannot hold: it stops sending
 *     and receiving on a connection instead, and resumes once poll() has
 *     drained the ring.  Error completions of a failed connection are owed
 *     (state, not queue) and delivered as room appears.
 *   - Incoming connections are not read beyond their hello until accept()
 *     hands them out, so no completion can name a connection the caller
 *     does not know yet.
 *
 * Wire format (all integers little-endian)
 *
 *   hello, connector -> acceptor, 24 bytes
 *      0 u32 magic "FRTC" (0x43545246)   4 u16 version (1)
 *      6 u16 kind (1 = hello)            8 i32 connector's rank
 *     12 u32 reserved (0)               16 u64 job nonce
 *   reply, acceptor -> connector, 12 bytes
 *      0 u32 magic   4 u16 version   6 u16 kind (2 = reply)
 *      8 i32 status: 0, or FR_EPROTO (version, malformed), FR_EAUTH (wrong
 *        nonce), FR_EBUSY (a connection from that rank already exists);
 *        the acceptor closes the socket after a refusal.  A hello with the
 *        wrong magic is closed without a reply (not our protocol).
 *   then any number of messages in either direction, each a 32-byte header
 *      0 u8  version (1)       1 u8  op (1 = write with immediate)
 *      2 u16 flags (0)         4 u32 immediate
 *      8 u32 region id        12 u32 region generation
 *     16 u64 offset in the region
 *     24 u32 payload length   28 u32 reserved (0)
 *   followed by the payload.  A zero-length write carries only the
 *   immediate; its region fields are ignored.  A malformed header fails the
 *   connection with FR_EPROTO; a write outside a region (unknown id, stale
 *   generation, no remote-write access, offset + length past its end)
 *   fails it with FR_ERANGE before a single payload byte is read.
 *
 *   address blob: util.h's socket-address blob (fr_sockaddr_encode, 28
 *     bytes) with magic 0xfa: u8 magic, u8 version (1), u8 family (4 or 6),
 *     u8 0, u16 port, u16 0, u32 IPv6 scope id, u8[16] address (IPv4 uses
 *     the first 4 bytes, the rest are 0).
 *   remote key blob, 20 bytes: u8 magic (0xfc), u8 version (1),
 *     u16 reserved (0), u32 region id, u32 generation, u64 region length.
 *     Unpacked into struct fr_tp_rkey as a = length, b = 0, c = id,
 *     d = generation.  A region id is a slot of the table; the slot's
 *     generation goes up at every deregistration, so a key kept after
 *     dereg_mem never reaches whatever is registered in that slot next.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/tp_base.h"
#include "fastreduce.h"
#include "log.h"
#include "transport.h"
#include "util.h"

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

static bool tcp_would_block(int e)
{
	return e == EAGAIN || e == EWOULDBLOCK;
}

/* connect() failures worth another try: the peer may not listen yet. */
static bool tcp_retryable(int e)
{
	return e == ECONNREFUSED || e == ECONNRESET || e == ECONNABORTED ||
	       e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH;
}

static void tcp_nodelay(int fd)
{
	int one = 1;

	/* Latency of small control writes matters more than packet count. */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		fr_dbg("tcp: TCP_NODELAY: %s", fr_syserr(errno));
}

/*
 * The receive buffer.  The kernel starts a connection at tcp_rmem's middle
 * value (128 KiB) and autotuning grows it by what the application read per
 * round trip - which, for an All-Reduce that sends half a megabyte each way
 * at once and then waits, it did not within hundreds of calls: 1 MiB at
 * n = 2 over loopback took 380-470 us per call, 205-216 with a 2 MiB buffer
 * from the start (6 jobs each, the ring; one job in ten got the fast one by
 * itself).  So every socket asks for FR_TCP_RCVBUF (default 4 MiB; the
 * kernel doubles it for its overhead) before connect() or listen(), which
 * also sets the window scale.  The kernel caps the request at
 * net.core.rmem_max, and a fixed buffer is never autotuned: where that cap
 * is below TCP_RCVBUF_USEFUL (Debian's 208 KiB) autotuning is left on, and
 * a log line at level info says what to raise.  0 leaves it on always.
 */
#define TCP_RCVBUF_DEFAULT (4 << 20)
#define TCP_RCVBUF_USEFUL (1 << 20)

static long tcp_rmem_max(void)
{
	FILE *f = fopen("/proc/sys/net/core/rmem_max", "r");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* tp->rcvbuf from FR_TCP_RCVBUF and the kernel's cap; 0 or FR_EINVAL. */
static int tcp_rcvbuf_choose(struct fr_tp *tp)
{
	const char *v = getenv("FR_TCP_RCVBUF");
	size_t want = TCP_RCVBUF_DEFAULT;
	long cap = tcp_rmem_max();
	bool asked = v && *v;

	tp->rcvbuf = 0;
	if (asked && (fr_parse_size(v, &want) || want > INT_MAX))
		return FR_EINVAL;
	if (!want)
		return 0;
	if (cap > 0 && (size_t)cap < want) {
		if (!asked && cap < TCP_RCVBUF_USEFUL) {
			fr_info("tcp: net.core.rmem_max is %ld: receive buffers left to the kernel's autotuning (with %d or more, each socket would start at %d: medium All-Reduces up to twice as fast)",
				cap, TCP_RCVBUF_DEFAULT, TCP_RCVBUF_DEFAULT);
			return 0;
		}
		want = (size_t)cap;
	}
	tp->rcvbuf = (int)want;
	return 0;
}

static void tcp_set_rcvbuf(const struct fr_tp *tp, int fd)
{
	if (tp->rcvbuf && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->rcvbuf,
				     sizeof(tp->rcvbuf)))
		fr_dbg("tcp: SO_RCVBUF %d: %s", tp->rcvbuf, fr_syserr(errno));
}

/* ---- connections: life cycle --------------------------------------------- */

static struct fr_tp_conn *tcp_conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c =
		fr_tpb_conn_new(tp, sizeof(*c), sizeof(struct tcp_sqe));

	if (c) {
		c->fd = -1;
		c->rx_state = TCP_RX_HDR;
	}
	return c;
}

static void tcp_close_fd(struct fr_tp_conn *c)
{
	if (c->fd < 0)
		return;
	if (c->ep_added)
		epoll_ctl(c->b.tp->b.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	c->ep_added = false;
	close(c->fd);
	c->fd = -1;
}

static void tcp_progress(struct fr_tp *tp, bool eager);

/*
 * A connection fails (fr_tpb_conn_fail, which also releases the regions
 * of its queued sends, remembers the error and owes the caller one error
 * completion plus one per queued send if it was established) or goes
 * away: close its socket now (the peer sees EOF).
 */
static const struct fr_tpb_class tcp_class = {
	.name = "tcp",
	.rkey = {TCP_RKEY_MAGIC, TCP_RKEY_VERSION, TCP_RKEY_LEN},
	.progress = tcp_progress,
	.conn_down = tcp_close_fd,
};

/* ---- handshake ----------------------------------------------------------- */

/* 0 when hs_out is all sent, FR_EAGAIN, or FR_EPEER (last_errno set). */
static int tcp_hs_send(struct fr_tp_conn *c)
{
	while (c->hs_out_off < c->hs_out_len) {
		ssize_t n = send(c->fd, c->hs_out + c->hs_out_off,
				 c->hs_out_len - c->hs_out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno))
				return FR_EAGAIN;
			c->b.last_errno = errno;
			return FR_EPEER;
		}
		c->hs_out_off += (size_t)n;
	}
	return 0;
}

/*
 * 0 when hs_in holds hs_in_len bytes, FR_EAGAIN, or FR_EPEER (last_errno,
 * 0 for EOF).  Reads exactly what is missing: bytes after the handshake
 * belong to the message stream.
 */
static int tcp_hs_recv(struct fr_tp_conn *c)
{
	while (c->hs_in_off < c->hs_in_len) {
		ssize_t n = recv(c->fd, c->hs_in + c->hs_in_off,
				 c->hs_in_len - c->hs_in_off, MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno))
				return FR_EAGAIN;
			c->b.last_errno = errno;
			return FR_EPEER;
		}
		if (n == 0) {
			c->b.last_errno = 0;
			return FR_EPEER;
		}
		c->hs_in_off += (size_t)n;
	}
	return 0;
}

static void tcp_put_reply(uint8_t *b, int status)
{
	fr_put_le32(b, TCP_MAGIC);
	fr_put_le16(b + 4, TCP_VERSION);
	fr_put_le16(b + 6, TCP_KIND_REPLY);
	fr_put_le32(b + 8, (uint32_t)status);
}

static void tcp_hello_start(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;

	fr_put_le32(c->hs_out, TCP_MAGIC);
	fr_put_le16(c->hs_out + 4, TCP_VERSION);
	fr_put_le16(c->hs_out + 6, TCP_KIND_HELLO);
	fr_put_le32(c->hs_out + 8, (uint32_t)tp->b.rank);
	fr_put_le32(c->hs_out + 12, 0);
	fr_put_le64(c->hs_out + 16, tp->b.nonce);
	c->hs_out_off = 0;
	c->hs_out_len = TCP_HELLO_LEN;
	c->hs_in_off = 0;
	c->hs_in_len = TCP_REPLY_LEN;
	c->b.state = TCP_HELLO;
}

/*
 * One connect() attempt.  Refusals become a later retry; only failures
 * that another attempt cannot fix (no socket, bad address) are returned.
 */
static int tcp_start_connect(struct fr_tp_conn *c, uint64_t now)
{
	char where[96];
	int fd, e;

	fd = socket(c->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	if (fd < 0) {
		c->b.last_errno = errno;
		return FR_ESYS;
	}
	tcp_nodelay(fd);
	tcp_set_rcvbuf(c->b.tp, fd);
	if (!connect(fd, (struct sockaddr *)&c->sa, c->salen)) {
		c->fd = fd;
		tcp_hello_start(c);
		return 0;
	}
	e = errno;
	/* EINTR: the connection still completes asynchronously. */
	if (e == EINPROGRESS || e == EINTR) {
		c->fd = fd;
		c->b.state = TCP_CONNECTING;
		return 0;
	}
	close(fd);
	if (tcp_retryable(e)) {
		fr_tpb_retry(c, e, now, TCP_BACKOFF_MAX_MS);
		return 0;
	}
	c->b.last_errno = e;
	fr_dbg("tcp: connect to %s: %s",
	       fr_sockaddr_str((struct sockaddr *)&c->sa, where, sizeof(where)),
	       fr_syserr(e));
	return FR_ESYS;
}

static void tcp_check_connected(struct fr_tp_conn *c, uint64_t now)
{
	struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
	socklen_t sl = sizeof(int);
	char where[96];
	int soerr = 0, r;

	r = poll(&pfd, 1, 0);
	if (r == 0 || (r < 0 && errno == EINTR))
		return;
	if (r < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl))
		soerr = errno;
	if (!soerr) {
		tcp_hello_start(c);
		return;
	}
	tcp_close_fd(c);
	if (tcp_retryable(soerr)) {
		fr_tpb_retry(c, soerr, now, TCP_BACKOFF_MAX_MS);
		return;
	}
	c->b.last_errno = soerr;
	fr_tpb_conn_fail(c, FR_EPEER, "connect to %s: %s",
			 fr_sockaddr_str((struct sockaddr *)&c->sa, where,
					 sizeof(where)),
			 fr_syserr(soerr));
}

static const char *tcp_where(const struct fr_tp_conn *c, char *buf, size_t size)
{
	return fr_sockaddr_str((struct sockaddr *)&c->sa, buf, size);
}

static void tcp_hello_progress(struct fr_tp_conn *c)
{
	const uint8_t *r = c->hs_in;
	char where[96];
	int err, status;

	err = tcp_hs_send(c);
	if (err == FR_EAGAIN)
		return;
	if (!err)
		err = tcp_hs_recv(c);
	if (err == FR_EAGAIN)
		return;
	if (err) {
		fr_tpb_conn_fail(
			c, FR_EPEER,
			"%s closed the connection during the handshake%s%s",
			tcp_where(c, where, sizeof(where)),
			c->b.last_errno ? ": " : "",
			c->b.last_errno ? fr_syserr(c->b.last_errno) : "");
		return;
	}
	if (fr_get_le32(r) != TCP_MAGIC || fr_get_le16(r + 4) != TCP_VERSION ||
	    fr_get_le16(r + 6) != TCP_KIND_REPLY) {
		fr_tpb_conn_fail(c, FR_EPROTO,
				 "%s answered with a malformed handshake",
				 tcp_where(c, where, sizeof(where)));
		return;
	}
	status = (int32_t)fr_get_le32(r + 8);
	if (!status) {
		c->b.state = TCP_UP;
		fr_dbg("tcp: rank %d: connected to rank %d at %s",
		       c->b.tp->b.rank, c->b.peer,
		       tcp_where(c, where, sizeof(where)));
		return;
	}
	/* Only the refusals the protocol defines; anything else is garbage. */
	if (status != FR_EAUTH && status != FR_EBUSY && status != FR_EPROTO)
		status = FR_EPROTO;
	fr_tpb_conn_fail(c, status, "%s refused the connection: %s",
			 tcp_where(c, where, sizeof(where)),
			 status == FR_EAUTH ? "wrong job nonce"
			 : status == FR_EBUSY
				 ? "it already has a connection from this rank"
				 : "protocol mismatch");
}

/* Advance an outgoing connection that is not established yet. */
static void tcp_out_progress(struct fr_tp_conn *c, uint64_t now)
{
	int before;
	char where[96];
	int err;

	do {
		before = c->b.state;
		switch (c->b.state) {
		case TCP_RETRY:
			if (now < c->b.retry_ms)
				break;
			err = tcp_start_connect(c, now);
			if (err)
				fr_tpb_conn_fail(
					c, err, "connect to %s: %s",
					fr_sockaddr_str(
						(struct sockaddr *)&c->sa,
						where, sizeof(where)),
					fr_syserr(c->b.last_errno));
			break;
		case TCP_CONNECTING:
			tcp_check_connected(c, now);
			break;
		case TCP_HELLO:
			tcp_hello_progress(c);
			break;
		default:
			return;
		}
	} while (c->b.state != before);

	if (c->b.state == TCP_UP || c->b.state == TCP_FAILED ||
	    now < c->b.deadline_ms)
		return;
	fr_sockaddr_str((struct sockaddr *)&c->sa, where, sizeof(where));
	if (c->b.state == TCP_HELLO)
		fr_tpb_conn_fail(c, FR_ETIMEDOUT,
				 "no handshake reply from %s within %d ms",
				 where, c->b.tp->b.timeout_ms);
	else
		fr_tpb_conn_fail(
			c, FR_ETIMEDOUT,
			"could not connect to %s within %d ms%s%s", where,
			c->b.tp->b.timeout_ms, c->b.last_errno ? ": " : "",
			c->b.last_errno ? fr_syserr(c->b.last_errno) : "");
}

/* Accept every socket waiting on the listener. */
static void tcp_accept_new(struct fr_tp *tp, uint64_t now)
{
	struct fr_tp_conn *c;
	int fd;

	for (;;) {
		fd = accept4(tp->b.lfd, NULL, NULL,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			/* Out of descriptors persists: say it once, not per
			 * poll. */
			if (!tcp_would_block(errno) &&
			    errno != tp->b.accept_errno)
				fr_warn("tcp: rank %d: accept: %s", tp->b.rank,
					fr_syserr(errno));
			if (!tcp_would_block(errno))
				tp->b.accept_errno = errno;
			return;
		}
		tp->b.accept_errno = 0;
		if (tp->b.npending >= FR_TPB_MAX_PENDING) {
			fr_warn("tcp: rank %d: too many connections awaiting accept; closing a new one",
				tp->b.rank);
			close(fd);
			continue;
		}
		c = tcp_conn_new(tp);
		if (!c) {
			close(fd);
			return;
		}
		tcp_nodelay(fd);
		c->fd = fd;
		c->hs_in_len = TCP_HELLO_LEN;
		fr_tpb_conn_park(c, TCP_GREET, now);
	}
}

/* A parked (not yet accepted) connection whose peer has gone away. */
static bool tcp_parked_gone(struct fr_tp_conn *c)
{
	uint8_t b;
	ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

	return n == 0 || (n < 0 && !tcp_would_block(errno) && errno != EINTR);
}

/* Does another live incoming connection already speak for `rank`? */
static bool tcp_rank_taken(struct fr_tp *tp, int rank,
			   const struct fr_tp_conn *self)
{
	struct fr_tp_conn *c;

	for (c = tp->b.conns; c; c = c->b.next) {
		if (c == self || !c->b.incoming || c->b.state != TCP_UP ||
		    c->b.peer != rank)
			continue;
		/* A reconnecting rank must not be locked out by its own
		 * dead, never-accepted connection. */
		if (!c->b.owned && tcp_parked_gone(c)) {
			fr_tpb_conn_fail(c, FR_EPEER, "closed before accept");
			continue;
		}
		return true;
	}
	return false;
}

/* Refuse a hello: best-effort reply, then close (the peer sees why). */
static void tcp_refuse(struct fr_tp_conn *c, int status)
{
	uint8_t b[TCP_REPLY_LEN];

	tcp_put_reply(b, status);
	if (send(c->fd, b, sizeof(b), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		fr_dbg("tcp: refusal not sent: %s", fr_syserr(errno));
	fr_tpb_conn_fail(c, status, "refused");
}

static void tcp_tx(struct fr_tp_conn *c);

/* Read and judge an incoming connection's hello. */
static void tcp_greet_progress(struct fr_tp_conn *c, uint64_t now)
{
	struct fr_tp *tp = c->b.tp;
	const uint8_t *h = c->hs_in;
	int err, rank;

	err = tcp_hs_recv(c);
	if (err == FR_EAGAIN) {
		if (now >= c->b.deadline_ms) {
			fr_warn("tcp: rank %d: no hello within %d ms; closing an incoming connection",
				tp->b.rank, tp->b.timeout_ms);
			fr_tpb_conn_fail(c, FR_ETIMEDOUT, "no hello");
		}
		return;
	}
	if (err) {
		fr_tpb_conn_fail(c, FR_EPEER, "closed before its hello");
		return;
	}
	if (fr_get_le32(h) != TCP_MAGIC ||
	    fr_get_le16(h + 6) != TCP_KIND_HELLO) {
		fr_warn("tcp: rank %d: closing an incoming connection that is not a fastreduce hello",
			tp->b.rank);
		fr_tpb_conn_fail(c, FR_EPROTO, "bad magic");
		return;
	}
	rank = (int32_t)fr_get_le32(h + 8);
	err = fr_tpb_hello_check(&tp->b, rank, fr_get_le16(h + 4), TCP_VERSION,
				 fr_get_le64(h + 16));
	if (err) {
		tcp_refuse(c, err);
		return;
	}
	if (rank < 0 || fr_get_le32(h + 12)) {
		fr_warn("tcp: rank %d: refused a malformed hello (rank %d)",
			tp->b.rank, rank);
		tcp_refuse(c, FR_EPROTO);
		return;
	}
	if (tcp_rank_taken(tp, rank, c)) {
		fr_warn("tcp: rank %d: refused a second connection from rank %d",
			tp->b.rank, rank);
		tcp_refuse(c, FR_EBUSY);
		return;
	}
	c->b.peer = rank;
	c->b.state = TCP_UP;
	tcp_put_reply(c->hs_out, 0);
	c->hs_out_off = 0;
	c->hs_out_len = TCP_REPLY_LEN;
	tcp_tx(c);
}

/* ---- data path ----------------------------------------------------------- */

/* The head of the send queue has left: complete it. */
static void tcp_sq_retire(struct fr_tp_conn *c)
{
	fr_tpb_sq_retire(c);
	c->tx_off = 0;
}

/*
 * Send what is queued: the handshake reply first (it precedes every
 * message in the stream), then as many messages as fit in one sendmsg(),
 * but never more than the completion ring can take.
 */
static void tcp_tx(struct fr_tp_conn *c)
{
	struct iovec iov[1 + 2 * TCP_TX_BATCH];
	struct fr_tp *tp = c->b.tp;
	unsigned int i, room;
	size_t hs_left, off, n;
	struct msghdr msg;
	ssize_t sent;
	int niov;

	while (c->b.state == TCP_UP) {
		niov = 0;
		hs_left = c->hs_out_len - c->hs_out_off;
		if (hs_left) {
			iov[niov].iov_base = c->hs_out + c->hs_out_off;
			iov[niov++].iov_len = hs_left;
		}
		room = fr_cqring_room(&tp->cq);
		off = c->tx_off;
		for (i = 0; i < c->b.sq.count && i < TCP_TX_BATCH && i < room;
		     i++) {
			struct tcp_sqe *e = fr_tpb_sq_at(&c->b.sq, i);

			if (off < TCP_HDR_LEN) {
				iov[niov].iov_base = e->hdr + off;
				iov[niov++].iov_len = TCP_HDR_LEN - off;
				off = 0;
			} else {
				off -= TCP_HDR_LEN;
			}
			if (e->len > off) {
				iov[niov].iov_base = (void *)(e->payload + off);
				iov[niov++].iov_len = e->len - off;
			}
			off = 0;
		}
		if (!niov)
			return;
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)niov;
		/* MSG_NOSIGNAL: a dead peer is an error code, never SIGPIPE. */
		sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno))
				return;
			fr_tpb_conn_fail(c, FR_EPEER, "send: %s",
					 fr_syserr(errno));
			return;
		}
		n = (size_t)sent;
		if (hs_left) {
			size_t t = FR_MIN(n, hs_left);

			c->hs_out_off += t;
			n -= t;
		}
		while (n) {
			const struct tcp_sqe *head = fr_tpb_sq_at(&c->b.sq, 0);
			size_t rest = TCP_HDR_LEN + head->len - c->tx_off;

			if (n < rest) {
				c->tx_off += n;
				break;
			}
			n -= rest;
			tcp_sq_retire(c);
		}
	}
}

/* Judge a complete header; 0 to go on, else the connection has failed. */
static int tcp_rx_header(struct fr_tp_conn *c)
{
	const uint8_t *h = c->rx_hdr;
	struct fr_tp *tp = c->b.tp;
	struct fr_tpb_mr *mr = NULL;
	uint32_t imm, id, gen, len;
	uint64_t off;

	imm = fr_get_le32(h + 4);
	id = fr_get_le32(h + 8);
	gen = fr_get_le32(h + 12);
	off = fr_get_le64(h + 16);
	len = fr_get_le32(h + 24);
	if (h[0] != TCP_VERSION || h[1] != TCP_OP_WRITE_IMM ||
	    fr_get_le16(h + 2) || fr_get_le32(h + 28)) {
		fr_tpb_conn_fail(c, FR_EPROTO,
				 "malformed message header (version %u, op %u)",
				 h[0], h[1]);
		return -1;
	}
	if (len) {
		mr = fr_tpb_region(&tp->b, id, gen);
		if (!mr) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write of %u bytes to unknown or deregistered region %u/%u",
				len, id, gen);
			return -1;
		}
		if (!(mr->access & FR_TP_REMOTE_WRITE)) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write to region %u, which does not allow remote writes",
				id);
			return -1;
		}
		/* Overflow-safe: never form off + len. */
		if (off > mr->len || len > mr->len - off) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write of %u bytes at offset %llu outside region %u of %zu bytes",
				len, (unsigned long long)off, id, mr->len);
			return -1;
		}
	}
	c->rx_state = TCP_RX_DATA;
	c->rx_dst = mr ? mr->base + off : NULL;
	c->rx_len = len;
	c->rx_done = 0;
	c->rx_off = 0;
	c->rx_imm = imm;
	c->rx_region = id;
	c->rx_gen = gen;
	return 0;
}

/*
 * Receive: a header into rx_hdr, then its payload straight into the
 * region.  While a payload lands, the same readv() also takes the next
 * header, so a stream of small writes costs one system call each.  A header
 * is read together with up to TCP_RX_AHEAD bytes more, so that a small
 * message (the eager protocol's header and data) takes one readv instead
 * of two: those bytes are copied out once the header has been checked,
 * which for a few hundred bytes costs less than a system call.
 */
static void tcp_rx(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	size_t budget = TCP_RX_BUDGET, take, want;
	struct iovec iov[2];
	bool drained = false;
	int niov;
	ssize_t n;

	for (;;) {
		if (c->rx_state == TCP_RX_HDR && c->rx_off == TCP_HDR_LEN) {
			if (tcp_rx_header(c))
				return;
			continue;
		}
		if (c->rx_state == TCP_RX_DATA && c->rx_done == c->rx_len) {
			/* Full ring: stop reading until poll() drains it. */
			if (fr_cqring_full(&tp->cq))
				return;
			fr_cqring_push(&tp->cq, FR_CQE_RECV, 0, c, 0, c->rx_imm,
				       (uint32_t)c->rx_len);
			/* rx_off keeps header bytes that came with it. */
			c->rx_state = TCP_RX_HDR;
			continue;
		}
		/* Bytes read ahead: into the payload or the next header. */
		if (c->rx_ahead_pos < c->rx_ahead_len) {
			const uint8_t *p = c->rx_ahead + c->rx_ahead_pos;

			take = c->rx_ahead_len - c->rx_ahead_pos;
			if (c->rx_state == TCP_RX_DATA) {
				take = FR_MIN(take, c->rx_len - c->rx_done);
				memcpy(c->rx_dst + c->rx_done, p, take);
				c->rx_done += take;
			} else {
				take = FR_MIN(take, TCP_HDR_LEN - c->rx_off);
				memcpy(c->rx_hdr + c->rx_off, p, take);
				c->rx_off += take;
			}
			c->rx_ahead_pos += take;
			if (c->rx_ahead_pos == c->rx_ahead_len)
				c->rx_ahead_pos = c->rx_ahead_len = 0;
			continue;
		}
		/* A short read emptied the socket: another would only say
		 * EAGAIN (epoll tells us when more arrives). */
		if (!budget || drained)
			return;
		if (c->rx_state == TCP_RX_DATA) {
			iov[0].iov_base = c->rx_dst + c->rx_done;
			iov[0].iov_len = c->rx_len - c->rx_done;
			iov[1].iov_base = c->rx_hdr;
			iov[1].iov_len = TCP_HDR_LEN;
			niov = 2;
		} else {
			iov[0].iov_base = c->rx_hdr + c->rx_off;
			iov[0].iov_len = TCP_HDR_LEN - c->rx_off;
			iov[1].iov_base = c->rx_ahead;
			iov[1].iov_len = TCP_RX_AHEAD;
			niov = 2;
		}
		n = readv(c->fd, iov, niov);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno))
				return;
			fr_tpb_conn_fail(c, FR_EPEER, "receive: %s",
					 fr_syserr(errno));
			return;
		}
		if (n == 0) {
			if (c->rx_state == TCP_RX_HDR && c->rx_off == 0)
				fr_tpb_conn_fail(c, FR_EPEER,
						 "peer closed the connection");
			else
				fr_tpb_conn_fail(
					c, FR_EPEER,
					"peer closed the connection in the middle of a message");
			return;
		}
		want = iov[0].iov_len + (niov > 1 ? iov[1].iov_len : 0);
		drained = (size_t)n < want;
		budget -= FR_MIN((size_t)n, budget);
		if (c->rx_state == TCP_RX_DATA) {
			take = FR_MIN((size_t)n, c->rx_len - c->rx_done);
			c->rx_done += take;
			c->rx_off = (size_t)n - take;
		} else {
			take = FR_MIN((size_t)n, iov[0].iov_len);
			c->rx_off += take;
			c->rx_ahead_pos = 0;
			c->rx_ahead_len = (size_t)n - take;
		}
	}
}

/* Everything non-blocking, on every connection. */
static uint32_t tcp_want_events(const struct fr_tp_conn *c);
static int tcp_arm(struct fr_tp_conn *c, uint32_t want);

/* Bytes already read that tcp_rx() has not finished with. */
static bool tcp_rx_buffered(const struct fr_tp_conn *c)
{
	return (c->rx_state == TCP_RX_HDR && c->rx_off == TCP_HDR_LEN) ||
	       (c->rx_state == TCP_RX_DATA && c->rx_done == c->rx_len) ||
	       c->rx_ahead_pos < c->rx_ahead_len;
}

/*
 * Ask epoll (without blocking) which sockets have news, so that an idle
 * connection or listener costs no system call per poll: a read or accept
 * that would only say EAGAIN costs microseconds, and the small-message
 * latency of a collective is a handful of polls.
 */
static bool tcp_collect_ready(struct fr_tp *tp)
{
	struct epoll_event ev[64];
	struct fr_tp_conn *c;
	bool listener = false;
	int n;

	for (c = tp->b.conns; c; c = c->b.next) {
		c->readable = false;
		if (c->b.state == TCP_UP && c->b.owned)
			tcp_arm(c, tcp_want_events(c));
	}
	n = epoll_wait(tp->b.epfd, ev, (int)FR_ARRAY_SIZE(ev), 0);
	if (n < 0 || n == (int)FR_ARRAY_SIZE(ev)) {
		/* Unsure: look at everything. */
		for (c = tp->b.conns; c; c = c->b.next)
			c->readable = true;
		return true;
	}
	for (int i = 0; i < n; i++) {
		c = ev[i].data.ptr;
		if (ev[i].data.ptr == &tp->b.wfd)
			fr_tpb_wake_drain(&tp->b);
		else if (!c)
			listener = true;
		else if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
			c->readable = true;
	}
	return listener;
}

static void tcp_progress(struct fr_tp *tp, bool eager)
{
	struct fr_tp_conn *c, *next;
	uint64_t now = fr_now_ms();

	if (tcp_collect_ready(tp))
		tcp_accept_new(tp, now);
	for (c = tp->b.conns; c; c = next) {
		next = c->b.next;
		switch (c->b.state) {
		case TCP_RETRY:
		case TCP_CONNECTING:
		case TCP_HELLO:
			tcp_out_progress(c, now);
			break;
		case TCP_GREET:
			tcp_greet_progress(c, now);
			break;
		case TCP_UP:
			if (c->b.sq.count || c->hs_out_off < c->hs_out_len)
				tcp_tx(c);
			/* Parked connections are read only once accepted. */
			if (c->b.owned && c->b.state == TCP_UP &&
			    (c->readable || tcp_rx_buffered(c)))
				tcp_rx(c);
			break;
		case TCP_FAILED:
			break;
		}
		if (c->b.state != TCP_FAILED)
			continue;
		if (c->b.owned)
			fr_tpb_flush_failed(c);
		else
			fr_tpb_conn_free(c); /* nobody will ever ask for it */
	}
}

/* ---- the operations ------------------------------------------------------ */

static int tcp_probe(char *errbuf, size_t errlen)
{
	return 0;
}

static int tcp_local_addr(const char *ip, struct sockaddr_storage *sa,
			  socklen_t *salen)
{
	struct addrinfo hints, *res;
	int ok;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
	if (getaddrinfo(ip ? ip : "0.0.0.0", "0", &hints, &res))
		return FR_EINVAL;
	ok = (res->ai_family == AF_INET || res->ai_family == AF_INET6) &&
	     res->ai_addrlen <= sizeof(*sa);
	if (ok) {
		memcpy(sa, res->ai_addr, res->ai_addrlen);
		*salen = res->ai_addrlen;
	}
	freeaddrinfo(res);
	return ok ? 0 : FR_EINVAL;
}

/* The blob peers use to reach us; a wildcard bind advertises loopback. */
static void tcp_addr_encode(uint8_t *b, const struct sockaddr_storage *sa)
{
	struct sockaddr_storage adv = *sa;

	if (adv.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&adv;

		if (in->sin_addr.s_addr == htonl(INADDR_ANY))
			in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&adv;

		if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
			in6->sin6_addr = in6addr_loopback;
	}
	fr_sockaddr_encode(b, TCP_ADDR_MAGIC, &adv);
}

static int tcp_addr_decode(const void *blob, size_t len,
			   struct sockaddr_storage *sa, socklen_t *salen)
{
	return fr_sockaddr_decode(blob, len, TCP_ADDR_MAGIC, sa, salen);
}

static int tcp_open(const struct fr_tp_params *params, struct fr_tp **out,
		    void *addr, size_t *addrlen)
{
	struct fr_tp_params p;
	struct sockaddr_storage sa;
	socklen_t salen;
	struct fr_tp *tp;
	const char *what;
	char where[96];
	int rc;

	rc = fr_tpb_open_params("tcp", params, &p, out, addr, addrlen,
				TCP_ADDR_LEN, TCP_MAX_SQ_DEPTH);
	if (rc)
		return rc;
	if (tcp_local_addr(p.local_ip, &sa, &salen)) {
		fr_tpb_open_err(
			"tcp", &p,
			"tcp: local address '%s' is not a numeric IP address",
			p.local_ip);
		return FR_EINVAL;
	}

	tp = fr_tpb_alloc(&tcp_class, &p, sizeof(*tp));
	if (!tp)
		return FR_ENOMEM;
	tp->b.cq = &tp->cq;
	if (tcp_rcvbuf_choose(tp)) {
		fr_tpb_open_fail(
			tp, &p,
			"tcp: FR_TCP_RCVBUF=\"%s\" is not a size (bytes, K/M allowed; 0: the kernel's autotuning)",
			getenv("FR_TCP_RCVBUF"));
		return FR_EINVAL;
	}

	tp->b.lfd = socket(sa.ss_family,
			   SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (tp->b.lfd < 0)
		return fr_tpb_open_fail(tp, &p, "tcp: socket: %s",
					fr_syserr(errno));
	/* accepted sockets inherit it, window scale included */
	tcp_set_rcvbuf(tp, tp->b.lfd);
	if (bind(tp->b.lfd, (struct sockaddr *)&sa, salen) ||
	    listen(tp->b.lfd, SOMAXCONN))
		return fr_tpb_open_fail(tp, &p, "tcp: cannot listen on %s: %s",
					p.local_ip ? p.local_ip : "0.0.0.0",
					fr_syserr(errno));
	salen = sizeof(sa);
	if (getsockname(tp->b.lfd, (struct sockaddr *)&sa, &salen))
		return fr_tpb_open_fail(tp, &p, "tcp: getsockname: %s",
					fr_syserr(errno));
	/* the listener's events come with data NULL, the wake's &b.wfd */
	if (fr_tpb_open_fds(&tp->b, &what))
		return fr_tpb_open_fail(tp, &p, "tcp: %s: %s", what,
					fr_syserr(errno));
	tcp_addr_encode(addr, &sa);
	*addrlen = TCP_ADDR_LEN;
	*out = tp;
	fr_dbg("tcp: rank %d listening on %s", tp->b.rank,
	       fr_sockaddr_str((struct sockaddr *)&sa, where, sizeof(where)));
	return 0;
}

static int tcp_connect(struct fr_tp *tp, int peer, const void *addr,
		       size_t addrlen, struct fr_tp_conn **out)
{
	struct fr_tp_conn *c;
	uint64_t now;
	int rc;

	if (!tp || !addr || !out || peer < 0)
		return FR_EINVAL;
	c = tcp_conn_new(tp);
	if (!c) {
		fr_tpb_seterr(&tp->b, FR_LOG_DEBUG, "out of memory");
		return FR_ENOMEM;
	}
	rc = tcp_addr_decode(addr, addrlen, &c->sa, &c->salen);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_WARN,
			      "malformed address blob for rank %d (%zu bytes)",
			      peer, addrlen);
		goto err_conn;
	}
	now = fr_tpb_conn_outgoing(c, peer, TCP_BACKOFF_MIN_MS);
	rc = tcp_start_connect(c, now);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_DEBUG, "connect to rank %d: %s",
			      peer, fr_syserr(c->b.last_errno));
		goto err_conn;
	}
	fr_tpb_conn_link(c);
	*out = c;
	return 0;

err_conn:
	fr_tpb_conn_destroy(c);
	return rc;
}

static int tcp_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *m)
{
	struct fr_tpb_mr *mr = fr_tpb_mr(m);
	struct fr_tp_conn *c;
	int rc;

	rc = fr_tpb_dereg_check(tp ? &tp->b : NULL, mr);
	if (rc)
		return rc;
	/* A write landing in it right now can never finish in place. */
	for (c = tp->b.conns; c; c = c->b.next)
		if (c->b.state == TCP_UP && c->rx_state == TCP_RX_DATA &&
		    c->rx_done < c->rx_len && c->rx_region == mr->id &&
		    c->rx_gen == mr->gen)
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"region %u deregistered while a write into it was arriving",
				mr->id);
	return fr_tpb_dereg_mem(tp, m);
}

static int tcp_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr,
			 size_t loff, const struct fr_tp_rkey *rkey,
			 uint64_t roff, size_t len, uint32_t imm, uint64_t ctx)
{
	struct fr_tpb_mr *mr = len ? fr_tpb_mr(lmr) : NULL;
	struct tcp_sqe *e;
	uint8_t *h;
	int rc;

	/* The peer's region bounds (rkey->a) are not checked: the receiver
	 * is the authority and checks every write itself. */
	rc = fr_tpb_write_check(c, lmr, loff, rkey, len);
	if (rc)
		return rc;
	e = fr_tpb_sq_at(&c->b.sq, c->b.sq.count);
	h = e->hdr;
	h[0] = TCP_VERSION;
	h[1] = TCP_OP_WRITE_IMM;
	fr_put_le16(h + 2, 0);
	fr_put_le32(h + 4, imm);
	fr_put_le32(h + 8, rkey ? rkey->c : 0);
	fr_put_le32(h + 12, rkey ? rkey->d : 0);
	fr_put_le64(h + 16, roff);
	fr_put_le32(h + 24, (uint32_t)len);
	fr_put_le32(h + 28, 0);
	e->payload = mr ? mr->base + loff : NULL;
	e->len = len;
	fr_tpb_sq_post(&c->b.sq, mr, ctx);
	/*
	 * Send at once when the queue was empty (the socket likely has
	 * room); behind older messages, the socket was full: leave it to poll.
	 */
	if (c->b.sq.count == 1)
		tcp_tx(c);
	return 0;
}

/* The events a connection needs wait() to watch for. */
static uint32_t tcp_want_events(const struct fr_tp_conn *c)
{
	bool out = c->hs_out_off < c->hs_out_len;

	if (c->fd < 0)
		return 0;
	switch (c->b.state) {
	case TCP_CONNECTING:
		return EPOLLOUT;
	case TCP_HELLO:
		return EPOLLIN | (out ? EPOLLOUT : 0);
	case TCP_GREET:
		return EPOLLIN;
	case TCP_UP:
		/* Parked: its data waits for accept(), do not wake on it. */
		if (!c->b.owned)
			return out ? EPOLLOUT : 0;
		/* EPOLLOUT only with pending sends, or every wait spins. */
		return EPOLLIN | (out || c->b.sq.count ? EPOLLOUT : 0);
	default:
		return 0;
	}
}

static int tcp_arm(struct fr_tp_conn *c, uint32_t want)
{
	struct epoll_event ev;
	int op;

	if (!want) {
		if (c->ep_added)
			epoll_ctl(c->b.tp->b.epfd, EPOLL_CTL_DEL, c->fd, NULL);
		c->ep_added = false;
		return 0;
	}
	if (c->ep_added && c->ep_events == want)
		return 0;
	op = c->ep_added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
	memset(&ev, 0, sizeof(ev));
	ev.events = want;
	ev.data.ptr = c;
	if (epoll_ctl(c->b.tp->b.epfd, op, c->fd, &ev))
		return FR_ESYS;
	c->ep_added = true;
	c->ep_events = want;
	return 0;
}

/*
 * Arm the epoll set for a sleep: 1 if something is ready now (do not
 * sleep), 0 when armed, < 0 on error; *t (ms, -1 forever) is lowered to
 * the nearest handshake deadline or retry.
 */
static int tcp_wait_prepare(struct fr_tp *tp, int *timeout_ms)
{
	int t = *timeout_ms < 0 ? -1 : *timeout_ms, rc;
	uint64_t now = fr_now_ms();

	rc = fr_tpb_wait_begin(tp);
	if (rc)
		return rc;
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		if (fr_tpb_owes(c))
			return 1;
		if (c->b.state == TCP_FAILED)
			continue;
		/* Handshakes have deadlines and retries: wake for them. */
		t = fr_tpb_due(c, t, now);
		if (tcp_arm(c, tcp_want_events(c))) {
			fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "epoll_ctl: %s",
				      fr_syserr(errno));
			return FR_ESYS;
		}
	}
	*timeout_ms = t;
	return 0;
}

static void tcp_wait_finish(struct fr_tp *tp)
{
	(void)tp; /* nothing armed that must be undone */
}

static int tcp_wait(struct fr_tp *tp, int timeout_ms)
{
	struct epoll_event ev[16];
	int t = timeout_ms, n, rc;

	rc = tcp_wait_prepare(tp, &t);
	if (rc)
		return rc < 0 ? rc : 0;
	n = epoll_wait(tp->b.epfd, ev, (int)FR_ARRAY_SIZE(ev), t);
	if (n < 0 && errno != EINTR) {
		fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "epoll_wait: %s",
			      fr_syserr(errno));
		return FR_ESYS;
	}
	for (int i = 0; i < n; i++)
		if (ev[i].data.ptr == &tp->b.wfd)
			fr_tpb_wake_drain(&tp->b);
	return 0;
}

const struct fr_tp_ops fr_tcp_ops =
	FR_TPB_OPS("tcp", tcp_probe, tcp_open, tcp_connect, tcp_dereg_mem,
		   tcp_write_imm, tcp_wait, tcp_wait_prepare, tcp_wait_finish);
