/* SPDX-License-Identifier: MIT */
/*
 * tcp_conn.c - the TCP transport's connections: socket options (no delay,
 * receive buffer), connect with retries and deadlines, the hello and the
 * reply (job nonce, duplicate ranks), incoming connections parked until
 * accept() hands them out, the address blob.  The design and the wire
 * format are in fr_tcp.c, the declarations in tcp.h.  Calls the transport
 * base, and tcp_data.c to send the reply.
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

#include "fastreduce.h"
#include "log.h"
#include "tcp.h"
#include "util.h"

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
int tcp_rcvbuf_choose(struct fr_tp *tp)
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

void tcp_set_rcvbuf(const struct fr_tp *tp, int fd)
{
	if (tp->rcvbuf && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->rcvbuf,
				     sizeof(tp->rcvbuf)))
		fr_dbg("tcp: SO_RCVBUF %d: %s", tp->rcvbuf, fr_syserr(errno));
}

/* ---- connections: life cycle --------------------------------------------- */

struct fr_tp_conn *tcp_conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c =
		fr_tpb_conn_new(tp, sizeof(*c), sizeof(struct tcp_sqe));

	if (c) {
		c->fd = -1;
		c->rx_state = TCP_RX_HDR;
		c->rx_lowat = 1;
	}
	return c;
}

void tcp_close_fd(struct fr_tp_conn *c)
{
	if (c->fd < 0)
		return;
	if (c->ep_added)
		epoll_ctl(c->b.tp->b.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	c->ep_added = false;
	close(c->fd);
	c->fd = -1;
}

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
int tcp_start_connect(struct fr_tp_conn *c, uint64_t now)
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
void tcp_out_progress(struct fr_tp_conn *c, uint64_t now)
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
void tcp_accept_new(struct fr_tp *tp, uint64_t now)
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

/* Read and judge an incoming connection's hello. */
void tcp_greet_progress(struct fr_tp_conn *c, uint64_t now)
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

int tcp_local_addr(const char *ip, struct sockaddr_storage *sa,
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
void tcp_addr_encode(uint8_t *b, const struct sockaddr_storage *sa)
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

int tcp_addr_decode(const void *blob, size_t len, struct sockaddr_storage *sa,
		    socklen_t *salen)
{
	return fr_sockaddr_decode(blob, len, TCP_ADDR_MAGIC, sa, salen);
}
