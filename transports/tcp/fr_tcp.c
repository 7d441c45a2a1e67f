/* SPDX-License-Identifier: MIT */
/*
 * fr_tcp.c - the TCP transport: one-sided write-with-immediate over sockets.
 * This file: the design, the wire format, the interface and the progress
 * pass; tcp_conn.c: connecting, the handshake, accepting; tcp_data.c: the
 * byte streams; tcp.h: what they share and who calls what.
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
 *   - A payload read in part when the socket runs dry sets SO_RCVLOWAT to
 *     what it still lacks, so that epoll wakes a sleeping wait once for
 *     the rest rather than once per arriving burst; the mark is back at 1
 *     before any header is awaited (tcp_data.c, tcp_rx_lowat).
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

#include "fastreduce.h"
#include "log.h"
#include "tcp.h"
#include "util.h"

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

/* Everything non-blocking, on every connection. */
static uint32_t tcp_want_events(const struct fr_tp_conn *c);
static int tcp_arm(struct fr_tp_conn *c, uint32_t want);

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
		c->readable = c->writable = false;
		if (c->b.state == TCP_UP && c->b.owned)
			tcp_arm(c, tcp_want_events(c));
	}
	n = epoll_wait(tp->b.epfd, ev, (int)FR_ARRAY_SIZE(ev), 0);
	if (n < 0 || n == (int)FR_ARRAY_SIZE(ev)) {
		/* Unsure: look at everything. */
		for (c = tp->b.conns; c; c = c->b.next)
			c->readable = c->writable = true;
		return true;
	}
	for (int i = 0; i < n; i++) {
		c = ev[i].data.ptr;
		if (ev[i].data.ptr == &tp->b.wfd)
			fr_tpb_wake_drain(&tp->b);
		else if (!c)
			listener = true;
		else {
			if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				c->readable = true;
			if (ev[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
				c->writable = true;
		}
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
			if ((c->b.sq.count || c->hs_out_off < c->hs_out_len) &&
			    (!c->tx_full || c->writable))
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

const struct fr_tp_ops fr_tcp_ops = FR_TPB_OPS(
	"tcp", tcp_probe, tcp_open, tcp_connect, tcp_dereg_mem, tcp_write_imm,
	NULL, tcp_wait, tcp_wait_prepare, tcp_wait_finish);
