/* SPDX-License-Identifier: MIT */
/*
 * fr_share.c - the shared endpoint: several communicators over one
 * transport endpoint and its connections.  This file: the design, the
 * view's operations and the endpoint's interface (transport.h);
 * share_link.c: the links, the lock and the routing of completions;
 * share.h: the structures and who calls what.
 *
 * A job opens one endpoint (tcp, shm, verbs or a mix) and connects its
 * ranks once; every communicator split from it (fr_comm_split,
 * fr_comm_dup) talks over the same endpoint and the same connections,
 * with no listener or rendezvous of its own.  Each communicator sees a
 * view: an endpoint behind the same interface (transport.h), numbered by
 * its own ranks, so that the core above runs unchanged.
 *
 * Design
 *   - Links.  The real connections to one rank of the endpoint.  The lower
 *     rank connects as soon as a view wants the link; the higher one waits
 *     SHR_GRACE_MS for it, then connects too (the lower rank may be late,
 *     and a waiting rank must reach it to tell late from dead).  Incoming
 *     connections are taken at once.  So a link may have two connections,
 *     one each way; each side writes on the first that came up and keeps
 *     it, so writes between two ranks stay in order (FIFO per sender).
 *   - Ids.  A communicator has an id, 0..255 and equal on all its ranks
 *     (the split chooses the lowest free on all of them; the job's first
 *     communicator is 0).  A view's writes carry it in bits 20..27 of the
 *     immediate and 48..55 of the SEND ctx; poll() reads them back, strips
 *     them, and puts the completion on the view's queue with the view's
 *     connection.  Completions for an id with no view yet (a peer that
 *     finished the split first) wait, unclaimed, for the view that takes
 *     the id; those for a view that has no connection to the sender yet
 *     wait for it (pending() names them, as a transport names connections
 *     not yet accepted).
 *   - A view's connect() and accept() give a connection at once, which
 *     connect_done() completes when the link is up; they may be called in
 *     any order by either side.  Closing one closes nothing real, unless
 *     writes from the caller's memory are still queued on it (a failed
 *     communicator cutting its peers off): then the link goes, so that
 *     nothing reads that memory afterwards.
 *   - A dead link fails every view's connection over it; a view with no
 *     connection to that rank learns it when it asks for one.  So a rank's
 *     death fails the communicators that need it, and no other.
 *   - A closed view's id is free again only if its peers said goodbye
 *     (nothing more can come for it); else it is kept from reuse, writes
 *     for it are dropped, and the regions it deregisters after that stay
 *     registered until the endpoint closes, so that a late write never
 *     finds unregistered memory (which would fail the whole link).
 *   - Threads.  With one view (the common case) every call goes straight
 *     through.  With more, a mutex serialises the real endpoint, which is
 *     single-threaded: one view's thread sleeps in its wait() while the
 *     others sleep on a condition variable, and a thread that needs the
 *     endpoint wakes the sleeper and waits until it has left, then polls
 *     for everyone (completions go to their views' queues).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastreduce.h"
#include "log.h"
#include "transport.h"
#include "util.h"

#include "share.h"

/* ---- the view's operations ---------------------------------------------- */

static int v_open(const struct fr_tp_params *p, struct fr_tp **tp, void *addr,
		  size_t *addrlen)
{
	(void)p;
	(void)tp;
	(void)addr;
	(void)addrlen;
	return FR_EINVAL; /* views come from fr_share_view */
}

static int v_conn(struct fr_tp *tp, int peer, struct fr_tp_conn **conn)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;
	struct shr_conn *c;
	bool lk;

	if (!v || !conn || peer < 0 || peer >= v->n)
		return FR_EINVAL;
	s = v->s;
	if (v->members[peer] == s->rank)
		return FR_EINVAL;
	lk = shr_enter(s);
	if (v->conns[peer]) {
		/* one connection a peer: a second has nothing to add over
		 * a shared link */
		shr_leave(s, lk);
		return FR_EBUSY;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		shr_leave(s, lk);
		return FR_ENOMEM;
	}
	c->v = v;
	c->peer = peer;
	c->wpeer = v->members[peer];
	v->conns[peer] = c;
	shr_link_need(s, c->wpeer);
	shr_leave(s, lk);
	*conn = (struct fr_tp_conn *)c;
	return 0;
}

static int v_connect(struct fr_tp *tp, int peer, const void *addr,
		     size_t addrlen, struct fr_tp_conn **conn)
{
	(void)addr;
	(void)addrlen;
	return v_conn(tp, peer, conn);
}

static int v_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **conn)
{
	return v_conn(tp, peer, conn);
}

static int v_connect_done(struct fr_tp_conn *conn)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	bool lk;
	int rc;

	if (!c)
		return FR_EINVAL;
	s = c->v->s;
	lk = shr_enter(s);
	rc = shr_link_need(s, c->wpeer);
	if (!rc && !c->up) {
		c->up = true;
		shr_held_release(c->v, c->peer);
	}
	shr_leave(s, lk);
	return rc;
}

static int v_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		     struct fr_tp_mr **mr)
{
	struct fr_share *s = V(tp)->s;
	bool lk = shr_enter(s);
	int rc = s->ops->reg_mem(s->tp, buf, len, access, mr);

	shr_leave(s, lk);
	return rc;
}

static int v_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr)
{
	struct shr_view *v = V(tp);
	struct fr_share *s = v->s;
	bool lk = shr_enter(s);
	int rc = 0;

	if (v->quarantine && mr) {
		/* a late write may still come for it: keep it registered */
		if (s->nzombies == s->zcap) {
			int cap = s->zcap ? 2 * s->zcap : 16;
			struct fr_tp_mr **z =
				realloc(s->zombies, (size_t)cap * sizeof(*z));

			if (z) {
				s->zombies = z;
				s->zcap = cap;
			}
		}
		if (s->nzombies < s->zcap) {
			s->zombies[s->nzombies++] = mr;
			shr_leave(s, lk);
			return FR_EBUSY; /* the caller keeps the memory */
		}
	}
	rc = s->ops->dereg_mem(s->tp, mr);
	shr_leave(s, lk);
	return rc;
}

static int v_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
			 struct fr_tp_rkey *rkey)
{
	struct fr_share *s = V(tp)->s;

	/* decoding a blob touches no state of the endpoint's */
	return s->ops->unpack_rkey(s->tp, blob, len, rkey);
}

/* May c write on its link l now: 0, FR_EAGAIN, or the link's error.  A
 * dead link's error completion is on the queue of an established
 * connection: the caller learns it there first, as from a transport, and
 * the error from writes after that. */
static int write_gate(const struct shr_conn *c, const struct shr_link *l)
{
	if (l->err)
		return c->up && !c->err_out ? FR_EAGAIN : l->err;
	return l->send ? 0 : FR_EAGAIN;
}

/* Enter c's endpoint (*lk for shr_leave()) and ask whether c may write on its
 * link now (*rc, as write_gate); the link. */
static struct shr_link *gate_enter(struct shr_conn *c, bool *lk, int *rc)
{
	struct fr_share *s = c->v->s;
	struct shr_link *l;

	*lk = shr_enter(s);
	l = &s->links[c->wpeer];
	*rc = write_gate(c, l);
	return l;
}

static int v_write_imm(struct fr_tp_conn *conn, struct fr_tp_mr *lmr,
		       size_t loff, const struct fr_tp_rkey *rkey,
		       uint64_t roff, size_t len, uint32_t imm, uint64_t ctx)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	struct shr_link *l;
	bool lk;
	int rc;

	if (!c || (imm & FR_TP_IMM_ID_MASK) || (ctx & FR_TP_CTX_ID_MASK))
		return FR_EINVAL;
	s = c->v->s;
	l = gate_enter(c, &lk, &rc);
	if (!rc)
		rc = s->ops->write_imm(
			l->send, lmr, loff, rkey, roff, len,
			imm | (uint32_t)c->v->id << FR_TP_IMM_ID_SHIFT,
			ctx | (uint64_t)c->v->id << FR_TP_CTX_ID_SHIFT);
	if (!rc && (ctx & FR_TP_CTX_USER))
		c->user_out++;
	shr_leave(s, lk);
	return rc;
}

static int v_write_inline(struct fr_tp_conn *conn, const void *buf,
			  const struct fr_tp_rkey *rkey, uint64_t roff,
			  size_t len, uint32_t imm)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	struct shr_link *l;
	bool lk;
	int rc;

	if (!c || (imm & FR_TP_IMM_ID_MASK))
		return FR_EINVAL;
	s = c->v->s;
	l = gate_enter(c, &lk, &rc);
	if (!rc)
		rc = s->ops->write_inline(
			l->send, buf, rkey, roff, len,
			imm | (uint32_t)c->v->id << FR_TP_IMM_ID_SHIFT);
	shr_leave(s, lk);
	return rc;
}

/*
 * Lines (transport.h) are the connection's, not a communicator's: only the
 * first view (the communicator the endpoint was made for, id 0) has them,
 * and no view after it, though one may take its id once it closed.
 * A link may have two connections up, ours and the peer's (both dialled at
 * once): puts take the one writes take, and a get looks at both, since
 * the peer puts on the one it chose.
 */
static size_t v_line_bytes(struct fr_tp *tp)
{
	struct shr_view *v = V(tp);

	return v && v->lines && v->s->ops->line_bytes
		       ? v->s->ops->line_bytes(v->s->tp)
		       : 0;
}

static int v_line_put(struct fr_tp_conn *conn, uint64_t seq, const void *buf,
		      size_t len)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	struct shr_link *l;
	bool lk;
	int rc;

	if (!c || !c->v->lines)
		return FR_EINVAL;
	s = c->v->s;
	l = gate_enter(c, &lk, &rc);
	if (!rc)
		rc = s->ops->line_put(l->send, seq, buf, len);
	shr_leave(s, lk);
	return rc;
}

static int v_line_get(struct fr_tp_conn *conn, uint64_t seq, void *buf,
		      size_t len)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	struct shr_link *l;
	bool lk;
	int rc = 0;

	if (!c || !c->v->lines)
		return FR_EINVAL;
	s = c->v->s;
	lk = shr_enter(s);
	l = &s->links[c->wpeer];
	/* a dead link's connections keep their lines (a peer that put its
	 * last one and left) */
	if (l->out && l->out_up)
		rc = s->ops->line_get(l->out, seq, buf, len);
	if (rc <= 0 && l->in && l->in_up) {
		int r2 = s->ops->line_get(l->in, seq, buf, len);

		rc = r2 > 0 || !rc ? r2 : rc;
	}
	if (!rc && l->err)
		rc = l->err;
	shr_leave(s, lk);
	return rc;
}

static int q_pop(struct shr_view *v, struct fr_tp_cqe *out, int max)
{
	int n = 0;

	while (v->qlen && n < max) {
		out[n] = v->q[v->qhead];
		if (out[n].status)
			C(out[n].conn)->err_out = true;
		n++;
		v->qhead = (v->qhead + 1) % v->qcap;
		v->qlen--;
	}
	return n;
}

static int v_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;
	bool lk;
	int n;

	if (!v || max < 0 || (max && !cqe))
		return FR_EINVAL;
	s = v->s;
	lk = atomic_load_explicit(&s->nviews, memory_order_acquire) > 1;
	if (lk) {
		pthread_mutex_lock(&s->mu);
		if (s->in_wait) {
			/* another view's thread sleeps in the endpoint and
			 * hands out what comes: take ours, do not wake it
			 * (a spinning poller would keep it from sleeping) */
			n = q_pop(v, cqe, max);
			pthread_mutex_unlock(&s->mu);
			return n;
		}
	}
	/* what is queued, then what the endpoint has, as a transport gives
	 * all it has (a caller stops at a short batch) */
	n = q_pop(v, cqe, max);
	while (n < max) {
		int d = shr_drain(s, v, cqe, max, &n);

		if (d < 0 && !n) {
			shr_leave(s, lk);
			return d;
		}
		n += q_pop(v, cqe + n, max - n);
		if (d < SHR_BATCH)
			break;
	}
	shr_leave(s, lk);
	return n;
}

static void deadline_after(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static int v_wait(struct fr_tp *tp, int timeout_ms)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;
	struct timespec ts;
	int rc, n;

	if (!v)
		return FR_EINVAL;
	s = v->s;
	if (atomic_load_explicit(&s->nviews, memory_order_acquire) <= 1) {
		atomic_store(&v->woken, false);
		if (v->qlen)
			return 0;
		return s->ops->wait(s->tp, timeout_ms);
	}
	pthread_mutex_lock(&s->mu);
	if (v->qlen || atomic_exchange(&v->woken, false)) {
		pthread_mutex_unlock(&s->mu);
		return 0;
	}
	if (!s->in_wait) {
		/* the real wait() comes right after a poll() that found
		 * nothing */
		n = shr_drain(s, NULL, NULL, 0, NULL);
		if (n || v->qlen) {
			pthread_mutex_unlock(&s->mu);
			return n < 0 ? n : 0;
		}
		s->in_wait = true;
		s->waiter = v;
		pthread_mutex_unlock(&s->mu);
		rc = s->ops->wait(s->tp, timeout_ms);
		pthread_mutex_lock(&s->mu);
		s->in_wait = false;
		s->waiter = NULL;
		n = shr_drain(s, NULL, NULL, 0, NULL);
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		return rc ? rc : n < 0 ? n : 0;
	}
	/* another view's thread sleeps in the endpoint: it hands us what
	 * comes for us */
	deadline_after(&ts,
		       timeout_ms < 0 || timeout_ms > 100 ? 100 : timeout_ms);
	pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	atomic_store(&v->woken, false);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static void v_wake(struct fr_tp *tp)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;

	if (!v)
		return;
	s = v->s;
	atomic_store(&v->woken, true);
	if (atomic_load_explicit(&s->nviews, memory_order_acquire) <= 1) {
		s->ops->wake(s->tp);
		return;
	}
	pthread_mutex_lock(&s->mu);
	if (s->waiter == v)
		s->ops->wake(s->tp);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Completions queued for c, which is closing, go (nobody may see it). */
static void q_forget(struct shr_view *v, const struct shr_conn *c)
{
	unsigned k = 0;

	for (unsigned i = 0; i < v->qlen; i++) {
		struct fr_tp_cqe e = v->q[(v->qhead + i) % v->qcap];

		if (C(e.conn) != c)
			v->q[(v->qhead + k++) % v->qcap] = e;
	}
	v->qlen = k;
}

static void v_close_conn(struct fr_tp_conn *conn)
{
	struct shr_conn *c = C(conn);
	struct fr_share *s;
	struct shr_link *l;
	bool lk;

	if (!c)
		return;
	s = c->v->s;
	lk = shr_enter(s);
	l = &s->links[c->wpeer];
	c->v->conns[c->peer] = NULL;
	q_forget(c->v, c);
	if (c->user_out > 0 && !l->err) {
		/* the caller's memory may still be read: the link goes */
		fr_info("rank %d: closing the link to rank %d: %d writes from the application's memory still queued",
			s->rank, c->wpeer, c->user_out);
		shr_link_fail(s, c->wpeer, FR_EPEER);
		if (l->out)
			s->ops->close_conn(l->out);
		if (l->in)
			s->ops->close_conn(l->in);
		l->out = l->in = NULL;
	}
	shr_leave(s, lk);
	free(c);
}

static void share_free(struct fr_share *s)
{
	for (int w = 0; w < s->nranks; w++) {
		if (s->links[w].out)
			s->ops->close_conn(s->links[w].out);
		if (s->links[w].in)
			s->ops->close_conn(s->links[w].in);
	}
	for (int i = 0; i < s->nzombies; i++)
		s->ops->dereg_mem(s->tp, s->zombies[i]);
	s->ops->close(s->tp);
	/* nothing can land in it now */
	while (s->kept) {
		struct shr_kept *k = s->kept;

		s->kept = k->next;
		k->release(k->buf, k->len);
		free(k);
	}
	shr_held_free(s->unclaimed);
	free(s->zombies);
	free(s->busy);
	fr_pages_free(s->links, s->links_len);
	free(s->addrs);
	free(s->addr_off);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static void v_close(struct fr_tp *tp)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;
	bool lk, last;

	if (!v)
		return;
	s = v->s;
	lk = shr_enter(s);
	for (int q = 0; q < v->n; q++)
		free(v->conns[q]);
	if (v->id >= 0) {
		s->ids[v->id] = NULL;
		s->idstate[v->id] =
			v->quarantine || v->held ? ID_QUARANTINE : ID_FREE;
	}
	for (struct shr_view **pp = &s->views; *pp; pp = &(*pp)->next)
		if (*pp == v) {
			*pp = v->next;
			break;
		}
	last = atomic_fetch_sub(&s->nviews, 1) == 1;
	if (lk)
		pthread_cond_broadcast(&s->cv);
	shr_leave(s, lk);
	shr_held_free(v->held);
	free(v->q);
	free(v->conns);
	free(v->crank);
	free(v->members);
	free(v);
	if (last)
		share_free(s);
}

static int v_conn_peer(const struct fr_tp_conn *conn)
{
	return conn ? ((const struct shr_conn *)conn)->peer : -1;
}

static const char *v_last_error(struct fr_tp *tp)
{
	struct fr_share *s = V(tp)->s;

	return s->ops->last_error ? s->ops->last_error(s->tp) : "";
}

/* The ranks whose writes wait for a connection of ours. */
static int v_pending(struct fr_tp *tp, int *peers, int max)
{
	struct shr_view *v = V(tp);
	struct fr_share *s = v->s;
	bool lk;
	int n = 0;

	/* a count, not the list, outside the lock: cheap when nothing waits */
	if (!atomic_load_explicit(&v->nheld, memory_order_relaxed))
		return 0;
	lk = shr_enter(s);
	for (struct shr_held *h = v->held; h && n < max; h = h->next) {
		int q = v->crank[h->wpeer], k;

		if (v->conns[q])
			continue; /* its connection is coming up */
		for (k = 0; k < n && peers[k] != q; k++)
			;
		if (k == n)
			peers[n++] = q;
	}
	shr_leave(s, lk);
	return n;
}

static int v_locality(struct fr_tp *tp, cpu_set_t *cpus)
{
	struct fr_share *s = V(tp)->s;

	return s->ops->locality ? s->ops->locality(s->tp, cpus) : FR_ENODEV;
}

static int v_probe(char *errbuf, size_t errlen)
{
	(void)errbuf;
	(void)errlen;
	return 0;
}

/* ---- the interface of transport.h ---------------------------------------- */

int fr_share_new(const struct fr_tp_ops *ops, struct fr_tp *tp, int rank,
		 int nranks, const struct fr_tp_ops **vops, struct fr_tp **view)
{
	struct fr_share *s;
	pthread_condattr_t ca;
	const struct fr_tp_ops *vo;
	struct fr_tp *vw;
	int *all = NULL, rc;

	if (!ops || !tp || !vops || !view || nranks < 1 || rank < 0 ||
	    rank >= nranks)
		return FR_EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return FR_ENOMEM;
	s->links = fr_pages_new((size_t)nranks * sizeof(*s->links), false,
				&s->links_len);
	s->busy = calloc((size_t)nranks, sizeof(*s->busy));
	if (!s->links || !s->busy)
		goto nomem;
	if (pthread_mutex_init(&s->mu, NULL))
		goto nomem;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&s->cv, &ca)) {
		pthread_condattr_destroy(&ca);
		pthread_mutex_destroy(&s->mu);
		goto nomem;
	}
	pthread_condattr_destroy(&ca);
	s->ops = ops;
	s->tp = tp;
	s->rank = rank;
	s->nranks = nranks;
	s->view_ops = (struct fr_tp_ops){
		.size = sizeof(struct fr_tp_ops),
		.name = ops->name,
		.probe = v_probe,
		.open = v_open,
		.connect = v_connect,
		.accept = v_accept,
		.connect_done = v_connect_done,
		.reg_mem = v_reg_mem,
		.dereg_mem = v_dereg_mem,
		.pack_rkey = ops->pack_rkey,
		.unpack_rkey = v_unpack_rkey,
		.write_imm = v_write_imm,
		.write_inline = ops->write_inline ? v_write_inline : NULL,
		.poll = v_poll,
		.wait = v_wait,
		.wake = v_wake,
		.close_conn = v_close_conn,
		.close = v_close,
		.conn_peer = v_conn_peer,
		.last_error = v_last_error,
		.pending = v_pending,
		.locality = ops->locality ? v_locality : NULL,
		.line_bytes = ops->line_bytes ? v_line_bytes : NULL,
		.line_put = ops->line_put ? v_line_put : NULL,
		.line_get = ops->line_get ? v_line_get : NULL,
	};
	all = malloc((size_t)nranks * sizeof(int));
	if (!all)
		goto nomem_locks;
	for (int r = 0; r < nranks; r++)
		all[r] = r;
	rc = fr_share_view(s, all, nranks, &vo, &vw);
	free(all);
	if (rc)
		goto nomem_locks;
	rc = fr_share_set_id(vw, 0);
	V(vw)->lines = true;
	if (!rc) {
		*vops = vo;
		*view = vw;
		return 0;
	}
	/* cannot happen (a new endpoint's ids are free); undo by hand, the
	 * endpoint staying the caller's */
	s->views = NULL;
	free(V(vw)->members);
	free(V(vw)->crank);
	free(V(vw)->conns);
	free(V(vw));
nomem_locks:
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
nomem:
	free(s->busy);
	fr_pages_free(s->links, s->links_len);
	free(s);
	return FR_ENOMEM;
}

int fr_share_set_addrs(struct fr_share *s, const uint8_t *addrs,
		       const uint8_t *addrlens)
{
	uint32_t *off = malloc(((size_t)s->nranks + 1) * sizeof(*off));
	size_t total = 0;
	uint8_t *a;

	if (!off)
		return FR_ENOMEM;
	for (int w = 0; w < s->nranks; w++)
		total += addrlens[w];
	a = malloc(total ? total : 1);
	if (!a) {
		free(off);
		return FR_ENOMEM;
	}
	off[0] = 0;
	for (int w = 0; w < s->nranks; w++) {
		memcpy(a + off[w], addrs + (size_t)w * FR_TP_ADDR_MAX,
		       addrlens[w]);
		off[w + 1] = off[w] + addrlens[w];
	}
	free(s->addrs);
	free(s->addr_off);
	s->addrs = a;
	s->addr_off = off;
	return 0;
}

int fr_share_view(struct fr_share *s, const int *members, int n,
		  const struct fr_tp_ops **ops, struct fr_tp **view)
{
	struct shr_view *v;
	bool lk;

	if (!s || !members || n < 1 || !ops || !view)
		return FR_EINVAL;
	v = calloc(1, sizeof(*v));
	if (!v)
		return FR_ENOMEM;
	v->s = s;
	v->id = -1;
	v->n = n;
	v->members = malloc((size_t)n * sizeof(int));
	v->crank = malloc((size_t)s->nranks * sizeof(int));
	v->conns = calloc((size_t)n, sizeof(*v->conns));
	if (!v->members || !v->crank || !v->conns)
		goto nomem;
	for (int w = 0; w < s->nranks; w++)
		v->crank[w] = -1;
	for (int i = 0; i < n; i++) {
		if (members[i] < 0 || members[i] >= s->nranks ||
		    v->crank[members[i]] >= 0) {
			free(v->members);
			free(v->crank);
			free(v->conns);
			free(v);
			return FR_EINVAL;
		}
		v->members[i] = members[i];
		v->crank[members[i]] = i;
	}
	lk = shr_enter(s);
	v->next = s->views;
	s->views = v;
	atomic_fetch_add(&s->nviews, 1);
	shr_leave(s, lk);
	*ops = &s->view_ops;
	*view = (struct fr_tp *)v;
	return 0;
nomem:
	free(v->members);
	free(v->crank);
	free(v->conns);
	free(v);
	return FR_ENOMEM;
}

int fr_share_set_id(struct fr_tp *tp, int id)
{
	struct shr_view *v = V(tp);
	struct fr_share *s;
	struct shr_held **pp, *prev = NULL;
	bool lk;

	if (!v || id < 0 || id >= FR_SHARE_IDS || v->id >= 0)
		return FR_EINVAL;
	s = v->s;
	lk = shr_enter(s);
	if (s->idstate[id] != ID_FREE) {
		shr_leave(s, lk);
		return FR_EBUSY;
	}
	v->id = id;
	s->ids[id] = v;
	s->idstate[id] = ID_LIVE;
	/* what came for the id before us, in order */
	pp = &s->unclaimed;
	while (*pp) {
		struct shr_held *h = *pp;

		if (h->id != id) {
			prev = h;
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (s->unclaimed_tail == h)
			s->unclaimed_tail = prev;
		s->nunclaimed--;
		h->next = NULL;
		if (v->crank[h->wpeer] < 0)
			free(h);
		else
			shr_held_hold(v, h);
	}
	shr_leave(s, lk);
	return 0;
}

void fr_share_ids_used(struct fr_share *s, uint8_t used[FR_SHARE_IDS / 8])
{
	bool lk = shr_enter(s);

	memset(used, 0, FR_SHARE_IDS / 8);
	for (int i = 0; i < FR_SHARE_IDS; i++)
		if (s->idstate[i] != ID_FREE)
			used[i / 8] |= (uint8_t)(1u << (i % 8));
	shr_leave(s, lk);
}

struct fr_share *fr_share_of(struct fr_tp *tp)
{
	return tp ? V(tp)->s : NULL;
}

int fr_share_member(struct fr_tp *tp, int i)
{
	struct shr_view *v = V(tp);

	return v && i >= 0 && i < v->n ? v->members[i] : -1;
}

int fr_share_adopt(struct fr_tp *tp, void *buf, size_t len,
		   void (*release)(void *buf, size_t len))
{
	struct shr_view *v = V(tp);
	struct shr_kept *k;
	bool lk;

	if (!v || !release)
		return FR_EINVAL;
	k = malloc(sizeof(*k));
	if (!k)
		return FR_ENOMEM;
	k->buf = buf;
	k->len = len;
	k->release = release;
	lk = shr_enter(v->s);
	k->next = v->s->kept;
	v->s->kept = k;
	shr_leave(v->s, lk);
	return 0;
}

void fr_share_closing(struct fr_tp *tp, bool clean)
{
	struct shr_view *v = V(tp);
	bool lk;

	if (!v)
		return;
	lk = shr_enter(v->s);
	v->closing = true;
	v->quarantine = !clean || v->held;
	shr_leave(v->s, lk);
}
