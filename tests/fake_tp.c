/* SPDX-License-Identifier: MIT */
/*
 * fake_tp.c - the in-process fake transport of the unit tests, its fault
 * injection and counters, and a job of N communicators over it (see
 * fake_tp.h for what it does and why).
 *
 * Design: one process-wide mutex guards every endpoint, connection, region
 * and counter, so any thread may drive any endpoint (the library drives
 * each one from one thread at a time) and a delivery may write into another
 * endpoint's queue and memory.  Only wake() and the sleep in wait() run
 * without it (an eventfd per endpoint).  A connection is a pair of struct
 * fr_tp_conn that point at each other; establishment is instant when the
 * addressed endpoint exists (the acceptor's end then waits, parked, for
 * accept()).  Writes are queued on the writer's connection and delivered,
 * in order, by the writer's poll() once the other end has been accepted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fake_tp.h"

#define FAKE_ADDR_MAGIC 0x50544b46u /* "FKTP" */
#define FAKE_ADDR_LEN 16
#define FAKE_RKEY_MAGIC 0xfe
#define FAKE_RKEY_LEN 20
#define FAKE_DEFAULT_SQ 64
#define FAKE_DEFAULT_TIMEOUT_MS 30000
#define FAKE_RETRY_MS 10
#define FAKE_HEAD 64 /* bytes of each write kept in the log */

struct fr_tp_mr {
	struct fr_tp *tp;
	uint8_t *base;
	size_t len;
	int access;
	uint32_t id, gen;
	unsigned int inflight; /* queued writes that still read from it */
};

struct fake_region {
	struct fr_tp_mr *mr; /* NULL when free */
	uint32_t gen;	     /* of the current or next registration */
};

struct fake_sqe {
	struct fr_tp_mr *lmr; /* NULL for a zero-length or inline write */
	bool inl;	      /* write_inline: the bytes are in inl[] */
	uint8_t inl_bytes[FR_TP_INLINE_MAX];
	size_t loff;
	uint32_t rid, rgen;
	uint64_t roff;
	size_t len;
	uint32_t imm;
	uint64_t ctx;
	uint64_t due; /* with a clock: when it may land (fake_tp_clock) */
};

enum fake_state {
	FK_RETRY,  /* outgoing: nobody answered yet (no endpoint, frozen) */
	FK_UP,	   /* established */
	FK_FAILED, /* failed or refused; its completions are in the queue */
};

struct fr_tp_conn {
	struct fr_tp *tp;
	struct fr_tp_conn *next; /* tp->conns */
	struct fr_tp_conn *peer; /* the other end, NULL once it is gone */
	int peer_rank;
	bool incoming, owned; /* owned: handed out by connect or accept */
	enum fake_state state;
	int error;
	/* the other end went away (closed, killed, broken): this end fails
	 * with doom at its endpoint's next progress, as a socket's EOF is
	 * noticed, not at once */
	int doom;
	uint64_t target; /* outgoing: the endpoint id it addresses */
	uint64_t deadline_ms, retry_ms;
	struct fake_sqe *sq; /* FIFO: sq_count from sq_head */
	unsigned int sq_depth, sq_head, sq_count;
	/* SEND completions in the queue not polled yet: with the writes
	 * still queued, what counts against sq_depth (as an RDMA send queue,
	 * whose slot frees when its completion is reaped) */
	unsigned int unreaped;
};

struct fr_tp {
	struct fr_tp *next; /* every live endpoint */
	uint64_t id;
	int rank;
	uint64_t nonce;
	int timeout_ms;
	unsigned int sq_depth;
	int efd;
	bool dead, frozen;
	int refuse;
	struct fr_tp_conn *conns;
	struct fake_region *regions;
	uint32_t nregions;
	/* completions: a growing ring */
	struct fr_tp_cqe *cq;
	size_t cq_head, cq_count, cq_cap;
	char errbuf[256];
	char errcopy[256]; /* what last_error() returned (owner's thread) */
};

/* One write as posted, for the tests' questions. */
struct fake_log {
	int from, to;
	uint32_t imm;
	uint32_t len;
	uint8_t head[FAKE_HEAD];
};

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static struct fake_clock *clk; /* fake_tp_clock(): virtual time, or NULL */
static struct fr_tp *endpoints;
static uint64_t next_id = 1;
static int connects[FAKE_MAX_RANKS][FAKE_MAX_RANKS];
static int connects_total;
static struct fake_log *wlog;
static size_t wlog_n, wlog_cap;
static struct {
	bool armed, fired;
	int from, to, type, skip;
	enum fake_fault kind;
	size_t offset;
	uint8_t xor_mask;
} fault;

/* ---- helpers (G held) ------------------------------------------------------
 */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void __attribute__((format(printf, 2, 3)))
seterr(struct fr_tp *tp, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tp->errbuf, sizeof(tp->errbuf), fmt, ap);
	va_end(ap);
}

static void signal_ep(struct fr_tp *tp)
{
	uint64_t one = 1;

	if (clk) {
		/* the clock's owner drives every endpoint itself: it only
		 * needs to know which one has work now */
		clk->ready(clk, tp->rank);
		return;
	}
	if (write(tp->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		perror("fake_tp: eventfd write");
}

static void drain_ep(struct fr_tp *tp)
{
	uint64_t v;

	if (clk)
		return;
	if (read(tp->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		perror("fake_tp: eventfd read");
}

static void cq_push(struct fr_tp *tp, int kind, int status,
		    struct fr_tp_conn *c, uint64_t ctx, uint32_t imm,
		    uint32_t len)
{
	struct fr_tp_cqe *q;

	if (tp->cq_count == tp->cq_cap) {
		size_t cap = tp->cq_cap ? 2 * tp->cq_cap : 64;
		struct fr_tp_cqe *n = malloc(cap * sizeof(*n));

		if (!n) {
			fprintf(stderr, "fake_tp: out of memory\n");
			abort();
		}
		for (size_t i = 0; i < tp->cq_count; i++)
			n[i] = tp->cq[(tp->cq_head + i) % tp->cq_cap];
		free(tp->cq);
		tp->cq = n;
		tp->cq_cap = cap;
		tp->cq_head = 0;
	}
	q = &tp->cq[(tp->cq_head + tp->cq_count) % tp->cq_cap];
	memset(q, 0, sizeof(*q));
	q->kind = kind;
	q->status = status;
	q->conn = c;
	q->ctx = ctx;
	q->imm = imm;
	q->len = len;
	if (kind == FR_CQE_SEND)
		c->unreaped++;
	tp->cq_count++;
	signal_ep(tp);
}

/* Drop every completion that names c (it is being closed). */
static void cq_purge(struct fr_tp *tp, const struct fr_tp_conn *c)
{
	size_t keep = 0;

	for (size_t i = 0; i < tp->cq_count; i++) {
		struct fr_tp_cqe q = tp->cq[(tp->cq_head + i) % tp->cq_cap];

		if (q.conn != c)
			tp->cq[(tp->cq_head + keep++) % tp->cq_cap] = q;
	}
	tp->cq_count = keep;
}

static struct fr_tp *ep_by_id(uint64_t id)
{
	for (struct fr_tp *tp = endpoints; tp; tp = tp->next)
		if (tp->id == id)
			return tp;
	return NULL;
}

/* The newest live endpoint of rank (endpoints are linked newest first). */
static struct fr_tp *ep_by_rank(int rank)
{
	for (struct fr_tp *tp = endpoints; tp; tp = tp->next)
		if (tp->rank == rank && !tp->dead)
			return tp;
	return NULL;
}

static void sq_release(struct fr_tp_conn *c)
{
	for (unsigned int i = 0; i < c->sq_count; i++) {
		struct fake_sqe *e = &c->sq[(c->sq_head + i) % c->sq_depth];

		if (e->lmr)
			e->lmr->inflight--;
		e->lmr = NULL;
	}
}

/* Cut c from its other end, which fails with FR_EPEER when its endpoint
 * next makes progress. */
static void conn_cut(struct fr_tp_conn *c)
{
	struct fr_tp_conn *d = c->peer;

	c->peer = NULL;
	if (!d)
		return;
	d->peer = NULL;
	if (d->state != FK_FAILED && !d->doom) {
		d->doom = FR_EPEER;
		signal_ep(d->tp);
	}
}

/*
 * Fail c: an established connection its owner holds gets one failed RECV
 * completion and a failed SEND for every queued write (as TCP), a
 * connection still coming up just reports err from connect_done(); the
 * other end, if any, is cut (it sees the close).
 */
static void __attribute__((format(printf, 3, 4)))
conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...)
{
	bool was_up = c->state == FK_UP;
	char msg[160];
	va_list ap;

	if (c->state == FK_FAILED)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	seterr(c->tp, "connection %s rank %d: %s", c->incoming ? "from" : "to",
	       c->peer_rank, msg);
	c->state = FK_FAILED;
	c->error = err;
	if (was_up && c->owned) {
		cq_push(c->tp, FR_CQE_RECV, err, c, 0, 0, 0);
		for (unsigned int i = 0; i < c->sq_count; i++)
			if (!c->sq[(c->sq_head + i) % c->sq_depth].inl)
				cq_push(c->tp, FR_CQE_SEND, err, c,
					c->sq[(c->sq_head + i) % c->sq_depth]
						.ctx,
					0, 0);
	}
	sq_release(c);
	c->sq_count = 0;
	signal_ep(c->tp);
	conn_cut(c);
}

static void conn_free(struct fr_tp_conn *c)
{
	struct fr_tp_conn **pp;

	for (pp = &c->tp->conns; *pp && *pp != c; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = c->next;
	conn_cut(c);
	cq_purge(c->tp, c);
	sq_release(c);
	free(c->sq);
	free(c);
}

static struct fr_tp_conn *conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->sq = calloc(tp->sq_depth, sizeof(*c->sq));
	if (!c->sq) {
		free(c);
		return NULL;
	}
	c->tp = tp;
	c->sq_depth = tp->sq_depth;
	c->peer_rank = -1;
	c->next = tp->conns;
	tp->conns = c;
	return c;
}

/* A live incoming connection from rank at tp (TCP refuses a second). */
static bool rank_taken(struct fr_tp *tp, int rank)
{
	for (struct fr_tp_conn *c = tp->conns; c; c = c->next)
		if (c->incoming && c->state == FK_UP && c->peer_rank == rank &&
		    c->peer)
			return true;
	return false;
}

/* An outgoing connection still without an answer: try its endpoint. */
static void try_establish(struct fr_tp_conn *c, uint64_t now)
{
	struct fr_tp *me = c->tp, *t;
	struct fr_tp_conn *in;

	if (c->state != FK_RETRY)
		return;
	if (me->dead) {
		conn_fail(c, FR_EPEER, "this endpoint is dead");
		return;
	}
	t = now >= c->retry_ms ? ep_by_id(c->target) : NULL;
	if (now >= c->retry_ms)
		c->retry_ms = now + FAKE_RETRY_MS;
	if (!t || t->dead || t->frozen) {
		if (now >= c->deadline_ms)
			conn_fail(c, FR_ETIMEDOUT,
				  "could not connect within %d ms",
				  me->timeout_ms);
		return;
	}
	if (t->refuse) {
		conn_fail(c, t->refuse, "rank %d refused the connection",
			  t->rank);
		return;
	}
	if (t->nonce != me->nonce) {
		conn_fail(c, FR_EAUTH, "refused: wrong job nonce");
		return;
	}
	if (rank_taken(t, me->rank)) {
		conn_fail(c, FR_EBUSY,
			  "refused: it already has a connection from rank %d",
			  me->rank);
		return;
	}
	in = conn_new(t);
	if (!in) {
		conn_fail(c, FR_ENOMEM, "out of memory");
		return;
	}
	in->incoming = true;
	in->peer_rank = me->rank;
	in->state = FK_UP;
	in->peer = c;
	c->peer = in;
	c->state = FK_UP;
	if (me->rank >= 0 && me->rank < FAKE_MAX_RANKS && t->rank >= 0 &&
	    t->rank < FAKE_MAX_RANKS)
		connects[me->rank][t->rank]++;
	connects_total++;
	signal_ep(t);
}

static bool fault_matches(const struct fr_tp_conn *c, const struct fake_sqe *e)
{
	if (!fault.armed || c->tp->rank != fault.from ||
	    c->peer_rank != fault.to || (int)(e->imm >> 28) != fault.type)
		return false;
	if (fault.kind != FAKE_DROP && e->len <= fault.offset)
		return false;
	if (fault.skip > 0) {
		fault.skip--;
		return false;
	}
	fault.armed = false;
	fault.fired = true;
	return true;
}

/* Land the head of c's send queue at the other end: false if the
 * connection failed instead. */
static bool deliver_one(struct fr_tp_conn *c)
{
	struct fake_sqe *e = &c->sq[c->sq_head];
	struct fr_tp_conn *d = c->peer;
	struct fr_tp *t = d->tp;
	struct fr_tp_mr *mr = NULL;
	bool hit = fault_matches(c, e);
	uint64_t roff = e->roff;

	if (hit && fault.kind == FAKE_DROP)
		goto sent;
	if (e->len) {
		if (e->rid < t->nregions)
			mr = t->regions[e->rid].mr;
		if (hit && fault.kind == FAKE_OOB && mr)
			roff = mr->len - e->len / 2;
		if (!mr || mr->gen != e->rgen) {
			conn_fail(
				d, FR_ERANGE,
				"write of %zu bytes to unknown or deregistered region %u/%u",
				e->len, e->rid, e->rgen);
			return false;
		}
		if (!(mr->access & FR_TP_REMOTE_WRITE)) {
			conn_fail(
				d, FR_ERANGE,
				"write to region %u, which does not allow remote writes",
				e->rid);
			return false;
		}
		if (roff > mr->len || e->len > mr->len - roff) {
			conn_fail(
				d, FR_ERANGE,
				"write of %zu bytes at offset %llu outside region %u of %zu bytes",
				e->len, (unsigned long long)roff, e->rid,
				mr->len);
			return false;
		}
		memcpy(mr->base + roff,
		       e->inl ? e->inl_bytes : e->lmr->base + e->loff,
		       clk && clk->copy_max && e->len > clk->copy_max
			       ? clk->copy_max
			       : e->len);
		if (hit && fault.kind == FAKE_CORRUPT)
			mr->base[roff + fault.offset] ^= fault.xor_mask;
	}
	cq_push(t, FR_CQE_RECV, 0, d, 0, e->imm, (uint32_t)e->len);
sent:
	if (e->lmr)
		e->lmr->inflight--;
	e->lmr = NULL;
	if (!e->inl) /* an inline write has no SEND completion */
		cq_push(c->tp, FR_CQE_SEND, 0, c, e->ctx, 0, 0);
	c->sq_head = (c->sq_head + 1) % c->sq_depth;
	c->sq_count--;
	return true;
}

/* Can c's queued writes leave now?  With a clock, once the first one's
 * time has come. */
static bool deliverable(const struct fr_tp_conn *c)
{
	return c->state == FK_UP && c->sq_count && c->peer && c->peer->owned &&
	       !c->tp->frozen && (!clk || c->sq[c->sq_head].due <= clk->now);
}

/* Land what c has queued, in order, as far as the other end allows. */
static void deliver(struct fr_tp_conn *c)
{
	while (deliverable(c))
		if (!deliver_one(c))
			break;
}

static void progress(struct fr_tp *tp)
{
	uint64_t now = now_ms();
	struct fr_tp_conn *c, *next;

	if (tp->frozen)
		return;
	for (c = tp->conns; c; c = next) {
		next = c->next;
		if (c->doom && c->state != FK_FAILED)
			conn_fail(c, c->doom,
				  c->state == FK_UP
					  ? "the peer closed the connection"
					  : "the peer went away");
		if (c->state == FK_RETRY)
			try_establish(c, now);
		deliver(c);
		/* a refused or dropped connection nobody holds */
		if (c->state == FK_FAILED && !c->owned)
			conn_free(c);
	}
}

static bool ready(struct fr_tp *tp)
{
	if (tp->frozen)
		return false;
	if (tp->cq_count)
		return true;
	for (struct fr_tp_conn *c = tp->conns; c; c = c->next)
		if (deliverable(c) || (c->doom && c->state != FK_FAILED))
			return true;
	return false;
}

static bool retrying(const struct fr_tp *tp)
{
	for (const struct fr_tp_conn *c = tp->conns; c; c = c->next)
		if (c->state == FK_RETRY)
			return true;
	return false;
}

/* ---- the operations --------------------------------------------------------
 */

static int fake_probe(char *errbuf, size_t errlen)
{
	(void)errbuf;
	(void)errlen;
	return 0;
}

static int fake_open(const struct fr_tp_params *p, struct fr_tp **out,
		     void *addr, size_t *addrlen)
{
	struct fr_tp *tp;
	uint8_t *a = addr;

	if (!p || !out || !addr || !addrlen || p->size < sizeof(*p) ||
	    *addrlen < FAKE_ADDR_LEN)
		return FR_EINVAL;
	tp = calloc(1, sizeof(*tp));
	if (!tp)
		return FR_ENOMEM;
	tp->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tp->efd < 0) {
		if (p->errbuf && p->errlen)
			snprintf(p->errbuf, p->errlen, "fake: eventfd: %s",
				 strerror(errno));
		free(tp);
		return FR_ESYS;
	}
	tp->rank = p->rank;
	tp->nonce = p->job_nonce;
	tp->timeout_ms =
		p->timeout_ms > 0 ? p->timeout_ms : FAKE_DEFAULT_TIMEOUT_MS;
	tp->sq_depth =
		p->sq_depth > 0 ? (unsigned int)p->sq_depth : FAKE_DEFAULT_SQ;
	pthread_mutex_lock(&G);
	tp->id = next_id++;
	tp->next = endpoints;
	endpoints = tp;
	pthread_mutex_unlock(&G);
	put32(a, FAKE_ADDR_MAGIC);
	a[4] = 1; /* version */
	a[5] = a[6] = a[7] = 0;
	put64(a + 8, tp->id);
	*addrlen = FAKE_ADDR_LEN;
	*out = tp;
	return 0;
}

static int fake_connect(struct fr_tp *tp, int peer, const void *addr,
			size_t addrlen, struct fr_tp_conn **out)
{
	const uint8_t *a = addr;
	struct fr_tp_conn *c;
	uint64_t id, now = now_ms();

	if (!tp || !addr || !out || peer < 0)
		return FR_EINVAL;
	if (addrlen != FAKE_ADDR_LEN || get32(a) != FAKE_ADDR_MAGIC ||
	    a[4] != 1 || a[5] || a[6] || a[7])
		return FR_EPROTO;
	id = get64(a + 8);
	if (!id || id == UINT64_MAX)
		return FR_EPROTO;
	pthread_mutex_lock(&G);
	c = conn_new(tp);
	if (!c) {
		pthread_mutex_unlock(&G);
		return FR_ENOMEM;
	}
	c->owned = true;
	c->peer_rank = peer;
	c->state = FK_RETRY;
	c->target = id;
	c->deadline_ms = now + (uint64_t)tp->timeout_ms;
	c->retry_ms = now;
	try_establish(c, now);
	*out = c;
	pthread_mutex_unlock(&G);
	return 0;
}

static int fake_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **out)
{
	int rc = FR_EAGAIN;

	if (!tp || !out || peer < 0)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	progress(tp);
	for (struct fr_tp_conn *c = tp->conns; c; c = c->next)
		if (c->incoming && !c->owned && c->state == FK_UP &&
		    c->peer_rank == peer) {
			c->owned = true;
			*out = c;
			/* the writes queued at the other end land now */
			if (c->peer)
				deliver(c->peer);
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&G);
	return rc;
}

static int fake_connect_done(struct fr_tp_conn *c)
{
	int rc;

	if (!c)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	progress(c->tp);
	rc = c->state == FK_UP	     ? 0
	     : c->state == FK_FAILED ? c->error
				     : FR_EAGAIN;
	pthread_mutex_unlock(&G);
	return rc;
}

static int fake_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
			struct fr_tp_mr **out)
{
	const int all =
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	struct fr_tp_mr *mr;
	uint32_t id;

	if (!tp || !out || (access & ~all) || (!buf && len) ||
	    (uintptr_t)buf + len < (uintptr_t)buf)
		return FR_EINVAL;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return FR_ENOMEM;
	pthread_mutex_lock(&G);
	for (id = 0; id < tp->nregions; id++)
		if (!tp->regions[id].mr)
			break;
	if (id == tp->nregions) {
		uint32_t cap = tp->nregions ? 2 * tp->nregions : 16;
		struct fake_region *r = realloc(tp->regions, cap * sizeof(*r));

		if (!r) {
			pthread_mutex_unlock(&G);
			free(mr);
			return FR_ENOMEM;
		}
		for (uint32_t i = tp->nregions; i < cap; i++) {
			r[i].mr = NULL;
			r[i].gen = 1;
		}
		tp->regions = r;
		tp->nregions = cap;
	}
	mr->tp = tp;
	mr->base = buf;
	mr->len = len;
	mr->access = access;
	mr->id = id;
	mr->gen = tp->regions[id].gen;
	tp->regions[id].mr = mr;
	pthread_mutex_unlock(&G);
	*out = mr;
	return 0;
}

static int fake_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr)
{
	int rc = 0;

	if (!tp || !mr)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	if (mr->tp != tp || mr->id >= tp->nregions ||
	    tp->regions[mr->id].mr != mr) {
		rc = FR_EINVAL;
	} else if (mr->inflight) {
		rc = FR_EBUSY; /* queued writes still read from it */
	} else {
		tp->regions[mr->id].mr = NULL;
		tp->regions[mr->id].gen =
			mr->gen == UINT32_MAX ? 1 : mr->gen + 1;
		free(mr);
	}
	pthread_mutex_unlock(&G);
	return rc;
}

static int fake_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len)
{
	uint8_t *b = blob;

	if (!mr || !blob || !len || *len < FAKE_RKEY_LEN)
		return FR_EINVAL;
	b[0] = FAKE_RKEY_MAGIC;
	b[1] = 1; /* version */
	b[2] = b[3] = 0;
	put32(b + 4, mr->id);
	put32(b + 8, mr->gen);
	put64(b + 12, mr->len);
	*len = FAKE_RKEY_LEN;
	return 0;
}

static int fake_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
			    struct fr_tp_rkey *rkey)
{
	const uint8_t *b = blob;

	(void)tp;
	if (!blob || !rkey)
		return FR_EINVAL;
	if (len != FAKE_RKEY_LEN || b[0] != FAKE_RKEY_MAGIC || b[1] != 1 ||
	    b[2] || b[3] || !get32(b + 8) || get32(b + 4) >= (1u << 20))
		return FR_EPROTO;
	memset(rkey, 0, sizeof(*rkey));
	rkey->a = get64(b + 12);
	rkey->c = get32(b + 4);
	rkey->d = get32(b + 8);
	return 0;
}

static void log_write(const struct fr_tp_conn *c, const struct fake_sqe *e)
{
	struct fake_log *l;

	if (wlog_n == wlog_cap) {
		size_t cap = wlog_cap ? 2 * wlog_cap : 1024;
		struct fake_log *n = realloc(wlog, cap * sizeof(*n));

		if (!n)
			return; /* counters are best effort without memory */
		wlog = n;
		wlog_cap = cap;
	}
	l = &wlog[wlog_n++];
	l->from = c->tp->rank;
	l->to = c->peer_rank;
	l->imm = e->imm;
	l->len = (uint32_t)e->len;
	memset(l->head, 0, sizeof(l->head));
	if (e->len)
		memcpy(l->head, e->inl ? e->inl_bytes : e->lmr->base + e->loff,
		       e->len < FAKE_HEAD ? e->len : FAKE_HEAD);
}

/* Queue e (its source set by the caller) at the tail of c's send queue,
 * log it and put it on the wire at once where the other end lets it (TCP
 * sends when its queue was empty): a failing rank's last ABORT must not
 * wait for a poll that never comes.  Called with G held. */
static void sq_post(struct fr_tp_conn *c, struct fake_sqe *e,
		    const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		    uint32_t imm, uint64_t ctx)
{
	e->rid = rkey ? rkey->c : 0;
	e->rgen = rkey ? rkey->d : 0;
	e->roff = roff;
	e->len = len;
	e->imm = imm;
	e->ctx = ctx;
	c->sq_count++;
	if (clk) /* no log: a simulation posts millions of writes */
		e->due = clk->due(clk, c->tp->rank, c->peer_rank, len);
	else
		log_write(c, e);
	deliver(c);
}

static int fake_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr,
			  size_t loff, const struct fr_tp_rkey *rkey,
			  uint64_t roff, size_t len, uint32_t imm, uint64_t ctx)
{
	struct fake_sqe *e;
	int rc = 0;

	if (!c)
		return FR_EINVAL;
	if (len > UINT32_MAX)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	if (c->state == FK_FAILED) {
		rc = c->error;
		goto out;
	}
	if (c->state != FK_UP) {
		rc = FR_EAGAIN;
		goto out;
	}
	if (len) {
		if (!lmr || !rkey || lmr->tp != c->tp || !rkey->d) {
			rc = FR_EINVAL;
			goto out;
		}
		if (loff > lmr->len || len > lmr->len - loff) {
			rc = FR_ERANGE;
			goto out;
		}
	}
	if (c->sq_count + c->unreaped >= c->sq_depth) {
		rc = FR_EAGAIN;
		goto out;
	}
	e = &c->sq[(c->sq_head + c->sq_count) % c->sq_depth];
	e->inl = false;
	e->lmr = len ? lmr : NULL;
	e->loff = loff;
	if (e->lmr)
		e->lmr->inflight++;
	sq_post(c, e, rkey, roff, len, imm, ctx);
out:
	pthread_mutex_unlock(&G);
	return rc;
}

/* fake_tp_inline(): 1 takes every write_inline, 0 none, 2 every other */
static int inline_mode = 1;
static unsigned int inline_calls;

/* write_inline: queued like any write, with its bytes copied in now, and
 * no SEND completion when it lands (in order with the other writes). */
static int fake_write_inline(struct fr_tp_conn *c, const void *buf,
			     const struct fr_tp_rkey *rkey, uint64_t roff,
			     size_t len, uint32_t imm)
{
	struct fake_sqe *e;
	int rc = 0;

	if (!c || !buf || !rkey || !rkey->d || !len || len > FR_TP_INLINE_MAX)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	if (c->state == FK_FAILED) {
		rc = c->error;
		goto out;
	}
	if (c->state != FK_UP || !inline_mode ||
	    (inline_mode == 2 && inline_calls++ % 2) ||
	    c->sq_count + c->unreaped >= c->sq_depth) {
		rc = FR_EAGAIN;
		goto out;
	}
	e = &c->sq[(c->sq_head + c->sq_count) % c->sq_depth];
	e->inl = true;
	memcpy(e->inl_bytes, buf, len);
	e->lmr = NULL;
	e->loff = 0;
	sq_post(c, e, rkey, roff, len, imm, 0);
out:
	pthread_mutex_unlock(&G);
	return rc;
}

void fake_tp_clock(struct fake_clock *c)
{
	pthread_mutex_lock(&G);
	clk = c;
	pthread_mutex_unlock(&G);
}

void fake_tp_inline(int mode)
{
	pthread_mutex_lock(&G);
	inline_mode = mode;
	inline_calls = 0;
	pthread_mutex_unlock(&G);
}

static int fake_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	int n = 0;

	if (!tp || max < 0 || (max && !cqe))
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	if (!tp->frozen) {
		drain_ep(tp);
		progress(tp);
		while (n < max && tp->cq_count) {
			cqe[n] = tp->cq[tp->cq_head];
			if (cqe[n].kind == FR_CQE_SEND)
				cqe[n].conn->unreaped--;
			n++;
			tp->cq_head = (tp->cq_head + 1) % tp->cq_cap;
			tp->cq_count--;
		}
		/* with a clock, what is left is said again: nothing else
		 * would say it */
		if (clk && tp->cq_count)
			clk->ready(clk, tp->rank);
	}
	pthread_mutex_unlock(&G);
	return n;
}

static int fake_wait_prepare(struct fr_tp *tp, int *timeout_ms)
{
	int rc = 0;

	if (!tp || !timeout_ms)
		return FR_EINVAL;
	pthread_mutex_lock(&G);
	if (ready(tp))
		rc = 1;
	else if (retrying(tp) &&
		 (*timeout_ms < 0 || *timeout_ms > FAKE_RETRY_MS))
		*timeout_ms = FAKE_RETRY_MS;
	pthread_mutex_unlock(&G);
	return rc;
}

static int fake_wait_fd(struct fr_tp *tp)
{
	return tp ? tp->efd : -1;
}

static void fake_wait_finish(struct fr_tp *tp)
{
	(void)tp; /* nothing armed; poll() drains the eventfd */
}

static int fake_wait(struct fr_tp *tp, int timeout_ms)
{
	struct pollfd pfd;
	int t = timeout_ms, rc;

	rc = fake_wait_prepare(tp, &t);
	if (rc)
		return rc < 0 ? rc : 0;
	pfd.fd = tp->efd;
	pfd.events = POLLIN;
	pfd.revents = 0;
	if (poll(&pfd, 1, t) < 0 && errno != EINTR)
		return FR_ESYS;
	if (pfd.revents & POLLIN)
		drain_ep(tp);
	return 0;
}

static void fake_wake(struct fr_tp *tp)
{
	if (tp)
		signal_ep(tp);
}

static void fake_close_conn(struct fr_tp_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&G);
	conn_free(c);
	pthread_mutex_unlock(&G);
}

static void fake_close(struct fr_tp *tp)
{
	struct fr_tp **pp;

	if (!tp)
		return;
	pthread_mutex_lock(&G);
	while (tp->conns)
		conn_free(tp->conns);
	for (pp = &endpoints; *pp && *pp != tp; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = tp->next;
	pthread_mutex_unlock(&G);
	for (uint32_t i = 0; i < tp->nregions; i++)
		free(tp->regions[i].mr);
	free(tp->regions);
	free(tp->cq);
	close(tp->efd);
	free(tp);
}

static int fake_conn_peer(const struct fr_tp_conn *c)
{
	return c ? c->peer_rank : -1;
}

static const char *fake_last_error(struct fr_tp *tp)
{
	if (!tp)
		return "";
	pthread_mutex_lock(&G);
	memcpy(tp->errcopy, tp->errbuf, sizeof(tp->errcopy));
	pthread_mutex_unlock(&G);
	return tp->errcopy;
}

static int fake_pending(struct fr_tp *tp, int *peers, int max)
{
	int n = 0;

	if (!tp || !peers)
		return 0;
	pthread_mutex_lock(&G);
	for (struct fr_tp_conn *c = tp->conns; c && n < max; c = c->next)
		if (c->incoming && !c->owned && c->state == FK_UP)
			peers[n++] = c->peer_rank;
	pthread_mutex_unlock(&G);
	return n;
}

const struct fr_tp_ops fake_tp_ops = {
	.size = sizeof(struct fr_tp_ops),
	.name = "fake",
	.probe = fake_probe,
	.open = fake_open,
	.connect = fake_connect,
	.accept = fake_accept,
	.connect_done = fake_connect_done,
	.reg_mem = fake_reg_mem,
	.dereg_mem = fake_dereg_mem,
	.pack_rkey = fake_pack_rkey,
	.unpack_rkey = fake_unpack_rkey,
	.write_imm = fake_write_imm,
	.write_inline = fake_write_inline,
	.poll = fake_poll,
	.wait = fake_wait,
	.wake = fake_wake,
	.wait_prepare = fake_wait_prepare,
	.wait_fd = fake_wait_fd,
	.wait_finish = fake_wait_finish,
	.close_conn = fake_close_conn,
	.close = fake_close,
	.conn_peer = fake_conn_peer,
	.last_error = fake_last_error,
	.pending = fake_pending,
};

/* ---- the tests' controls ---------------------------------------------------
 */

void fake_tp_install(void)
{
	if (fr_transport_find("fake") != &fake_tp_ops &&
	    fr_transport_register(&fake_tp_ops)) {
		fprintf(stderr, "fake_tp: cannot register the transport\n");
		abort();
	}
}

void fake_tp_reset(void)
{
	pthread_mutex_lock(&G);
	memset(connects, 0, sizeof(connects));
	connects_total = 0;
	free(wlog);
	wlog = NULL;
	wlog_n = wlog_cap = 0;
	memset(&fault, 0, sizeof(fault));
	inline_mode = 1;
	inline_calls = 0;
	for (struct fr_tp *tp = endpoints; tp; tp = tp->next) {
		tp->frozen = false;
		tp->refuse = 0;
	}
	pthread_mutex_unlock(&G);
}

int fake_tp_endpoints(void)
{
	int n = 0;

	pthread_mutex_lock(&G);
	for (struct fr_tp *tp = endpoints; tp; tp = tp->next)
		n++;
	pthread_mutex_unlock(&G);
	return n;
}

int fake_tp_connects(int a, int b)
{
	int n = 0;

	pthread_mutex_lock(&G);
	if (a >= 0 && a < FAKE_MAX_RANKS && b >= 0 && b < FAKE_MAX_RANKS)
		n = connects[a][b];
	pthread_mutex_unlock(&G);
	return n;
}

int fake_tp_connects_total(void)
{
	int n;

	pthread_mutex_lock(&G);
	n = connects_total;
	pthread_mutex_unlock(&G);
	return n;
}

static bool log_match(const struct fake_log *l, int from, int to, int type)
{
	return (from < 0 || l->from == from) && (to < 0 || l->to == to) &&
	       (type < 0 || (int)(l->imm >> 28) == type);
}

uint64_t fake_tp_writes(int from, int to, int imm_type)
{
	uint64_t n = 0;

	pthread_mutex_lock(&G);
	for (size_t i = 0; i < wlog_n; i++)
		n += log_match(&wlog[i], from, to, imm_type);
	pthread_mutex_unlock(&G);
	return n;
}

uint64_t fake_tp_writes_imm(int from, int to, uint32_t imm)
{
	uint64_t n = 0;

	pthread_mutex_lock(&G);
	for (size_t i = 0; i < wlog_n; i++)
		n += log_match(&wlog[i], from, to, -1) && wlog[i].imm == imm;
	pthread_mutex_unlock(&G);
	return n;
}

int fake_tp_write_head(int from, int to, uint32_t imm, int k, uint8_t *buf,
		       size_t max)
{
	int rc = -1;

	pthread_mutex_lock(&G);
	for (size_t i = 0; i < wlog_n; i++) {
		const struct fake_log *l = &wlog[i];
		size_t n;

		if (!log_match(l, from, to, -1) || l->imm != imm || k-- > 0)
			continue;
		n = l->len < FAKE_HEAD ? l->len : FAKE_HEAD;
		n = n < max ? n : max;
		memcpy(buf, l->head, n);
		rc = (int)n;
		break;
	}
	pthread_mutex_unlock(&G);
	return rc;
}

size_t fake_tp_imms(int from, int to, int imm_type, uint32_t *imms, size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(&G);
	for (size_t i = 0; i < wlog_n; i++)
		if (log_match(&wlog[i], from, to, imm_type)) {
			if (n < max)
				imms[n] = wlog[i].imm;
			n++;
		}
	pthread_mutex_unlock(&G);
	return n;
}

void fake_tp_kill(int rank)
{
	struct fr_tp *tp;

	pthread_mutex_lock(&G);
	tp = ep_by_rank(rank);
	if (tp) {
		tp->dead = true;
		for (struct fr_tp_conn *c = tp->conns; c; c = c->next) {
			conn_cut(c);
			if (c->state != FK_FAILED)
				c->doom = FR_EPEER;
		}
		signal_ep(tp);
	}
	pthread_mutex_unlock(&G);
}

void fake_tp_break(int a, int b)
{
	struct fr_tp *tp;

	pthread_mutex_lock(&G);
	tp = ep_by_rank(a);
	if (tp)
		for (struct fr_tp_conn *c = tp->conns; c; c = c->next)
			if (c->peer_rank == b && c->state == FK_UP) {
				conn_cut(c);
				c->doom = FR_EPEER;
				signal_ep(tp);
			}
	pthread_mutex_unlock(&G);
}

void fake_tp_freeze(int rank, bool on)
{
	struct fr_tp *tp;

	pthread_mutex_lock(&G);
	tp = ep_by_rank(rank);
	if (tp) {
		tp->frozen = on;
		signal_ep(tp);
	}
	pthread_mutex_unlock(&G);
}

void fake_tp_refuse(int rank, int err)
{
	struct fr_tp *tp;

	pthread_mutex_lock(&G);
	tp = ep_by_rank(rank);
	if (tp)
		tp->refuse = err;
	pthread_mutex_unlock(&G);
}

void fake_tp_fault(int from, int to, int imm_type, int skip,
		   enum fake_fault kind, size_t offset, uint8_t xor_mask)
{
	pthread_mutex_lock(&G);
	fault.armed = true;
	fault.fired = false;
	fault.from = from;
	fault.to = to;
	fault.type = imm_type;
	fault.skip = skip;
	fault.kind = kind;
	fault.offset = offset;
	fault.xor_mask = xor_mask;
	pthread_mutex_unlock(&G);
}

bool fake_tp_fault_fired(void)
{
	bool f;

	pthread_mutex_lock(&G);
	f = fault.fired;
	pthread_mutex_unlock(&G);
	return f;
}

/* ---- a job in this process -------------------------------------------------
 */

struct job_arg {
	fr_config_t cfg;
	fr_comm_t *comm;
	int rc;
	char err[512];
	pthread_t t;
};

static void *job_create_main(void *arg)
{
	struct job_arg *a = arg;

	a->rc = fr_comm_create(&a->cfg, &a->comm);
	if (a->rc)
		snprintf(a->err, sizeof(a->err), "%s",
			 fr_comm_last_error(NULL));
	return NULL;
}

/* A port nobody listens on now. */
static uint16_t free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint16_t port = 0;

	if (fd < 0)
		return 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
	    !getsockname(fd, (struct sockaddr *)&a, &al))
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

int fake_job_create(int n, const fr_config_t *cfg, fr_comm_t **comms, char *err,
		    size_t errlen)
{
	struct job_arg *a = calloc((size_t)n, sizeof(*a));
	char rdv[64];
	int rc = 0;

	if (!a)
		return FR_ENOMEM;
	/*
	 * A port taken between free_port() and rank 0's bind, or a
	 * rendezvous slower than a test's small timeout (it bounds the
	 * rendezvous too) on a loaded machine: again, on another port.
	 */
	for (int attempt = 0; attempt < 5; attempt++) {
		snprintf(rdv, sizeof(rdv), "127.0.0.1:%u",
			 (unsigned)free_port());
		for (int r = 0; r < n; r++) {
			if (cfg) {
				a[r].cfg = *cfg;
			} else {
				fr_config_init(&a[r].cfg);
				a[r].cfg.timeout_ms = 20000;
			}
			a[r].cfg.rank = r;
			a[r].cfg.nranks = n;
			a[r].cfg.rendezvous = rdv;
			a[r].cfg.transport = "fake";
			a[r].comm = NULL;
			a[r].err[0] = '\0';
			if (pthread_create(&a[r].t, NULL, job_create_main,
					   &a[r])) {
				a[r].rc = FR_ESYS;
				snprintf(a[r].err, sizeof(a[r].err),
					 "pthread_create failed");
				a[r].t = pthread_self();
			}
		}
		rc = 0;
		for (int r = 0; r < n; r++) {
			if (!pthread_equal(a[r].t, pthread_self()))
				pthread_join(a[r].t, NULL);
			if (a[r].rc && !rc) {
				rc = a[r].rc;
				snprintf(err, errlen, "rank %d: %s: %s", r,
					 fr_errname(a[r].rc), a[r].err);
			}
		}
		if (!rc)
			break;
		for (int r = 0; r < n; r++)
			fr_comm_destroy(a[r].comm);
		if (rc != FR_EBOOTSTRAP && rc != FR_ETIMEDOUT)
			break;
	}
	for (int r = 0; r < n; r++)
		comms[r] = rc ? NULL : a[r].comm;
	free(a);
	return rc;
}

int fake_job_drive(fr_comm_t **comms, int ncomms, fr_request_t **reqs, int *rcs,
		   int nreq, int deadline_ms)
{
	uint64_t end = now_ms() + (uint64_t)deadline_ms;

	for (;;) {
		int left = 0;

		for (int i = 0; i < nreq; i++) {
			int done = 0, rc;

			if (!reqs[i])
				continue;
			rc = fr_test(&reqs[i], &done);
			if (done)
				rcs[i] = rc;
			else
				left++;
		}
		if (!left)
			return 0;
		if (now_ms() > end)
			return FR_ETIMEDOUT;
		for (int r = 0; r < ncomms; r++)
			if (comms[r])
				fr_progress(comms[r]);
	}
}

struct job_destroy {
	fr_comm_t *comm;
	pthread_t t;
	bool started;
};

static void *job_destroy_main(void *arg)
{
	struct job_destroy *d = arg;

	fr_comm_destroy(d->comm);
	return NULL;
}

void fake_job_destroy(int n, fr_comm_t **comms)
{
	struct job_destroy *d = calloc((size_t)n, sizeof(*d));

	for (int r = 0; r < n; r++) {
		if (!comms[r])
			continue;
		if (d) {
			d[r].comm = comms[r];
			d[r].started = !pthread_create(&d[r].t, NULL,
						       job_destroy_main, &d[r]);
		}
		if (!d || !d[r].started)
			fr_comm_destroy(comms[r]);
		comms[r] = NULL;
	}
	for (int r = 0; d && r < n; r++)
		if (d[r].started)
			pthread_join(d[r].t, NULL);
	free(d);
}
