/* SPDX-License-Identifier: MIT */
/*
 * share_link.c - the shared endpoint's links and completions: the real
 * endpoint's lock, the queues of completions for views and for
 * connections not yet up, the links to each rank (connected on first use,
 * failed for every view at once) and the routing of the real endpoint's
 * completions to the views they are for.  fr_share.c has the design.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fastreduce.h"
#include "log.h"
#include "transport.h"
#include "util.h"

#include "share.h"

/* ---- locking ------------------------------------------------------------ */

/* Take the endpoint: with more than one view, the mutex, and no thread
 * inside the real wait(). */
bool shr_enter(struct fr_share *s)
{
	if (atomic_load_explicit(&s->nviews, memory_order_acquire) <= 1)
		return false;
	pthread_mutex_lock(&s->mu);
	while (s->in_wait) {
		s->ops->wake(s->tp);
		pthread_cond_wait(&s->cv, &s->mu);
	}
	return true;
}

void shr_leave(struct fr_share *s, bool locked)
{
	if (locked)
		pthread_mutex_unlock(&s->mu);
}

/* ---- queues ------------------------------------------------------------- */

static void q_push(struct shr_view *v, const struct fr_tp_cqe *c)
{
	if (v->qlen == v->qcap) {
		unsigned cap = v->qcap ? 2 * v->qcap : 64;
		struct fr_tp_cqe *q = malloc(cap * sizeof(*q));

		if (!q) {
			fr_err("shared endpoint: out of memory; a completion is lost");
			return;
		}
		for (unsigned i = 0; i < v->qlen; i++)
			q[i] = v->q[(v->qhead + i) % v->qcap];
		free(v->q);
		v->q = q;
		v->qcap = cap;
		v->qhead = 0;
	}
	v->q[(v->qhead + v->qlen) % v->qcap] = *c;
	v->qlen++;
}

static struct shr_held *held_new(int id, int wpeer, const struct fr_tp_cqe *c)
{
	struct shr_held *h = malloc(sizeof(*h));

	if (!h) {
		fr_err("shared endpoint: out of memory; a completion is lost");
		return NULL;
	}
	h->next = NULL;
	h->id = id;
	h->wpeer = wpeer;
	h->cqe = *c;
	return h;
}

static void held_append(struct shr_held **head, struct shr_held **tail,
			struct shr_held *h)
{
	if (!h)
		return;
	if (*tail)
		(*tail)->next = h;
	else
		*head = h;
	*tail = h;
}

/* Hold h for v until its sender's connection is up. */
void shr_held_hold(struct shr_view *v, struct shr_held *h)
{
	if (!h)
		return;
	held_append(&v->held, &v->held_tail, h);
	atomic_fetch_add_explicit(&v->nheld, 1, memory_order_relaxed);
}

/* Completions held for peer q of v (it has a connection now): queue them,
 * in order. */
void shr_held_release(struct shr_view *v, int q)
{
	struct shr_held **pp = &v->held, *prev = NULL;

	while (*pp) {
		struct shr_held *h = *pp;

		if (v->crank[h->wpeer] != q) {
			prev = h;
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (v->held_tail == h)
			v->held_tail = prev;
		atomic_fetch_sub_explicit(&v->nheld, 1, memory_order_relaxed);
		h->cqe.conn = (struct fr_tp_conn *)v->conns[q];
		q_push(v, &h->cqe);
		free(h);
	}
}

void shr_held_free(struct shr_held *h)
{
	while (h) {
		struct shr_held *n = h->next;

		free(h);
		h = n;
	}
}

/* ---- links -------------------------------------------------------------- */

static void busy_add(struct fr_share *s, int w)
{
	if (s->links[w].busy)
		return;
	s->links[w].busy = true;
	s->busy[s->nbusy++] = w;
}

/* The link to w is dead: every view's connection over it fails. */
void shr_link_fail(struct fr_share *s, int w, int err)
{
	struct shr_link *l = &s->links[w];

	if (l->err)
		return;
	l->err = err ? err : FR_EPEER;
	l->send = NULL;
	fr_dbg("rank %d: shared link to rank %d failed: %s", s->rank, w,
	       fr_strerror(l->err));
	for (struct shr_view *v = s->views; v; v = v->next) {
		int q = v->crank[w];
		struct fr_tp_cqe c = {.kind = FR_CQE_RECV, .status = l->err};

		if (v->id < 0 || v->closing || q < 0 || !v->conns[q] ||
		    !v->conns[q]->up)
			continue; /* it learns from connect_done() */
		c.conn = (struct fr_tp_conn *)v->conns[q];
		q_push(v, &c);
	}
}

/* Advance a real connection's handshake: the first one up carries our
 * writes; one that fails ends the link only if it was all we had. */
static void conn_advance(struct fr_share *s, int w, struct fr_tp_conn **cp,
			 bool *up)
{
	struct shr_link *l = &s->links[w];
	int rc;

	if (!*cp || *up)
		return;
	rc = s->ops->connect_done(*cp);
	if (rc == FR_EAGAIN)
		return;
	if (!rc) {
		*up = true;
		if (!l->send && !l->err)
			l->send = *cp;
		fr_dbg("rank %d: link to rank %d: %s connection up", s->rank, w,
		       cp == &l->out ? "outgoing" : "incoming");
		return;
	}
	s->ops->close_conn(*cp);
	*cp = NULL;
	if (!l->send && !(l->out && cp != &l->out) &&
	    !(l->in && cp != &l->in) && (s->rank < w || cp == &l->in))
		shr_link_fail(s, w, rc);
}

static void busy_advance(struct fr_share *s)
{
	for (int i = 0; i < s->nbusy;) {
		int w = s->busy[i];
		struct shr_link *l = &s->links[w];

		conn_advance(s, w, &l->out, &l->out_up);
		conn_advance(s, w, &l->in, &l->in_up);
		if ((l->out && !l->out_up) || (l->in && !l->in_up)) {
			i++;
			continue;
		}
		l->busy = false;
		s->busy[i] = s->busy[--s->nbusy];
	}
}

/* Take the connections peers opened to us. */
static void accept_new(struct fr_share *s)
{
	int w[32], n;

	if (!s->ops->pending)
		return;
	n = s->ops->pending(s->tp, w, 32);
	for (int i = 0; i < n; i++) {
		struct fr_tp_conn *c;

		if (w[i] < 0 || w[i] >= s->nranks || w[i] == s->rank)
			continue;
		if (s->ops->accept(s->tp, w[i], &c))
			continue;
		if (s->links[w[i]].in || s->links[w[i]].err) {
			/* a second one, or from a rank we gave up on */
			s->ops->close_conn(c);
			continue;
		}
		s->links[w[i]].in = c;
		busy_add(s, w[i]);
	}
}

/* 0 once the link to w carries writes, FR_EAGAIN before, or its error. */
int shr_link_need(struct fr_share *s, int w)
{
	struct shr_link *l = &s->links[w];
	uint64_t now;
	int rc;

	if (l->err)
		return l->err;
	if (l->send)
		return 0;
	now = fr_coarse_ms();
	if (!l->want_ms)
		l->want_ms = now;
	if (!l->out && (s->rank < w || now - l->want_ms >= SHR_GRACE_MS)) {
		if (!s->addr_off || s->addr_off[w + 1] == s->addr_off[w])
			return FR_EPROTO;
		rc = s->ops->connect(s->tp, w, s->addrs + s->addr_off[w],
				     s->addr_off[w + 1] - s->addr_off[w],
				     &l->out);
		if (rc) {
			l->out = NULL;
			if (s->rank < w) {
				shr_link_fail(s, w, rc);
				return rc;
			}
			l->want_ms = now; /* the next attempt after a grace */
		} else {
			l->out_up = false;
			busy_add(s, w);
		}
	}
	busy_advance(s);
	return l->err ? l->err : l->send ? 0 : FR_EAGAIN;
}

/* ---- completions -------------------------------------------------------- */

/* Where a completion of the real endpoint goes: the view it is for, with
 * the view's connection and its id stripped, or NULL (held, failed a
 * link, or dropped). */
static struct shr_view *route(struct fr_share *s, struct fr_tp_cqe *c)
{
	int w = s->ops->conn_peer(c->conn), id, q;
	struct shr_link *l;
	struct shr_view *v;

	if (w < 0 || w >= s->nranks || w == s->rank)
		return NULL;
	l = &s->links[w];
	if (c->conn != l->out && c->conn != l->in)
		return NULL; /* one we closed */
	if (c->status) {
		shr_link_fail(s, w, c->status);
		/* a write the failure ended: its view still counts it */
		if (c->kind != FR_CQE_SEND)
			return NULL;
	}
	if (c->kind == FR_CQE_SEND) {
		id = (int)((c->ctx & FR_TP_CTX_ID_MASK) >> FR_TP_CTX_ID_SHIFT);
		c->ctx &= ~FR_TP_CTX_ID_MASK;
		v = s->ids[id];
		if (!v || s->idstate[id] != ID_LIVE || (q = v->crank[w]) < 0 ||
		    !v->conns[q])
			return NULL;
		if (c->ctx & FR_TP_CTX_USER)
			v->conns[q]->user_out--;
		c->conn = (struct fr_tp_conn *)v->conns[q];
		return v;
	}
	id = (int)((c->imm & FR_TP_IMM_ID_MASK) >> FR_TP_IMM_ID_SHIFT);
	c->imm &= ~FR_TP_IMM_ID_MASK;
	if (s->idstate[id] == ID_QUARANTINE)
		return NULL;
	if (s->idstate[id] == ID_FREE) {
		if (s->nunclaimed >= SHR_UNCLAIMED_MAX) {
			if (!s->warned)
				fr_warn("rank %d: writes for communicator id %d, which this rank does not have, are dropped",
					s->rank, id);
			s->warned = true;
			return NULL;
		}
		held_append(&s->unclaimed, &s->unclaimed_tail,
			    held_new(id, w, c));
		s->nunclaimed++;
		return NULL;
	}
	v = s->ids[id];
	q = v->crank[w];
	if (q < 0)
		return NULL; /* not a member: nothing of ours */
	if (!v->conns[q] || !v->conns[q]->up) {
		/* as a transport delivers nothing on a connection before
		 * it is established */
		shr_held_hold(v, held_new(id, w, c));
		return NULL;
	}
	c->conn = (struct fr_tp_conn *)v->conns[q];
	return v;
}

/* Poll the real endpoint once and hand out what came: how many, or its
 * error.  Those for me go straight to out (up to max, *nout so far) while
 * nothing of mine is queued before them; the rest to their views'
 * queues. */
int shr_drain(struct fr_share *s, struct shr_view *me, struct fr_tp_cqe *out,
	      int max, int *nout)
{
	struct fr_tp_cqe c[SHR_BATCH];
	int n;

	accept_new(s);
	if (s->nbusy)
		busy_advance(s);
	n = s->ops->poll(s->tp, c, SHR_BATCH);
	for (int i = 0; i < n; i++) {
		struct shr_view *v = route(s, &c[i]);

		if (!v)
			continue;
		if (v == me && !me->qlen && *nout < max) {
			if (c[i].status)
				C(c[i].conn)->err_out = true;
			out[(*nout)++] = c[i];
		} else {
			q_push(v, &c[i]);
		}
	}
	if (n > 0 && atomic_load(&s->nviews) > 1)
		pthread_cond_broadcast(&s->cv);
	return n;
}
