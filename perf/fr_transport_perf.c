/* SPDX-License-Identifier: MIT */
/*
 * fr_transport_perf - write-with-immediate bandwidth and latency of one
 * transport, in the manner of perftest's ib_write_bw / ib_write_lat.
 *
 * It drives the internal transport table (src/transport.h) directly, below
 * the communicator, so a slow All-Reduce can be split into "the wire is
 * slow" and "the algorithm is slow".
 *
 * Two processes, a server and a client:
 *   - by default the tool forks itself: the parent is the server, the child
 *     the client, and they talk over a socketpair;
 *   - with --server / --client HOST they run on two hosts and meet on a
 *     plain TCP side channel (port 18600), as perftest does.
 * The side channel carries only set-up: the client's test parameters, the
 * address and remote-key blobs, a job nonce, and per test a start/result
 * handshake.  Everything measured goes over the transport.
 *
 * Each side registers one region of 2 x the largest size: the first half is
 * the source of its writes, the second half is where the peer writes.  Both
 * sides connect to each other and accept the other's connection, and write
 * only on the connection they opened - the way the ring uses a transport,
 * so no transport is asked for more than the library needs.
 *
 * bw:  the client keeps up to --tx-depth writes in flight (EAGAIN from the
 *      transport is back-pressure: poll, then retry); the server checks every
 *      arrival (length, immediate = sequence number: FIFO) and timestamps it,
 *      then answers with a 0-byte write.  Average bandwidth is measured by the
 *      client from the first post to that answer, so it counts only bytes
 *      that arrived; peak bandwidth is the best window of arrivals.
 * lat: ping-pong; the server writes back when the client's write arrives.
 *      One-way latency = round trip / 2, as ib_write_lat reports.
 *
 * Waiting spins briefly, then blocks in the transport's wait(), so two
 * processes on a two-core machine do not starve each other; every wait is
 * bounded by --timeout so that a dead peer is an error, never a hang.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fastreduce.h"
#include "perf_common.h"
#include "transport.h"
#include "util.h"

#define DEFAULT_PORT 18600
#define MSG_LEN 256	  /* every side-channel message */
#define MAGIC 0x50545246u /* "FRTP" */
#define PROTO_VERSION 1
#define ACK_IMM 0xffffffffu  /* the server's "all arrived" */
#define SEQ_MASK 0x7fffffffu /* immediates of data writes */
#define CQE_BATCH 64
#define BW_ITERS 5000
#define LAT_ITERS 1000
#define BW_CAP_BYTES (1ull << 30) /* per size, when -n is not given */
#define LAT_CAP_BYTES (128ull << 20)
#define MIN_CAPPED_ITERS 10
#define ALL_MIN 2
#define ALL_MAX (8u << 20)

enum { TEST_DONE = 0, TEST_BW = 1, TEST_LAT = 2 };
enum { ROLE_FORK, ROLE_SERVER, ROLE_CLIENT };

struct opts {
	const char *transport;
	int role;
	const char *host; /* --client HOST */
	long port;
	const char *ip; /* transport's local address */
	bool bw, lat;
	size_t minsz, maxsz;
	long iters; /* 0: defaults (and byte caps) */
	long depth;
	long timeout_ms;
	long spin_us;
	bool csv;
};

/* One side's transport endpoint and the state of its peer. */
struct ep {
	const struct fr_tp_ops *ops;
	struct fr_tp *tp;
	struct fr_tp_conn *tx; /* we connected: all our writes go here */
	struct fr_tp_conn *rx; /* the peer connected: its writes arrive */
	struct fr_tp_mr *mr;
	unsigned char *buf;
	size_t half;		/* source at 0, landing zone at half */
	struct fr_tp_rkey peer; /* the peer's region */
	uint8_t addr[FR_TP_ADDR_MAX];
	size_t addrlen;
	uint64_t spin_ns;
	int timeout_ms;
	int depth;
	char err[256];
};

static const char *prog = "fr_transport_perf";

/* ---- side channel -------------------------------------------------------- */

/* Read or write exactly MSG_LEN bytes, each step bounded by timeout_ms. */
static int side_io(int fd, uint8_t *msg, bool out, int timeout_ms)
{
	size_t off = 0;

	while (off < MSG_LEN) {
		struct pollfd p = {.fd = fd, .events = out ? POLLOUT : POLLIN};
		ssize_t n;
		int rc = poll(&p, 1, timeout_ms);

		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return FR_ESYS;
		if (rc == 0)
			return FR_ETIMEDOUT;
		if (out)
			n = send(fd, msg + off, MSG_LEN - off, MSG_NOSIGNAL);
		else
			n = recv(fd, msg + off, MSG_LEN - off, 0);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return FR_EPEER; /* closed, or reset */
		off += (size_t)n;
	}
	return 0;
}

static int side_send(int fd, uint8_t *msg, int timeout_ms)
{
	fr_put_le32(msg, MAGIC);
	return side_io(fd, msg, true, timeout_ms);
}

static int side_recv(int fd, uint8_t *msg, int timeout_ms)
{
	int rc = side_io(fd, msg, false, timeout_ms);

	if (!rc && fr_get_le32(msg) != MAGIC)
		rc = FR_EPROTO;
	return rc;
}

static void side_perror(const char *what, int rc)
{
	fprintf(stderr, "%s: side channel: %s: %s\n", prog, what,
		rc == FR_EPEER ? "the peer closed the connection"
			       : fr_strerror(rc));
}

/* --server: wait for one client on the side-channel port. */
static int side_listen_accept(long port, int timeout_ms)
{
	struct sockaddr_in6 a;
	struct pollfd p;
	int one = 1, zero = 0, lfd, fd = -1, rc;

	lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0) {
		fprintf(stderr, "%s: socket: %s\n", prog, strerror(errno));
		return -1;
	}
	/* Dual stack: v4 clients arrive as mapped addresses. */
	setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin6_family = AF_INET6;
	a.sin6_addr = in6addr_any;
	a.sin6_port = htons((uint16_t)port);
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1)) {
		fprintf(stderr, "%s: cannot listen on port %ld: %s\n", prog,
			port, strerror(errno));
		goto out;
	}
	fprintf(stderr, "%s: server waiting for a client on port %ld\n", prog,
		port);
	p.fd = lfd;
	p.events = POLLIN;
	do
		rc = poll(&p, 1, timeout_ms);
	while (rc < 0 && errno == EINTR);
	if (rc <= 0) {
		fprintf(stderr, "%s: no client within %d ms\n", prog,
			timeout_ms);
		goto out;
	}
	fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "%s: accept: %s\n", prog, strerror(errno));
out:
	close(lfd);
	return fd;
}

/* --client HOST: connect, retrying until timeout_ms (the server may start
 * a moment after us). */
static int side_connect(const char *host, long port, int timeout_ms)
{
	struct addrinfo hints, *res, *ai;
	char ps[16];
	uint64_t deadline = pc_now_ns() + (uint64_t)timeout_ms * 1000000u;
	int fd, rc, err = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%ld", port);
	rc = getaddrinfo(host, ps, &hints, &res);
	if (rc) {
		fprintf(stderr, "%s: cannot resolve '%s': %s\n", prog, host,
			gai_strerror(rc));
		return -1;
	}
	for (;;) {
		for (ai = res; ai; ai = ai->ai_next) {
			fd = socket(ai->ai_family,
				    ai->ai_socktype | SOCK_CLOEXEC,
				    ai->ai_protocol);
			if (fd < 0)
				continue;
			if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) {
				freeaddrinfo(res);
				return fd;
			}
			err = errno;
			close(fd);
		}
		if (pc_now_ns() >= deadline)
			break;
		usleep(100000);
	}
	freeaddrinfo(res);
	fprintf(stderr, "%s: cannot connect to %s:%ld: %s\n", prog, host, port,
		strerror(err));
	return -1;
}

/* ---- the transport endpoint ---------------------------------------------- */

static int ep_fail(struct ep *e, const char *what, int rc)
{
	fprintf(stderr, "%s: %s: %s: %s%s%s\n", prog, e->ops->name, what,
		fr_strerror(rc), e->err[0] ? ": " : "", e->err);
	e->err[0] = '\0';
	return rc ? rc : FR_EPROTO;
}

static int ep_open(struct ep *e, const struct fr_tp_ops *ops, int rank,
		   uint64_t nonce, const char *ip, const struct opts *o,
		   size_t maxsz)
{
	struct fr_tp_params p;
	int rc;

	e->ops = ops;
	e->timeout_ms = (int)o->timeout_ms;
	e->spin_ns = (uint64_t)o->spin_us * 1000u;
	e->depth = (int)o->depth;
	e->half = maxsz ? maxsz : 1;
	rc = ops->probe(e->err, sizeof(e->err));
	if (rc)
		return ep_fail(e, "not usable on this machine", rc);

	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.rank = rank;
	p.job_nonce = nonce;
	p.local_ip = ip;
	p.timeout_ms = (int)o->timeout_ms;
	p.sq_depth = (int)o->depth;
	p.errbuf = e->err;
	p.errlen = sizeof(e->err);
	e->addrlen = sizeof(e->addr);
	rc = ops->open(&p, &e->tp, e->addr, &e->addrlen);
	if (rc)
		return ep_fail(e, "opening the endpoint", rc);

	e->buf = aligned_alloc(4096, (2 * e->half + 4095) & ~(size_t)4095);
	if (!e->buf) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", prog,
			e->half);
		return FR_ENOMEM;
	}
	/* Touch every page now, not inside the first measurement. */
	memset(e->buf, 0x5a, 2 * e->half);
	rc = ops->reg_mem(e->tp, e->buf, 2 * e->half,
			  FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE |
				  FR_TP_REMOTE_WRITE,
			  &e->mr);
	if (rc)
		return ep_fail(e, "registering memory", rc);
	return 0;
}

static void ep_close(struct ep *e)
{
	if (e->tx)
		e->ops->close_conn(e->tx);
	if (e->rx)
		e->ops->close_conn(e->rx);
	if (e->mr)
		e->ops->dereg_mem(e->tp, e->mr);
	if (e->tp)
		e->ops->close(e->tp);
	free(e->buf);
	memset(e, 0, sizeof(*e));
}

/* Our address and key blobs into a side-channel message at off. */
static int ep_pack(struct ep *e, uint8_t *msg, size_t off)
{
	size_t kl = FR_TP_RKEY_MAX;
	int rc;

	rc = e->ops->pack_rkey(e->mr, msg + off + 2 + FR_TP_ADDR_MAX, &kl);
	if (rc)
		return ep_fail(e, "packing the remote key", rc);
	msg[off] = (uint8_t)e->addrlen;
	memcpy(msg + off + 1, e->addr, e->addrlen);
	msg[off + 1 + FR_TP_ADDR_MAX] = (uint8_t)kl;
	return 0;
}

/*
 * Connect to the peer whose blobs are in msg at off and accept its
 * connection to us, both at once (neither side can finish alone).
 */
static int ep_connect(struct ep *e, int peer, const uint8_t *msg, size_t off)
{
	size_t al = msg[off], kl = msg[off + 1 + FR_TP_ADDR_MAX];
	uint64_t deadline = pc_now_ns() + (uint64_t)e->timeout_ms * 1000000u;
	bool tx_ok = false, rx_ok = false;
	int rc;

	if (al > FR_TP_ADDR_MAX || kl > FR_TP_RKEY_MAX) {
		fprintf(stderr, "%s: malformed blobs from the peer\n", prog);
		return FR_EPROTO;
	}
	rc = e->ops->unpack_rkey(e->tp, msg + off + 2 + FR_TP_ADDR_MAX, kl,
				 &e->peer);
	if (rc)
		return ep_fail(e, "unpacking the peer's key", rc);
	rc = e->ops->connect(e->tp, peer, msg + off + 1, al, &e->tx);
	if (rc)
		return ep_fail(e, "connecting", rc);
	while (!tx_ok || !rx_ok) {
		uint64_t now;

		if (!e->rx) {
			rc = e->ops->accept(e->tp, peer, &e->rx);
			if (rc && rc != FR_EAGAIN)
				return ep_fail(e, "accepting the peer", rc);
		}
		if (e->rx && !rx_ok) {
			rc = e->ops->connect_done(e->rx);
			if (rc && rc != FR_EAGAIN)
				return ep_fail(e, "accepting the peer", rc);
			rx_ok = !rc;
		}
		if (!tx_ok) {
			rc = e->ops->connect_done(e->tx);
			if (rc && rc != FR_EAGAIN)
				return ep_fail(e, "connecting to the peer", rc);
			tx_ok = !rc;
		}
		if (tx_ok && rx_ok)
			break;
		now = pc_now_ns();
		if (now >= deadline) {
			fprintf(stderr,
				"%s: %s: timed out after %d ms connecting to the peer\n",
				prog, e->ops->name, e->timeout_ms);
			return FR_ETIMEDOUT;
		}
		rc = e->ops->wait(
			e->tp,
			(int)PC_MIN((deadline - now) / 1000000u + 1, 50u));
		if (rc)
			return ep_fail(e, "waiting", rc);
	}
	return 0;
}

/*
 * Up to max completions.  block: spin for spin_ns, then sleep in wait()
 * until something arrives or timeout_ms pass without any (then
 * FR_ETIMEDOUT: the peer is dead or stuck).  A completion with an error
 * status is reported and returned as that error.
 */
static int ep_poll(struct ep *e, struct fr_tp_cqe *cqe, int max, bool block)
{
	uint64_t start = 0, now;
	int n, rc;

	for (;;) {
		n = e->ops->poll(e->tp, cqe, max);
		if (n < 0)
			return ep_fail(e, "polling", n);
		if (n > 0 || !block)
			break;
		now = pc_now_ns();
		if (!start)
			start = now;
		if (now - start < e->spin_ns)
			continue;
		if (now - start >= (uint64_t)e->timeout_ms * 1000000u) {
			fprintf(stderr,
				"%s: %s: nothing from the peer for %d ms\n",
				prog, e->ops->name, e->timeout_ms);
			return FR_ETIMEDOUT;
		}
		rc = e->ops->wait(e->tp, 100);
		if (rc)
			return ep_fail(e, "waiting", rc);
	}
	for (int i = 0; i < n; i++)
		if (cqe[i].status)
			return ep_fail(e,
				       cqe[i].kind == FR_CQE_SEND
					       ? "write completed with an error"
					       : "connection failed",
				       cqe[i].status);
	return n;
}

/* Post one write, polling through back-pressure; RECV completions seen
 * meanwhile are not expected (the protocol is strictly ordered). */
static int ep_post(struct ep *e, size_t len, uint32_t imm, uint64_t ctx)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	int rc, n;

	for (;;) {
		rc = e->ops->write_imm(e->tx, e->mr, 0, &e->peer, e->half, len,
				       imm, ctx);
		if (rc != FR_EAGAIN)
			break;
		n = ep_poll(e, cqe, CQE_BATCH, true);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++)
			if (cqe[i].kind == FR_CQE_RECV) {
				fprintf(stderr,
					"%s: unexpected write from the peer (imm %u)\n",
					prog, cqe[i].imm);
				return FR_EPROTO;
			}
	}
	if (rc)
		return ep_fail(e, "posting a write", rc);
	return 0;
}

/* ---- the tests: server side ---------------------------------------------- */

/*
 * Bandwidth, receiving side: check every arrival, answer with a 0-byte
 * write, and return the best rate over any stretch of at least a tenth of
 * the run.
 *
 * Arrivals are timed per poll() call, not per completion: a transport does
 * the receiving work inside poll() and may hand out a whole backlog from one
 * call, so per-completion timestamps would be nearly equal and make any
 * short window look infinitely fast.  The bytes a call returns were received
 * after the previous call ended, so a window between the ends of calls a
 * and b honestly carries the bytes returned by calls a+1..b.  The batch is
 * large so that one call's completions are not spread over several calls.
 */
#define BW_BATCH 1024

static int server_bw(struct ep *e, size_t size, uint64_t iters, double *peak)
{
	struct fr_tp_cqe *cqe;
	uint64_t *t, *cnt, got = 0, nb = 0, w;
	int n, rc = 0;

	cqe = malloc(BW_BATCH * sizeof(*cqe));
	t = malloc((iters + 1) * sizeof(*t));
	cnt = malloc((iters + 1) * sizeof(*cnt));
	if (!cqe || !t || !cnt) {
		rc = FR_ENOMEM;
		goto out;
	}
	while (got < iters) {
		n = ep_poll(e, cqe, BW_BATCH, true);
		if (n < 0) {
			rc = n;
			goto out;
		}
		for (int i = 0; i < n; i++) {
			if (cqe[i].kind != FR_CQE_RECV)
				continue;
			if (cqe[i].len != size ||
			    cqe[i].imm != (uint32_t)(got & SEQ_MASK)) {
				fprintf(stderr,
					"%s: write %llu arrived as %u bytes, imm %u: expected %zu bytes, imm %u\n",
					prog, (unsigned long long)got,
					cqe[i].len, cqe[i].imm, size,
					(unsigned)(got & SEQ_MASK));
				rc = FR_EPROTO;
				goto out;
			}
			got++;
		}
		if (nb && cnt[nb - 1] == got)
			continue; /* only SEND completions */
		t[nb] = pc_now_ns();
		cnt[nb++] = got;
	}
	rc = ep_post(e, 0, ACK_IMM, 0);
	if (rc)
		goto out;

	*peak = 0;
	w = (t[nb - 1] - t[0]) / 10;
	for (uint64_t a = 0, b = 0; a < nb; a++) {
		double r;

		while (b < nb && t[b] - t[a] < w)
			b++;
		if (b == nb)
			break;
		if (t[b] == t[a])
			continue;
		r = (double)((cnt[b] - cnt[a]) * size) / (double)(t[b] - t[a]);
		if (r > *peak)
			*peak = r; /* bytes per ns = GB/s */
	}
out:
	free(cqe);
	free(t);
	free(cnt);
	return rc;
}

/* Latency, answering side: echo every write as soon as it arrives. */
static int server_lat(struct ep *e, size_t size, uint64_t iters)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	uint64_t i = 0, sent = 0, deadline;
	int n, rc;

	while (i < iters) {
		n = ep_poll(e, cqe, CQE_BATCH, true);
		if (n < 0)
			return n;
		for (int k = 0; k < n; k++) {
			if (cqe[k].kind == FR_CQE_SEND)
				sent++;
			if (cqe[k].kind != FR_CQE_RECV)
				continue;
			if (cqe[k].len != size ||
			    cqe[k].imm != (uint32_t)(i & SEQ_MASK)) {
				fprintf(stderr,
					"%s: ping %llu arrived malformed\n",
					prog, (unsigned long long)i);
				return FR_EPROTO;
			}
			rc = ep_post(e, size, (uint32_t)(i & SEQ_MASK), i);
			if (rc)
				return rc;
			i++;
		}
	}
	/*
	 * Over TCP bytes move only inside poll(): keep polling until the last
	 * reply has left, or it may never reach the client.  The client may
	 * close as soon as it has it, so a failure now is no error.
	 */
	deadline = pc_now_ns() + (uint64_t)e->timeout_ms * 1000000u;
	while (sent < iters && pc_now_ns() < deadline) {
		n = e->ops->poll(e->tp, cqe, CQE_BATCH);
		if (n < 0)
			break;
		for (int k = 0; k < n; k++)
			if (cqe[k].kind == FR_CQE_SEND && !cqe[k].status)
				sent++;
			else if (cqe[k].status)
				return 0;
		if (!n)
			e->ops->wait(e->tp, 10);
	}
	return 0;
}

static int run_server(int fd, const struct opts *o)
{
	const struct fr_tp_ops *ops;
	struct ep e;
	uint8_t msg[MSG_LEN];
	char name[17];
	uint64_t nonce, maxsz;
	int rc, to = (int)o->timeout_ms;
	struct opts eo = *o;
	const char *ip = o->ip;
	char ipbuf[64];

	memset(&e, 0, sizeof(e));
	rc = side_recv(fd, msg, to);
	if (rc) {
		side_perror("waiting for the client's parameters", rc);
		return 1;
	}
	if (fr_get_le32(msg + 4) != PROTO_VERSION) {
		fprintf(stderr,
			"%s: the client speaks protocol %u, we speak %u\n",
			prog, fr_get_le32(msg + 4), PROTO_VERSION);
		return 1;
	}
	maxsz = fr_get_le64(msg + 8);
	eo.depth = fr_get_le32(msg + 16);
	eo.timeout_ms = fr_get_le32(msg + 20);
	memcpy(name, msg + 24, 16);
	name[16] = '\0';

	memset(msg, 0, sizeof(msg));
	ops = fr_transport_find(name);
	if (!ops || strcmp(name, o->transport) || maxsz > (1ull << 40) ||
	    eo.depth < 1) {
		/* Tell the client why, so it does not just time out. */
		fr_put_le32(msg + 4, (uint32_t)FR_EINVAL);
		if (!ops || strcmp(name, o->transport))
			snprintf(
				(char *)msg + 178, MSG_LEN - 178,
				"server runs transport '%s', client asked for '%.16s'",
				o->transport, name);
		else
			snprintf((char *)msg + 178, MSG_LEN - 178,
				 "bad parameters (size %llu, depth %ld)",
				 (unsigned long long)maxsz, eo.depth);
		side_send(fd, msg, to);
		fprintf(stderr, "%s: %s\n", prog, (char *)msg + 178);
		return 1;
	}
	if (!ip && o->role == ROLE_SERVER) {
		/* The address the client reached us on is the one it can
		 * reach the transport on too. */
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);

		if (!getsockname(fd, (struct sockaddr *)&ss, &sl) &&
		    !fr_sockaddr_ip((struct sockaddr *)&ss, ipbuf,
				    sizeof(ipbuf))) {
			if (!strncmp(ipbuf, "::ffff:", 7))
				memmove(ipbuf, ipbuf + 7,
					strlen(ipbuf + 7) + 1);
			ip = ipbuf;
		}
	}
	/* Any value both sides share will do: it only keeps strangers out. */
	nonce = pc_now_ns() ^ ((uint64_t)getpid() << 32);
	rc = ep_open(&e, ops, 0, nonce, ip, &eo, (size_t)maxsz);
	if (rc)
		goto fail;
	fr_put_le64(msg + 8, nonce);
	rc = ep_pack(&e, msg, 16);
	if (rc)
		goto fail;
	rc = side_send(fd, msg, to);
	if (rc) {
		side_perror("sending our address", rc);
		goto fail;
	}
	rc = side_recv(fd, msg, to);
	if (rc) {
		side_perror("waiting for the client's address", rc);
		goto fail;
	}
	rc = ep_connect(&e, 1, msg, 16);
	if (rc)
		goto fail;

	for (;;) {
		uint32_t kind;
		uint64_t size, iters;
		double peak = 0;

		/* Between tests the client only prints: a long wait is OK. */
		rc = side_recv(fd, msg, to + 60000);
		if (rc) {
			side_perror("waiting for the next test", rc);
			goto fail;
		}
		kind = fr_get_le32(msg + 4);
		size = fr_get_le64(msg + 8);
		iters = fr_get_le64(msg + 16);
		if (kind == TEST_DONE)
			break;
		if ((kind != TEST_BW && kind != TEST_LAT) || size > e.half ||
		    !iters) {
			fprintf(stderr,
				"%s: bad test request from the client\n", prog);
			rc = FR_EPROTO;
			goto fail;
		}
		memset(msg, 0, sizeof(msg));
		rc = side_send(fd, msg, to);
		if (rc) {
			side_perror("sending ready", rc);
			goto fail;
		}
		if (kind == TEST_BW)
			rc = server_bw(&e, (size_t)size, iters, &peak);
		else
			rc = server_lat(&e, (size_t)size, iters);
		if (rc)
			goto fail;
		if (kind == TEST_BW) {
			uint64_t bits;

			memset(msg, 0, sizeof(msg));
			memcpy(&bits, &peak, 8);
			fr_put_le64(msg + 8, bits);
			rc = side_send(fd, msg, to);
			if (rc) {
				side_perror("sending the result", rc);
				goto fail;
			}
		}
	}
	ep_close(&e);
	return 0;

fail:
	ep_close(&e);
	return 1;
}

/* ---- the tests: client side ---------------------------------------------- */

static int client_bw(struct ep *e, size_t size, uint64_t iters, uint64_t *ns)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	uint64_t posted = 0, done = 0, t0, t1 = 0;
	bool acked = false;
	int n, rc;

	t0 = pc_now_ns();
	while (done < iters || !acked) {
		bool full = false;

		while (posted < iters && posted - done < (uint64_t)e->depth) {
			rc = e->ops->write_imm(
				e->tx, e->mr, 0, &e->peer, e->half, size,
				(uint32_t)(posted & SEQ_MASK), posted);
			if (rc == FR_EAGAIN) {
				full = true;
				break;
			}
			if (rc)
				return ep_fail(e, "posting a write", rc);
			posted++;
		}
		/* Block only when there is nothing left to post. */
		n = ep_poll(e, cqe, CQE_BATCH,
			    full || posted == iters ||
				    posted - done >= (uint64_t)e->depth);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++) {
			if (cqe[i].kind == FR_CQE_SEND) {
				done++;
			} else if (cqe[i].imm == ACK_IMM && !acked) {
				acked = true;
				t1 = pc_now_ns();
			} else {
				fprintf(stderr,
					"%s: unexpected write from the server (imm %u)\n",
					prog, cqe[i].imm);
				return FR_EPROTO;
			}
		}
	}
	*ns = t1 - t0;
	return 0;
}

static int client_lat(struct ep *e, size_t size, uint64_t warmup,
		      uint64_t iters, uint64_t *rtt)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	int n, rc;

	for (uint64_t i = 0; i < warmup + iters; i++) {
		uint32_t imm = (uint32_t)(i & SEQ_MASK);
		uint64_t t0 = pc_now_ns();
		bool back = false;

		rc = ep_post(e, size, imm, i);
		if (rc)
			return rc;
		while (!back) {
			n = ep_poll(e, cqe, CQE_BATCH, true);
			if (n < 0)
				return n;
			for (int k = 0; k < n; k++) {
				if (cqe[k].kind != FR_CQE_RECV)
					continue;
				if (cqe[k].imm != imm || cqe[k].len != size) {
					fprintf(stderr,
						"%s: pong %llu arrived malformed\n",
						prog, (unsigned long long)i);
					return FR_EPROTO;
				}
				back = true;
			}
		}
		if (i >= warmup)
			rtt[i - warmup] = pc_now_ns() - t0;
	}
	return 0;
}

/* Iterations for one size: -n if given, else the default capped so that
 * large sizes do not take minutes. */
static uint64_t iters_for(const struct opts *o, int kind, size_t size)
{
	uint64_t def = kind == TEST_BW ? BW_ITERS : LAT_ITERS;
	uint64_t cap = kind == TEST_BW ? BW_CAP_BYTES : LAT_CAP_BYTES;

	if (o->iters)
		return (uint64_t)o->iters;
	if (size && def * size > cap)
		def = cap / size > MIN_CAPPED_ITERS ? cap / size
						    : MIN_CAPPED_ITERS;
	return def;
}

/* Ask the server to get ready for a test. */
static int client_start(int fd, int to, int kind, size_t size, uint64_t iters)
{
	uint8_t msg[MSG_LEN];
	int rc;

	memset(msg, 0, sizeof(msg));
	fr_put_le32(msg + 4, (uint32_t)kind);
	fr_put_le64(msg + 8, size);
	fr_put_le64(msg + 16, iters);
	rc = side_send(fd, msg, to);
	if (!rc && kind != TEST_DONE)
		rc = side_recv(fd, msg, to);
	if (rc)
		side_perror("starting a test", rc);
	return rc;
}

static size_t next_size(size_t s)
{
	return s ? s * 2 : 1;
}

static int client_bw_sweep(struct ep *e, int fd, const struct opts *o)
{
	uint8_t msg[MSG_LEN];
	int to = (int)o->timeout_ms, rc;

	if (!o->csv) {
		printf("# write_imm bandwidth, tx depth %ld\n", o->depth);
		printf("%-10s %-12s %-15s %-18s %-18s %s\n", "#bytes",
		       "#iterations", "BW peak[GB/s]", "BW average[GB/s]",
		       "BW average[Gb/s]", "MsgRate[Mpps]");
	}
	/* Untimed warm-up: connection ramp-up, first-touch, caches. */
	{
		uint64_t ns, wi = PC_MIN(iters_for(o, TEST_BW, o->minsz), 100u);

		rc = client_start(fd, to, TEST_BW, o->minsz, wi);
		if (!rc)
			rc = client_bw(e, o->minsz, wi, &ns);
		if (!rc)
			rc = side_recv(fd, msg, to);
		if (rc)
			return rc;
	}
	for (size_t s = o->minsz; s <= o->maxsz; s = next_size(s)) {
		uint64_t iters = iters_for(o, TEST_BW, s), ns, bits;
		double peak, avg, sec;

		rc = client_start(fd, to, TEST_BW, s, iters);
		if (rc)
			return rc;
		rc = client_bw(e, s, iters, &ns);
		if (rc)
			return rc;
		rc = side_recv(fd, msg, to);
		if (rc) {
			side_perror("waiting for the server's result", rc);
			return rc;
		}
		bits = fr_get_le64(msg + 8);
		memcpy(&peak, &bits, 8);
		sec = (double)ns / 1e9;
		avg = (double)(iters * s) / (double)ns; /* B/ns = GB/s */
		if (peak < avg)
			peak = avg; /* too few arrivals for a window */
		if (o->csv)
			printf("bw,%zu,%llu,%.4f,%.4f,%.4f,%.4f,,,,,\n", s,
			       (unsigned long long)iters, peak, avg, avg * 8,
			       (double)iters / sec / 1e6);
		else
			printf("%-10zu %-12llu %-15.3f %-18.3f %-18.3f %.4f\n",
			       s, (unsigned long long)iters, peak, avg, avg * 8,
			       (double)iters / sec / 1e6);
		fflush(stdout);
		if (s == o->maxsz)
			break;
	}
	return 0;
}

static int client_lat_sweep(struct ep *e, int fd, const struct opts *o)
{
	int to = (int)o->timeout_ms, rc;

	if (!o->csv) {
		printf("# write_imm latency (one way = round trip / 2)\n");
		printf("%-10s %-12s %-12s %-15s %-12s %-12s %s\n", "#bytes",
		       "#iterations", "t_min[usec]", "t_median[usec]",
		       "t_p99[usec]", "t_max[usec]", "t_avg[usec]");
	}
	for (size_t s = o->minsz; s <= o->maxsz; s = next_size(s)) {
		uint64_t iters = iters_for(o, TEST_LAT, s), *rtt, sum = 0;
		uint64_t warm = PC_MIN(iters / 10 + 1, 1000u), p99i;
		double med;

		rtt = malloc(iters * sizeof(*rtt));
		if (!rtt)
			return FR_ENOMEM;
		rc = client_start(fd, to, TEST_LAT, s, warm + iters);
		if (!rc)
			rc = client_lat(e, s, warm, iters, rtt);
		if (rc) {
			free(rtt);
			return rc;
		}
		qsort(rtt, iters, sizeof(*rtt), pc_cmp_u64);
		for (uint64_t i = 0; i < iters; i++)
			sum += rtt[i];
		med = iters % 2 ? (double)rtt[iters / 2]
				: ((double)rtt[iters / 2 - 1] +
				   (double)rtt[iters / 2]) /
					  2;
		p99i = (uint64_t)ceil(0.99 * (double)iters) - 1;
		/* RTT in ns -> one-way in us. */
#define US(x) ((double)(x) / 2000.0)
		if (o->csv)
			printf("lat,%zu,%llu,,,,,%.3f,%.3f,%.3f,%.3f,%.3f\n", s,
			       (unsigned long long)iters, US(rtt[0]), US(med),
			       US(rtt[p99i]), US(rtt[iters - 1]),
			       US(sum) / (double)iters);
		else
			printf("%-10zu %-12llu %-12.2f %-15.2f %-12.2f %-12.2f %.2f\n",
			       s, (unsigned long long)iters, US(rtt[0]),
			       US(med), US(rtt[p99i]), US(rtt[iters - 1]),
			       US(sum) / (double)iters);
#undef US
		fflush(stdout);
		free(rtt);
		if (s == o->maxsz)
			break;
	}
	return 0;
}

static int run_client(int fd, const struct opts *o)
{
	const struct fr_tp_ops *ops = fr_transport_find(o->transport);
	struct ep e;
	uint8_t msg[MSG_LEN];
	int rc, to = (int)o->timeout_ms;
	const char *ip = o->ip;
	char ipbuf[64];

	memset(&e, 0, sizeof(e));
	memset(msg, 0, sizeof(msg));
	fr_put_le32(msg + 4, PROTO_VERSION);
	fr_put_le64(msg + 8, o->maxsz);
	fr_put_le32(msg + 16, (uint32_t)o->depth);
	fr_put_le32(msg + 20, (uint32_t)o->timeout_ms);
	snprintf((char *)msg + 24, 16, "%s", o->transport);
	rc = side_send(fd, msg, to);
	if (rc) {
		side_perror("sending our parameters", rc);
		return 1;
	}
	rc = side_recv(fd, msg, to);
	if (rc) {
		side_perror("waiting for the server's address", rc);
		return 1;
	}
	if (fr_get_le32(msg + 4)) {
		msg[MSG_LEN - 1] = '\0';
		fprintf(stderr, "%s: the server refused: %s\n", prog,
			(char *)msg + 178);
		return 1;
	}
	if (!ip && o->role == ROLE_CLIENT) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);

		if (!getsockname(fd, (struct sockaddr *)&ss, &sl) &&
		    !fr_sockaddr_ip((struct sockaddr *)&ss, ipbuf,
				    sizeof(ipbuf)))
			ip = ipbuf;
	}
	rc = ep_open(&e, ops, 1, fr_get_le64(msg + 8), ip, o, o->maxsz);
	if (rc)
		goto fail;
	{
		uint8_t mine[MSG_LEN];

		memset(mine, 0, sizeof(mine));
		rc = ep_pack(&e, mine, 16);
		if (rc)
			goto fail;
		rc = side_send(fd, mine, to);
		if (rc) {
			side_perror("sending our address", rc);
			goto fail;
		}
	}
	rc = ep_connect(&e, 0, msg, 16);
	if (rc)
		goto fail;

	if (o->csv)
		printf("test,bytes,iterations,bw_peak_GBps,bw_avg_GBps,bw_avg_Gbps,msg_rate_Mpps,lat_min_us,lat_median_us,lat_p99_us,lat_max_us,lat_avg_us\n");
	else
		printf("# fr_transport_perf: transport %s, %s, sizes %zu..%zu\n",
		       o->transport,
		       o->role == ROLE_FORK ? "two local processes"
					    : "two hosts",
		       o->minsz, o->maxsz);
	fflush(stdout);
	if (o->bw && (rc = client_bw_sweep(&e, fd, o)))
		goto fail;
	if (o->lat && (rc = client_lat_sweep(&e, fd, o)))
		goto fail;
	rc = client_start(fd, to, TEST_DONE, 0, 0);
	ep_close(&e);
	return rc ? 1 : 0;

fail:
	ep_close(&e);
	return 1;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: fr_transport_perf [OPTIONS]                  (two local processes)\n"
		"       fr_transport_perf --server [OPTIONS]         (host A)\n"
		"       fr_transport_perf --client HOST [OPTIONS]    (host B)\n"
		"Write-with-immediate bandwidth and latency of a libfastreduce transport.\n"
		"\n"
		"  -x, --transport NAME   transport to test (default tcp)\n"
		"      --server           wait for one client on the side-channel port\n"
		"      --client HOST      connect to a server\n"
		"  -p, --port P           side-channel port (default %d)\n"
		"      --ip ADDR          local address for the transport (default\n"
		"                         127.0.0.1 locally, else the side channel's)\n"
		"      --bw               bandwidth only\n"
		"      --lat              latency only (default: both)\n"
		"  -a, --all              all sizes %d..%uM, powers of two\n"
		"  -s, --size SIZE        one size (default 65536)\n"
		"  -b, --min-size SIZE    sweep from SIZE ...\n"
		"  -e, --max-size SIZE    ... to SIZE, doubling\n"
		"  -n, --iters N          iterations per size (default %d bw, %d lat,\n"
		"                         fewer for large sizes)\n"
		"  -t, --tx-depth D       writes in flight (default 64)\n"
		"      --timeout MS       give up on a silent peer after MS (default 10000)\n"
		"      --spin-us US       poll this long before sleeping (default\n"
		"                         $FR_SPIN_US, else 50)\n"
		"      --csv              CSV output\n"
		"  -h, --help             this text\n"
		"The client's test parameters are used; the server needs only -x, -p, --ip.\n",
		DEFAULT_PORT, ALL_MIN, ALL_MAX >> 20, BW_ITERS, LAT_ITERS);
}

static int bad(const char *what, const char *arg)
{
	fprintf(stderr,
		"%s: invalid %s '%s'\n"
		"Try '%s --help' for more information.\n",
		prog, what, arg, prog);
	return 2;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	enum {
		O_SERVER = 256,
		O_CLIENT,
		O_IP,
		O_BW,
		O_LAT,
		O_TIMEOUT,
		O_SPIN,
		O_CSV
	};
	static const struct option lopts[] = {
		{"transport", required_argument, NULL, 'x'},
		{"server", no_argument, NULL, O_SERVER},
		{"client", required_argument, NULL, O_CLIENT},
		{"port", required_argument, NULL, 'p'},
		{"ip", required_argument, NULL, O_IP},
		{"bw", no_argument, NULL, O_BW},
		{"lat", no_argument, NULL, O_LAT},
		{"all", no_argument, NULL, 'a'},
		{"size", required_argument, NULL, 's'},
		{"min-size", required_argument, NULL, 'b'},
		{"max-size", required_argument, NULL, 'e'},
		{"iters", required_argument, NULL, 'n'},
		{"tx-depth", required_argument, NULL, 't'},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"spin-us", required_argument, NULL, O_SPIN},
		{"csv", no_argument, NULL, O_CSV},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool all = false, have_s = false, have_b = false, have_e = false;
	size_t s = 65536, b = 0, e = 0;
	int c;

	memset(o, 0, sizeof(*o));
	o->transport = "tcp";
	o->role = ROLE_FORK;
	o->port = DEFAULT_PORT;
	o->depth = 64;
	o->timeout_ms = 10000;
	/* The library's own spin budget, so both see the same waits. */
	o->spin_us = 50;
	if (getenv("FR_SPIN_US") &&
	    pc_parse_long(getenv("FR_SPIN_US"), 0, 1000000, &o->spin_us))
		return bad("FR_SPIN_US", getenv("FR_SPIN_US"));
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":x:p:as:b:e:n:t:h", lopts,
				NULL)) != -1) {
		switch (c) {
		case 'x':
			if (!fr_transport_find(optarg))
				return bad("transport (not built in)", optarg);
			o->transport = optarg;
			break;
		case O_SERVER:
			o->role = ROLE_SERVER;
			break;
		case O_CLIENT:
			o->role = ROLE_CLIENT;
			o->host = optarg;
			break;
		case 'p':
			if (pc_parse_long(optarg, 1, 65535, &o->port))
				return bad("port", optarg);
			break;
		case O_IP:
			o->ip = optarg;
			break;
		case O_BW:
			o->bw = true;
			break;
		case O_LAT:
			o->lat = true;
			break;
		case 'a':
			all = true;
			break;
		case 's':
			if (pc_parse_size(optarg, &s) || s > (1u << 30))
				return bad("size (at most 1G)", optarg);
			have_s = true;
			break;
		case 'b':
			if (pc_parse_size(optarg, &b) || b > (1u << 30))
				return bad("minimum size", optarg);
			have_b = true;
			break;
		case 'e':
			if (pc_parse_size(optarg, &e) || e > (1u << 30))
				return bad("maximum size (at most 1G)", optarg);
			have_e = true;
			break;
		case 'n':
			if (pc_parse_long(optarg, 1, 100000000, &o->iters))
				return bad("iteration count", optarg);
			break;
		case 't':
			if (pc_parse_long(optarg, 1, 65536, &o->depth))
				return bad("tx depth", optarg);
			break;
		case O_TIMEOUT:
			if (pc_parse_long(optarg, 1, 3600000, &o->timeout_ms))
				return bad("timeout (ms)", optarg);
			break;
		case O_SPIN:
			if (pc_parse_long(optarg, 0, 1000000, &o->spin_us))
				return bad("spin time (us)", optarg);
			break;
		case O_CSV:
			o->csv = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			return bad("use of option without a value",
				   argv[optind - 1]);
		default:
			return bad("option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return bad("argument", argv[optind]);
	if (!o->bw && !o->lat)
		o->bw = o->lat = true;
	if (have_s && (all || have_b || have_e))
		return bad("combination: -s with -a/-b/-e", "-s");
	if (all || have_b || have_e) {
		o->minsz = have_b ? b : all ? ALL_MIN : 1;
		o->maxsz = have_e ? e : all ? ALL_MAX : o->minsz;
	} else {
		o->minsz = o->maxsz = s;
	}
	if (o->minsz > o->maxsz)
		return bad("size range (-b is larger than -e)", "");
	if (o->role == ROLE_FORK && !o->ip)
		o->ip = "127.0.0.1";
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc, fd, sv[2], st;
	pid_t pid;

	rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc;
	signal(SIGPIPE, SIG_IGN);

	switch (o.role) {
	case ROLE_SERVER:
		fd = side_listen_accept(o.port, (int)o.timeout_ms + 600000);
		if (fd < 0)
			return 1;
		rc = run_server(fd, &o);
		close(fd);
		return rc;
	case ROLE_CLIENT:
		fd = side_connect(o.host, o.port, (int)o.timeout_ms);
		if (fd < 0)
			return 1;
		rc = run_client(fd, &o);
		close(fd);
		return rc;
	}

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		fprintf(stderr, "%s: socketpair: %s\n", prog, strerror(errno));
		return 1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return 1;
	}
	if (pid == 0) {
		close(sv[0]);
		rc = run_client(sv[1], &o);
		close(sv[1]);
		fflush(NULL);
		_exit(rc);
	}
	close(sv[1]);
	rc = run_server(sv[0], &o);
	/* Closing our end tells a client still waiting that we are gone. */
	close(sv[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(st)) {
		fprintf(stderr, "%s: client killed by signal %d\n", prog,
			WTERMSIG(st));
		return 1;
	}
	return rc || WEXITSTATUS(st) ? 1 : 0;
}
