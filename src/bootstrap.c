/* SPDX-License-Identifier: MIT */
/*
 * bootstrap.c - the TCP rendezvous (see bootstrap.h for the protocol).
 *
 * Payloads (all integers little-endian):
 *   HELLO   u32 rank, u32 nranks, u16 token_len, token, u16 config_len,
 *           config, u16 card_len, card
 *   WELCOME u64 nonce, u32 nranks, nranks x (u16 card_len, card)
 *   REJECT  i32 code, u16 msg_len, msg
 *   JOIN    u16 token_len, token              (re-admission, at the end)
 *   TICKET  u32 rank, u32 nranks, u64 nonce
 *
 * Rank 0 serves every connection from one poll() loop with non-blocking
 * sockets, so a stranger that connects and says nothing, or says garbage,
 * costs a file descriptor until it is dropped, never a hang: only the
 * overall timeout bounds the rendezvous.  Strangers (wrong token, wrong
 * magic, bad rank) are refused one by one and the rendezvous goes on;
 * a genuine rank that disagrees with rank 0 about the job (size, config)
 * fails the whole job with a message naming it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "fastreduce.h"
#include "log.h"
#include "util.h"

/*
 * Pending (unidentified) connections rank 0 keeps: one for every other rank
 * plus this many strangers, before it drops the oldest.  A rank connects
 * as soon as it starts and says HELLO only once its transport is up, which
 * takes seconds when a hundred ranks start at once on two cores: with room
 * for strangers only, rank 0 dropped genuine ranks (63 of 128 missing).
 */
#define BOOT_SPARE_PENDING 64
/* Times a rank says HELLO on a connection rank 0 closes unanswered. */
#define BOOT_RETRIES 10

struct boot_conn {
	int fd;
	uint8_t hdr[FR_BOOT_HDR];
	uint8_t *buf; /* payload */
	uint32_t plen;
	size_t have;  /* bytes of header + payload read */
	bool ready;   /* poll() said it has something (or it is new) */
	struct fr_boot_hello *hello;
};

struct fr_boot {
	struct fr_boot_params p;
	uint64_t deadline_ms;
	char local_ip[64];
	int fd; /* rank 0: listening socket; others: connection to rank 0 */
	uint32_t rtt_us; /* others: how long the connect to rank 0 took */
	/* rank 0 */
	struct boot_conn *pending; /* [max_pending] */
	int npending, max_pending;
	struct pollfd *pfd;	 /* [1 + max_pending] */
	struct boot_conn *ranks; /* [nranks], ranks[0] unused */
};

/* ---- codecs --------------------------------------------------------------- */

int fr_boot_parse_header(const uint8_t *buf, size_t len, uint16_t *type,
			 uint32_t *plen)
{
	if (len < FR_BOOT_HDR)
		return FR_EPROTO;
	if (fr_get_le32(buf) != FR_BOOT_MAGIC ||
	    fr_get_le16(buf + 4) != FR_BOOT_VERSION)
		return FR_EPROTO;
	*type = fr_get_le16(buf + 6);
	*plen = fr_get_le32(buf + 8);
	if (*type < FR_BOOT_HELLO || *type > FR_BOOT_TICKET ||
	    *plen > FR_BOOT_PAYLOAD_MAX)
		return FR_EPROTO;
	return 0;
}

size_t fr_boot_put_header(uint8_t *buf, uint16_t type, uint32_t plen)
{
	fr_put_le32(buf, FR_BOOT_MAGIC);
	fr_put_le16(buf + 4, FR_BOOT_VERSION);
	fr_put_le16(buf + 6, type);
	fr_put_le32(buf + 8, plen);
	return FR_BOOT_HDR;
}

/* A bounds-checked reader over a payload. */
struct rd {
	const uint8_t *p;
	size_t len, off;
	bool bad;
};

static const uint8_t *rd_take(struct rd *r, size_t n)
{
	const uint8_t *q;

	if (r->bad || r->len - r->off < n) {
		r->bad = true;
		return NULL;
	}
	q = r->p + r->off;
	r->off += n;
	return q;
}

static uint16_t rd_u16(struct rd *r)
{
	const uint8_t *q = rd_take(r, 2);

	return q ? fr_get_le16(q) : 0;
}

static uint32_t rd_u32(struct rd *r)
{
	const uint8_t *q = rd_take(r, 4);

	return q ? fr_get_le32(q) : 0;
}

static uint64_t rd_u64(struct rd *r)
{
	const uint8_t *q = rd_take(r, 8);

	return q ? fr_get_le64(q) : 0;
}

/* A length-prefixed byte string of at most max bytes. */
static int rd_str(struct rd *r, void *dst, size_t max, uint16_t *outlen)
{
	uint16_t n = rd_u16(r);
	const uint8_t *q;

	if (r->bad || n > max)
		return FR_EPROTO;
	q = rd_take(r, n);
	if (!q)
		return FR_EPROTO;
	memcpy(dst, q, n);
	*outlen = n;
	return 0;
}

int fr_boot_parse_hello(const uint8_t *p, size_t len, struct fr_boot_hello *h)
{
	struct rd r = { p, len, 0, false };

	memset(h, 0, sizeof(*h));
	h->rank = rd_u32(&r);
	h->nranks = rd_u32(&r);
	if (rd_str(&r, h->token, FR_BOOT_TOKEN_MAX, &h->token_len) ||
	    rd_str(&r, h->config, FR_BOOT_CONFIG_MAX, &h->config_len) ||
	    rd_str(&r, h->card.data, FR_BOOT_CARD_MAX, &h->card.len))
		return FR_EPROTO;
	if (r.bad || r.off != len)
		return FR_EPROTO;
	h->token[h->token_len] = '\0';
	h->config[h->config_len] = '\0';
	if (memchr(h->token, '\0', h->token_len) ||
	    memchr(h->config, '\0', h->config_len))
		return FR_EPROTO;
	return 0;
}

int fr_boot_build_hello(const struct fr_boot_hello *h, uint8_t *buf,
			size_t len)
{
	size_t need = 8 + 2 + h->token_len + 2 + h->config_len + 2 + h->card.len;
	uint8_t *q = buf;

	if (h->token_len > FR_BOOT_TOKEN_MAX ||
	    h->config_len > FR_BOOT_CONFIG_MAX ||
	    h->card.len > FR_BOOT_CARD_MAX || len < FR_BOOT_HDR + need)
		return FR_EINVAL;
	q += fr_boot_put_header(q, FR_BOOT_HELLO, (uint32_t)need);
	fr_put_le32(q, h->rank);
	fr_put_le32(q + 4, h->nranks);
	q += 8;
	fr_put_le16(q, h->token_len);
	memcpy(q + 2, h->token, h->token_len);
	q += 2 + h->token_len;
	fr_put_le16(q, h->config_len);
	memcpy(q + 2, h->config, h->config_len);
	q += 2 + h->config_len;
	fr_put_le16(q, h->card.len);
	memcpy(q + 2, h->card.data, h->card.len);
	q += 2 + h->card.len;
	return (int)(q - buf);
}

int fr_boot_parse_welcome(const uint8_t *p, size_t len, uint32_t nranks,
			  uint64_t *nonce, struct fr_boot_card *cards)
{
	struct rd r = { p, len, 0, false };

	*nonce = rd_u64(&r);
	if (rd_u32(&r) != nranks || r.bad)
		return FR_EPROTO;
	for (uint32_t i = 0; i < nranks; i++)
		if (rd_str(&r, cards[i].data, FR_BOOT_CARD_MAX, &cards[i].len))
			return FR_EPROTO;
	if (r.off != len)
		return FR_EPROTO;
	return 0;
}

int fr_boot_parse_reject(const uint8_t *p, size_t len, int32_t *code,
			 char *msg, size_t msglen)
{
	struct rd r = { p, len, 0, false };
	uint16_t n;
	const uint8_t *q;

	*code = (int32_t)rd_u32(&r);
	n = rd_u16(&r);
	q = rd_take(&r, n);
	if (!q || r.off != len || msglen == 0)
		return FR_EPROTO;
	if (n >= msglen)
		n = (uint16_t)(msglen - 1);
	memcpy(msg, q, n);
	msg[n] = '\0';
	/* The message is shown to a person: keep it printable. */
	for (uint16_t i = 0; i < n; i++)
		if ((unsigned char)msg[i] < 0x20 || (unsigned char)msg[i] > 0x7e)
			msg[i] = '?';
	if (*code >= 0)
		*code = FR_EBOOTSTRAP;
	return 0;
}

/* ---- socket helpers ---------------------------------------------------------- */

static int remaining_ms(const struct fr_boot *b)
{
	uint64_t now = fr_now_ms();

	return now >= b->deadline_ms ? 0 : (int)(b->deadline_ms - now);
}

static void set_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Write all of buf before the deadline. */
static int send_all(struct fr_boot *b, int fd, const uint8_t *buf, size_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return FR_EPEER;
		struct pollfd pfd = { fd, POLLOUT, 0 };
		int ms = remaining_ms(b);

		if (!ms || poll(&pfd, 1, ms) == 0)
			return FR_ETIMEDOUT;
	}
	return 0;
}

/* Read exactly len bytes before the deadline. */
static int recv_all(struct fr_boot *b, int fd, uint8_t *buf, size_t len)
{
	while (len) {
		ssize_t n = recv(fd, buf, len, 0);

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return FR_EPEER;
		if (errno != EAGAIN && errno != EINTR)
			return FR_EPEER;
		struct pollfd pfd = { fd, POLLIN, 0 };
		int ms = remaining_ms(b);

		if (!ms || poll(&pfd, 1, ms) == 0)
			return FR_ETIMEDOUT;
	}
	return 0;
}

static void send_reject(struct fr_boot *b, int fd, int code, const char *msg)
{
	uint8_t buf[FR_BOOT_HDR + 6 + 400];
	size_t n = strlen(msg);

	if (n > 400)
		n = 400;
	fr_boot_put_header(buf, FR_BOOT_REJECT, (uint32_t)(6 + n));
	fr_put_le32(buf + FR_BOOT_HDR, (uint32_t)code);
	fr_put_le16(buf + FR_BOOT_HDR + 4, (uint16_t)n);
	memcpy(buf + FR_BOOT_HDR + 6, msg, n);
	/* Best effort: the peer may already be gone. */
	send(fd, buf, FR_BOOT_HDR + 6 + n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void conn_close(struct boot_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->buf);
	free(c->hello);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static int fail(struct fr_boot *b, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct fr_boot *b, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->p.err, b->p.errlen, fmt, ap);
	va_end(ap);
	return code;
}

/* ---- rank 0 ------------------------------------------------------------------- */

static int listen_on(struct fr_boot *b)
{
	char host[256];
	uint16_t port;
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, fd;

	if (fr_parse_hostport(b->p.rendezvous, host, sizeof(host), &port) ||
	    fr_resolve(host, port, &ss, &sl))
		return fail(b, FR_EINVAL, "cannot resolve rendezvous \"%s\"",
			    b->p.rendezvous);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(b, FR_ESYS, "socket: %s", fr_syserr(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 1024)) {
		int e = errno;

		close(fd);
		return fail(b, FR_EBOOTSTRAP,
			    "rank 0 cannot serve the rendezvous at %s: %s",
			    b->p.rendezvous, fr_syserr(e));
	}
	set_nonblock(fd);
	b->fd = fd;
	return 0;
}

/* Read what is available on a pending connection.  1 when a whole message
 * is in, 0 for more later, negative to drop the connection. */
static int pending_read(struct boot_conn *c)
{
	for (;;) {
		uint8_t *dst;
		size_t want;
		ssize_t n;
		uint16_t type;

		if (c->have < FR_BOOT_HDR) {
			dst = c->hdr + c->have;
			want = FR_BOOT_HDR - c->have;
		} else {
			if (!c->buf) {
				if (fr_boot_parse_header(c->hdr, FR_BOOT_HDR,
							 &type, &c->plen) ||
				    type != FR_BOOT_HELLO ||
				    c->plen > 16 + FR_BOOT_TOKEN_MAX +
						      FR_BOOT_CONFIG_MAX +
						      FR_BOOT_CARD_MAX)
					return FR_EPROTO;
				c->buf = malloc(c->plen ? c->plen : 1);
				if (!c->buf)
					return FR_ENOMEM;
			}
			if (c->have == FR_BOOT_HDR + c->plen)
				return 1;
			dst = c->buf + (c->have - FR_BOOT_HDR);
			want = FR_BOOT_HDR + c->plen - c->have;
		}
		n = recv(c->fd, dst, want, 0);
		if (n == 0)
			return FR_EPEER;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : FR_EPEER;
		c->have += (size_t)n;
	}
}

/* A whole HELLO arrived on pending[i]: adopt it as its rank or refuse it. */
static int pending_adopt(struct fr_boot *b, struct boot_conn *c)
{
	struct fr_boot_hello *h = calloc(1, sizeof(*h));
	const char *tok = b->p.token ? b->p.token : "";
	char msg[256];

	if (!h)
		return FR_ENOMEM;
	c->hello = h;
	if (fr_boot_parse_hello(c->buf, c->plen, h)) {
		fr_warn("rendezvous: dropped a connection with a malformed hello");
		return FR_EPROTO;
	}
	/* constant time: the reply's timing says nothing of the token */
	if (!fr_ct_equal(h->token, h->token_len, tok, strlen(tok))) {
		fr_warn("rendezvous: refused a connection claiming rank %u: wrong job token",
			h->rank);
		send_reject(b, c->fd, FR_EAUTH, "wrong job token (FR_JOB_TOKEN)");
		return FR_EAUTH;
	}
	if (h->nranks != (uint32_t)b->p.nranks) {
		snprintf(msg, sizeof(msg),
			 "rank %u was started for %u ranks, rank 0 for %d",
			 h->rank, h->nranks, b->p.nranks);
		send_reject(b, c->fd, FR_EBOOTSTRAP, msg);
		snprintf(b->p.err, b->p.errlen, "rendezvous: %s", msg);
		return 1; /* fatal for the job */
	}
	if (h->rank == 0 || h->rank >= (uint32_t)b->p.nranks ||
	    b->ranks[h->rank].fd >= 0) {
		snprintf(msg, sizeof(msg), "rank %u is %s", h->rank,
			 h->rank == 0 || h->rank >= (uint32_t)b->p.nranks ?
				 "out of range" :
				 "already taken");
		fr_warn("rendezvous: refused a connection: %s", msg);
		send_reject(b, c->fd, FR_EBOOTSTRAP, msg);
		return FR_EINVAL;
	}
	b->ranks[h->rank] = *c;
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	return 0;
}

static int serve(struct fr_boot *b)
{
	int missing = b->p.nranks - 1;
	struct pollfd *pfd = b->pfd;

	while (missing > 0) {
		int nfds = 0, ms = remaining_ms(b), pr;

		if (!ms) {
			int r = 1;

			while (r < b->p.nranks && b->ranks[r].fd >= 0)
				r++;
			snprintf(b->p.err, b->p.errlen,
				 "rendezvous timed out: %d of %d ranks missing (first: rank %d)",
				 missing, b->p.nranks, r);
			return FR_ETIMEDOUT;
		}
		pfd[nfds++] = (struct pollfd){ b->fd, POLLIN, 0 };
		for (int i = 0; i < b->npending; i++)
			pfd[nfds++] = (struct pollfd){ b->pending[i].fd, POLLIN, 0 };
		pr = poll(pfd, (nfds_t)nfds, ms > 100 ? 100 : ms);
		if (pr < 0 && errno != EINTR)
			return FR_ESYS;
		/* read only the connections that have something: not a
		 * recv on each of a thousand pending ones per wake-up */
		for (int i = 0; i < b->npending; i++)
			b->pending[i].ready = pr < 0 || pfd[1 + i].revents;
		/* Accept everything waiting; drop the oldest when full. */
		for (;;) {
			int fd = accept4(b->fd, NULL, NULL,
					 SOCK_NONBLOCK | SOCK_CLOEXEC);

			/* out of descriptors does not pass: fail now rather
			 * than spin until the timeout */
			if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
				snprintf(b->p.err, b->p.errlen,
					 "rank 0 cannot accept the other ranks' connections: %s",
					 fr_syserr(errno));
				return FR_ESYS;
			}
			if (fd < 0)
				break;
			if (b->npending == b->max_pending) {
				conn_close(&b->pending[0]);
				memmove(&b->pending[0], &b->pending[1],
					sizeof(b->pending[0]) *
						(size_t)(b->max_pending - 1));
				b->npending--;
			}
			memset(&b->pending[b->npending], 0,
			       sizeof(b->pending[0]));
			b->pending[b->npending].ready = true;
			b->pending[b->npending++].fd = fd;
		}
		for (int i = 0; i < b->npending; i++) {
			struct boot_conn *c = &b->pending[i];
			int rc;

			if (!c->ready)
				continue;
			rc = pending_read(c);

			if (rc == 1) {
				rc = pending_adopt(b, c);
				if (rc == 1)
					return FR_EBOOTSTRAP;
				if (rc == 0)
					missing--;
			}
			if (rc == 0 && c->fd >= 0)
				continue;
			if (c->fd >= 0)
				conn_close(c);
			memmove(c, c + 1,
				sizeof(*c) * (size_t)(b->npending - i - 1));
			b->npending--;
			i--;
		}
	}
	return 0;
}

static int begin_root(struct fr_boot *b)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int rc;

	b->ranks = calloc((size_t)b->p.nranks, sizeof(*b->ranks));
	if (!b->ranks)
		return FR_ENOMEM;
	for (int r = 0; r < b->p.nranks; r++)
		b->ranks[r].fd = -1;
	snprintf(b->local_ip, sizeof(b->local_ip), "127.0.0.1");
	if (b->p.nranks == 1)
		return 0;
	b->max_pending = b->p.nranks - 1 + BOOT_SPARE_PENDING;
	b->pending = calloc((size_t)b->max_pending, sizeof(*b->pending));
	b->pfd = calloc((size_t)b->max_pending + 1, sizeof(*b->pfd));
	if (!b->pending || !b->pfd)
		return FR_ENOMEM;
	rc = listen_on(b);
	if (rc)
		return rc;
	rc = serve(b);
	if (rc)
		return rc;
	/* Our address as rank 1 sees it is the one to advertise. */
	if (!getsockname(b->ranks[1].fd, (struct sockaddr *)&ss, &sl))
		fr_sockaddr_ip((struct sockaddr *)&ss, b->local_ip,
			       sizeof(b->local_ip));
	return 0;
}

static int exchange_root(struct fr_boot *b, const char *config,
			 const struct fr_boot_card *mine,
			 struct fr_boot_card *cards, uint64_t *nonce)
{
	size_t plen = 12, off;
	uint8_t *buf;
	int rc = 0;

	if (getrandom(nonce, sizeof(*nonce), 0) != sizeof(*nonce))
		*nonce = fr_now_ns() ^ ((uint64_t)getpid() << 32);
	cards[0] = *mine;
	for (int r = 1; r < b->p.nranks; r++) {
		struct fr_boot_hello *h = b->ranks[r].hello;

		if (strcmp(h->config, config)) {
			char msg[FR_BOOT_CONFIG_MAX * 2 + 64];

			snprintf(msg, sizeof(msg),
				 "rank %d runs with \"%s\" but rank 0 with \"%s\"",
				 r, h->config, config);
			snprintf(b->p.err, b->p.errlen, "rendezvous: %s", msg);
			for (int q = 1; q < b->p.nranks; q++)
				send_reject(b, b->ranks[q].fd, FR_EBOOTSTRAP,
					    msg);
			return FR_EBOOTSTRAP;
		}
		cards[r] = h->card;
	}
	for (int r = 0; r < b->p.nranks; r++)
		plen += 2 + cards[r].len;
	buf = malloc(FR_BOOT_HDR + plen);
	if (!buf)
		return FR_ENOMEM;
	off = fr_boot_put_header(buf, FR_BOOT_WELCOME, (uint32_t)plen);
	fr_put_le64(buf + off, *nonce);
	fr_put_le32(buf + off + 8, (uint32_t)b->p.nranks);
	off += 12;
	for (int r = 0; r < b->p.nranks; r++) {
		fr_put_le16(buf + off, cards[r].len);
		memcpy(buf + off + 2, cards[r].data, cards[r].len);
		off += 2 + cards[r].len;
	}
	for (int r = 1; r < b->p.nranks && !rc; r++) {
		rc = send_all(b, b->ranks[r].fd, buf, off);
		if (rc)
			snprintf(b->p.err, b->p.errlen,
				 "rendezvous: sending the rank table to rank %d failed: %s",
				 r, fr_strerror(rc));
	}
	free(buf);
	return rc ? FR_EBOOTSTRAP : 0;
}

/* ---- other ranks ------------------------------------------------------------ */

/*
 * The handshake that connected us is one round trip to rank 0: the
 * network's latency, for the cost model (comm.c, fr_tune_link).  The
 * kernel timed it when the SYN-ACK came in (TCP_INFO's rtt), untouched by
 * how late this process got to run afterwards on a busy host; where it
 * cannot say, the time since connect().
 */
static uint32_t handshake_rtt_us(int fd, uint64_t t0)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	uint64_t us = (fr_now_ns() - t0) / 1000u;

	memset(&ti, 0, sizeof(ti));
	if (!getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) &&
	    len >= offsetof(struct tcp_info, tcpi_rtt) + sizeof(ti.tcpi_rtt) &&
	    ti.tcpi_rtt)
		us = ti.tcpi_rtt;
	return (uint32_t)FR_MIN(us, (uint64_t)UINT32_MAX);
}

/*
 * Connect to rank 0, retrying with back-off until the deadline: it may not
 * listen yet.  again: we reached it before and it closed on us (it was
 * starting a hundred ranks, or dropped us for a stranger's sake); then a
 * refused connection means it is gone, and we say so at once.
 */
static int connect_root(struct fr_boot *b, bool again)
{
	char host[256];
	uint16_t port;
	struct sockaddr_storage ss;
	socklen_t sl;
	int delay_ms = 10, last_errno = 0;
	uint64_t t0;

	if (fr_parse_hostport(b->p.rendezvous, host, sizeof(host), &port) ||
	    fr_resolve(host, port, &ss, &sl))
		return fail(b, FR_EINVAL, "cannot resolve rendezvous \"%s\"",
			    b->p.rendezvous);
	for (;;) {
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int ms;

		if (fd < 0)
			return fail(b, FR_ESYS, "socket: %s",
				    fr_syserr(errno));
		set_nonblock(fd);
		t0 = fr_now_ns();
		if (connect(fd, (struct sockaddr *)&ss, sl) == 0 ||
		    errno == EINPROGRESS) {
			struct pollfd pfd = { fd, POLLOUT, 0 };
			int err = 0;
			socklen_t el = sizeof(err);

			ms = remaining_ms(b);
			if (ms && poll(&pfd, 1, ms) == 1 &&
			    !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) &&
			    !err) {
				b->fd = fd;
				b->rtt_us = handshake_rtt_us(fd, t0);
				return 0;
			}
			last_errno = err ? err : ETIMEDOUT;
		} else {
			last_errno = errno;
		}
		close(fd);
		ms = remaining_ms(b);
		if (again && last_errno == ECONNREFUSED) {
			snprintf(
				b->p.err, b->p.errlen,
				"rank %d: rank 0 closed the rendezvous at %s and no longer listens (it failed or gave up)",
				b->p.rank, b->p.rendezvous);
			return FR_EBOOTSTRAP;
		}
		if (!ms) {
			snprintf(b->p.err, b->p.errlen,
				 "rank %d: cannot reach the rendezvous at %s: %s",
				 b->p.rank, b->p.rendezvous,
				 fr_syserr(last_errno));
			return FR_ETIMEDOUT;
		}
		usleep((useconds_t)FR_MIN(delay_ms, ms) * 1000u);
		delay_ms = FR_MIN(delay_ms * 2, 500);
	}
}

static int begin_client(struct fr_boot *b)
{
	struct sockaddr_storage me;
	socklen_t ml = sizeof(me);
	int rc = connect_root(b, false);

	if (rc)
		return rc;
	if (!getsockname(b->fd, (struct sockaddr *)&me, &ml))
		fr_sockaddr_ip((struct sockaddr *)&me, b->local_ip,
			       sizeof(b->local_ip));
	return 0;
}

static int exchange_client(struct fr_boot *b, const char *config,
			   const struct fr_boot_card *mine,
			   struct fr_boot_card *cards, uint64_t *nonce)
{
	struct fr_boot_hello *h;
	uint8_t hdr[FR_BOOT_HDR], *buf = NULL;
	uint16_t type;
	uint32_t plen;
	int rc, n;

	h = calloc(1, sizeof(*h));
	buf = malloc(FR_BOOT_HDR + 16 + FR_BOOT_TOKEN_MAX + FR_BOOT_CONFIG_MAX +
		     FR_BOOT_CARD_MAX);
	if (!h || !buf) {
		rc = FR_ENOMEM;
		goto out;
	}
	h->rank = (uint32_t)b->p.rank;
	h->nranks = (uint32_t)b->p.nranks;
	h->token_len = (uint16_t)strlen(b->p.token ? b->p.token : "");
	memcpy(h->token, b->p.token ? b->p.token : "", h->token_len);
	h->config_len = (uint16_t)strlen(config);
	memcpy(h->config, config, h->config_len);
	h->card = *mine;
	n = fr_boot_build_hello(h, buf,
				FR_BOOT_HDR + 16 + FR_BOOT_TOKEN_MAX +
					FR_BOOT_CONFIG_MAX + FR_BOOT_CARD_MAX);
	/* A connection closed before any reply (rank 0 dropped it, or it
	 * broke while rank 0 was busy starting everyone) is made again and
	 * the HELLO said again, until the deadline.  A rank 0 that refused
	 * us says why (REJECT) and is not asked twice. */
	for (int tries = 1;; tries++) {
		int ms;

		rc = n < 0 ? n : send_all(b, b->fd, buf, (size_t)n);
		if (!rc)
			rc = recv_all(b, b->fd, hdr, sizeof(hdr));
		if (rc != FR_EPEER)
			break;
		/* pushed out once or twice by a crowd is normal; every
		 * time, rank 0 does not take what we send (another version
		 * of the library, say): say so rather than time out */
		if (tries == BOOT_RETRIES) {
			snprintf(
				b->p.err, b->p.errlen,
				"rank %d: rank 0 at %s closed our connection %d times before replying (another job, or another version of the library?)",
				b->p.rank, b->p.rendezvous, tries);
			rc = FR_EBOOTSTRAP;
			goto out;
		}
		fr_dbg("rendezvous: rank 0 closed our connection before replying; connecting again");
		close(b->fd);
		b->fd = -1;
		ms = remaining_ms(b);
		usleep((useconds_t)FR_MIN(10 << FR_MIN(tries, 6), ms) * 1000u);
		rc = connect_root(b, true);
		if (rc)
			goto out;
	}
	if (rc) {
		snprintf(b->p.err, b->p.errlen,
			 "rank %d: rendezvous with rank 0 at %s failed: %s",
			 b->p.rank, b->p.rendezvous, fr_strerror(rc));
		rc = rc == FR_ETIMEDOUT ? rc : FR_EBOOTSTRAP;
		goto out;
	}
	rc = fr_boot_parse_header(hdr, sizeof(hdr), &type, &plen);
	if (rc || type == FR_BOOT_HELLO) {
		snprintf(b->p.err, b->p.errlen,
			 "rank %d: malformed reply from the rendezvous at %s",
			 b->p.rank, b->p.rendezvous);
		rc = FR_EPROTO;
		goto out;
	}
	free(buf);
	buf = malloc(plen ? plen : 1);
	if (!buf) {
		rc = FR_ENOMEM;
		goto out;
	}
	rc = recv_all(b, b->fd, buf, plen);
	if (rc) {
		snprintf(b->p.err, b->p.errlen,
			 "rank %d: rendezvous reply truncated: %s", b->p.rank,
			 fr_strerror(rc));
		goto out;
	}
	if (type == FR_BOOT_REJECT) {
		int32_t code;
		char msg[420];

		rc = fr_boot_parse_reject(buf, plen, &code, msg, sizeof(msg));
		snprintf(b->p.err, b->p.errlen,
			 "rank %d: rank 0 refused us: %s", b->p.rank,
			 rc ? "(malformed reason)" : msg);
		rc = rc ? FR_EPROTO : code;
		goto out;
	}
	rc = fr_boot_parse_welcome(buf, plen, (uint32_t)b->p.nranks, nonce,
				   cards);
	if (rc)
		snprintf(b->p.err, b->p.errlen,
			 "rank %d: malformed rank table from the rendezvous",
			 b->p.rank);
out:
	free(buf);
	free(h);
	return rc;
}

/* ---- entry points ----------------------------------------------------------- */

int fr_boot_begin(const struct fr_boot_params *p, struct fr_boot **boot)
{
	struct fr_boot *b = calloc(1, sizeof(*b));
	int rc;

	if (!b)
		return FR_ENOMEM;
	b->p = *p;
	b->fd = -1;
	b->deadline_ms = fr_now_ms() + (uint64_t)p->timeout_ms;
	if (p->token && strlen(p->token) > FR_BOOT_TOKEN_MAX) {
		snprintf(p->err, p->errlen, "job token longer than %d bytes",
			 FR_BOOT_TOKEN_MAX);
		free(b);
		return FR_EINVAL;
	}
	rc = p->rank == 0 ? begin_root(b) : begin_client(b);
	if (rc) {
		fr_boot_end(b);
		return rc;
	}
	*boot = b;
	return 0;
}

const char *fr_boot_local_ip(const struct fr_boot *boot)
{
	return boot->local_ip;
}

uint32_t fr_boot_rtt_us(const struct fr_boot *boot)
{
	return boot->rtt_us;
}

int fr_boot_exchange(struct fr_boot *boot, const char *config,
		     const struct fr_boot_card *mine, struct fr_boot_card *cards,
		     uint64_t *nonce)
{
	if (strlen(config) > FR_BOOT_CONFIG_MAX)
		return FR_EINVAL;
	if (boot->p.rank == 0)
		return exchange_root(boot, config, mine, cards, nonce);
	return exchange_client(boot, config, mine, cards, nonce);
}

/* ---- re-admission tickets
 * ---------------------------------------------------- */

/* Read one whole message of type want (or a REJECT) into buf before the
 * deadline: its payload length, or a negative code. */
static int recv_msg(struct fr_boot *b, int fd, uint16_t want, uint8_t *buf,
		    size_t max, uint16_t *type)
{
	uint8_t hdr[FR_BOOT_HDR];
	uint32_t plen;
	int rc = recv_all(b, fd, hdr, sizeof(hdr));

	if (rc)
		return rc;
	if (fr_boot_parse_header(hdr, sizeof(hdr), type, &plen) ||
	    (*type != want && *type != FR_BOOT_REJECT) || plen > max)
		return FR_EPROTO;
	rc = recv_all(b, fd, buf, plen);
	return rc ? rc : (int)plen;
}

int fr_boot_tickets_serve(const char *addr, const char *token, uint32_t first,
			  int count, uint32_t nranks, uint64_t nonce,
			  int timeout_ms, void (*idle)(void *), void *arg,
			  int *served, char *err, size_t errlen)
{
	struct fr_boot b = {.fd = -1};
	const char *tok = token ? token : "";
	uint8_t buf[FR_BOOT_HDR + 2 + FR_BOOT_TOKEN_MAX];
	int *held, nheld = 0, rc = 0;

	*served = 0;
	if (count < 1)
		return FR_EINVAL;
	held = calloc((size_t)count, sizeof(*held));
	if (!held)
		return FR_ENOMEM;
	b.p.rendezvous = addr;
	b.p.err = err;
	b.p.errlen = errlen;
	b.deadline_ms = fr_now_ms() + (uint64_t)timeout_ms;
	rc = listen_on(&b);
	if (rc)
		goto out_free;
	/* The tickets go out together, once all newcomers are in: a newcomer
	 * goes on to the grown communicator's bootstrap at this very address
	 * as soon as it has its ticket, and must not find this listener. */
	while (nheld < count) {
		struct pollfd pfd = {b.fd, POLLIN, 0};
		struct fr_boot one = b;
		uint16_t type, tl;
		int fd, ms = remaining_ms(&b), n;

		if (!ms) {
			rc = fail(&b, FR_ETIMEDOUT,
				  "%d of %d newcomers came within %d ms", nheld,
				  count, timeout_ms);
			goto out_close;
		}
		if (idle)
			idle(arg);
		if (poll(&pfd, 1, FR_MIN(ms, 100)) <= 0)
			continue;
		fd = accept4(b.fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			usleep(10000); /* EMFILE and the like: no spinning */
			continue;
		}
		/* a newcomer says JOIN as soon as it is connected: a stranger
		 * that says nothing costs at most 500 ms */
		one.deadline_ms = FR_MIN(b.deadline_ms, fr_now_ms() + 500);
		n = recv_msg(&one, fd, FR_BOOT_JOIN, buf, sizeof(buf), &type);
		if (n < 2 || type != FR_BOOT_JOIN ||
		    (tl = fr_get_le16(buf)) != (uint32_t)n - 2) {
			fr_warn("grow: dropped a connection that did not ask for a ticket");
			close(fd);
			continue;
		}
		if (!fr_ct_equal((const char *)buf + 2, tl, tok, strlen(tok))) {
			fr_warn("grow: refused a newcomer: wrong job token");
			send_reject(&b, fd, FR_EAUTH,
				    "wrong job token (FR_JOB_TOKEN)");
			close(fd);
			continue;
		}
		held[nheld++] = fd;
	}
	close(b.fd);
	b.fd = -1;
	for (int i = 0; i < nheld; i++) {
		struct fr_boot one = b;

		one.deadline_ms = fr_now_ms() + 2000;
		fr_boot_put_header(buf, FR_BOOT_TICKET, 16);
		fr_put_le32(buf + FR_BOOT_HDR, first + (uint32_t)i);
		fr_put_le32(buf + FR_BOOT_HDR + 4, nranks);
		fr_put_le64(buf + FR_BOOT_HDR + 8, nonce);
		if (!send_all(&one, held[i], buf, FR_BOOT_HDR + 16))
			(*served)++;
	}
	if (*served < count)
		rc = fail(&b, FR_EPEER,
			  "%d of %d newcomers left before their ticket",
			  count - *served, count);
out_close:
	for (int i = 0; i < nheld; i++)
		close(held[i]);
	if (b.fd >= 0)
		close(b.fd);
out_free:
	free(held);
	return rc;
}

int fr_boot_ticket_get(const char *addr, const char *token, int timeout_ms,
		       struct fr_boot_ticket *t, char *err, size_t errlen)
{
	struct fr_boot b = {.fd = -1};
	size_t tl = token ? strlen(token) : 0;
	uint8_t buf[FR_BOOT_HDR + 2 + FR_BOOT_TOKEN_MAX];
	uint16_t type;
	int rc, n;

	if (tl > FR_BOOT_TOKEN_MAX) {
		snprintf(err, errlen, "job token longer than %d bytes",
			 FR_BOOT_TOKEN_MAX);
		return FR_EINVAL;
	}
	b.p.rank = -1;
	b.p.rendezvous = addr;
	b.p.err = err;
	b.p.errlen = errlen;
	b.deadline_ms = fr_now_ms() + (uint64_t)timeout_ms;
	rc = connect_root(&b, false);
	if (rc)
		return fail(&b, rc, "cannot reach the grow's leader at %s (%s)",
			    addr, fr_strerror(rc));
	fr_boot_put_header(buf, FR_BOOT_JOIN, (uint32_t)(2 + tl));
	fr_put_le16(buf + FR_BOOT_HDR, (uint16_t)tl);
	if (tl)
		memcpy(buf + FR_BOOT_HDR + 2, token, tl);
	rc = send_all(&b, b.fd, buf, FR_BOOT_HDR + 2 + tl);
	n = rc ? rc
	       : recv_msg(&b, b.fd, FR_BOOT_TICKET, buf, sizeof(buf), &type);
	close(b.fd);
	if (n >= 0 && type == FR_BOOT_REJECT) {
		int32_t code;
		char msg[256];

		if (fr_boot_parse_reject(buf, (size_t)n, &code, msg,
					 sizeof(msg)))
			return fail(&b, FR_EPROTO, "malformed answer from %s",
				    addr);
		return fail(&b, code < 0 ? code : FR_EBOOTSTRAP,
			    "the grow's leader at %s refused us: %s", addr,
			    msg);
	}
	if (n != 16)
		return fail(&b, n < 0 ? n : FR_EPROTO,
			    "no ticket from the grow's leader at %s (%s)", addr,
			    fr_strerror(n < 0 ? n : FR_EPROTO));
	t->rank = fr_get_le32(buf);
	t->nranks = fr_get_le32(buf + 4);
	t->nonce = fr_get_le64(buf + 8);
	if (t->nranks < 2 || t->nranks > (1u << 24) || t->rank < 1 ||
	    t->rank >= t->nranks)
		return fail(&b, FR_EPROTO, "a malformed ticket from %s", addr);
	return 0;
}

void fr_boot_end(struct fr_boot *boot)
{
	if (!boot)
		return;
	for (int i = 0; i < boot->npending; i++)
		conn_close(&boot->pending[i]);
	free(boot->pending);
	free(boot->pfd);
	if (boot->ranks) {
		for (int r = 0; r < boot->p.nranks; r++)
			if (boot->ranks[r].fd >= 0 || boot->ranks[r].hello)
				conn_close(&boot->ranks[r]);
		free(boot->ranks);
	}
	if (boot->fd >= 0)
		close(boot->fd);
	free(boot);
}
