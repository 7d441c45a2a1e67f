/* SPDX-License-Identifier: MIT */
/*
 * tp_base.c - the transport base: the connection list, errors, wake-up,
 * connections' life and failure, the send queue, the region table and the
 * operations every transport of the base shares, the judgement of a
 * hello's version and nonce, a list for a transport's own objects
 * (tp_base.h says how a transport uses it).  Called by the transports under
 * transports/ only.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fastreduce.h"
#include "log.h"
#include "tp_base.h"
#include "util.h"

/* ---- the endpoint ----------------------------------------------------------
 */

static void __attribute__((format(printf, 3, 0)))
fr_tpb_vopen_err(const char *name, const struct fr_tp_params *p,
		 const char *fmt, va_list ap)
{
	char msg[FR_TPB_ERRBUF_LEN];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (p->errbuf && p->errlen)
		snprintf(p->errbuf, p->errlen, "%s", msg);
	fr_dbg("%s: %s", name, msg);
}

void fr_tpb_open_err(const char *name, const struct fr_tp_params *p,
		     const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fr_tpb_vopen_err(name, p, fmt, ap);
	va_end(ap);
}

int fr_tpb_open_fail(struct fr_tp *tp, const struct fr_tp_params *p,
		     const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fr_tpb_vopen_err(fr_tpb_of(tp)->cls->name, p, fmt, ap);
	va_end(ap);
	fr_tpb_close(tp);
	return FR_ESYS;
}

int fr_tpb_open_params(const char *name, const struct fr_tp_params *params,
		       struct fr_tp_params *p, struct fr_tp **out,
		       const void *addr, const size_t *addrlen,
		       size_t addr_need, int max_sq)
{
	if (!params || !out || !addr || !addrlen || !params->size)
		return FR_EINVAL;
	/* Fields past the caller's size read as zero: the struct may grow. */
	memset(p, 0, sizeof(*p));
	memcpy(p, params, FR_MIN(params->size, sizeof(*p)));
	if (*addrlen < addr_need) {
		fr_tpb_open_err(name, p,
				"%s: address buffer of %zu bytes, need %zu",
				name, *addrlen, addr_need);
		return FR_EINVAL;
	}
	if (p->rank < 0 || p->sq_depth < 0 || p->sq_depth > max_sq) {
		fr_tpb_open_err(name, p,
				"%s: invalid rank %d or send queue depth %d",
				name, p->rank, p->sq_depth);
		return FR_EINVAL;
	}
	return 0;
}

void *fr_tpb_alloc(const struct fr_tpb_class *cls, const struct fr_tp_params *p,
		   size_t size)
{
	struct fr_tpb *b = calloc(1, size);

	if (!b) {
		fr_tpb_open_err(cls->name, p, "%s: out of memory", cls->name);
		return NULL;
	}
	/* the completion ring inside (fr_cqring, 128 KiB) is on the latency
	 * path: its pages now, not one per 128 messages */
	fr_touch_zeroed(b, size);
	b->cls = cls;
	b->rank = p->rank;
	b->nonce = p->job_nonce;
	b->timeout_ms =
		p->timeout_ms > 0 ? p->timeout_ms : FR_TPB_DEFAULT_TIMEOUT_MS;
	b->sq_depth = p->sq_depth > 0 ? (unsigned int)p->sq_depth
				      : FR_TPB_DEFAULT_SQ_DEPTH;
	b->lfd = b->epfd = b->wfd = -1;
	return b;
}

int fr_tpb_watch(struct fr_tpb *b, int fd, uint32_t events, void *data)
{
	struct epoll_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.events = events;
	ev.data.ptr = data;
	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) ? FR_ESYS : 0;
}

int fr_tpb_open_fds(struct fr_tpb *b, const char **what)
{
	b->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (b->epfd < 0) {
		*what = "epoll_create1";
		return FR_ESYS;
	}
	*what = "epoll_ctl";
	if (b->lfd >= 0 && fr_tpb_watch(b, b->lfd, EPOLLIN, NULL))
		return FR_ESYS;
	b->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (b->wfd < 0) {
		*what = "eventfd";
		return FR_ESYS;
	}
	return fr_tpb_watch(b, b->wfd, EPOLLIN, &b->wfd);
}

void fr_tpb_fini(struct fr_tpb *b)
{
	while (b->conns)
		fr_tpb_conn_free(b->conns);
	for (uint32_t i = 0; i < b->nregions; i++)
		free(b->regions[i].mr);
	free(b->regions);
	b->regions = NULL;
	b->nregions = 0;
	if (b->wfd >= 0)
		close(b->wfd);
	if (b->epfd >= 0)
		close(b->epfd);
	if (b->lfd >= 0)
		close(b->lfd);
	b->lfd = b->epfd = b->wfd = -1;
}

static void __attribute__((format(printf, 3, 0)))
fr_tpb_vseterr(struct fr_tpb *b, int level, const char *fmt, va_list ap)
{
	vsnprintf(b->errbuf, sizeof(b->errbuf), fmt, ap);
	fr_log(level, "%s: rank %d: %s", b->cls->name, b->rank, b->errbuf);
}

void fr_tpb_seterr(struct fr_tpb *b, int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fr_tpb_vseterr(b, level, fmt, ap);
	va_end(ap);
}

void fr_tpb_wake_drain(struct fr_tpb *b)
{
	uint64_t v;

	if (read(b->wfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		fr_dbg("%s: rank %d: reading the wake eventfd: %s",
		       b->cls->name, b->rank, fr_syserr(errno));
}

int fr_tpb_wait_begin(struct fr_tp *tp)
{
	if (!tp)
		return FR_EINVAL;
	return fr_tpb_of(tp)->cq->count ? 1 : 0;
}

/* ---- operations ------------------------------------------------------------
 */

int fr_tpb_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **out)
{
	struct fr_tpb *b = fr_tpb_of(tp);

	if (!tp || !out || peer < 0)
		return FR_EINVAL;
	b->cls->progress(tp, true);
	*out = fr_tpb_take(b, peer);
	if (*out)
		return 0;
	/* Out of descriptors, the peer's connection waits in the kernel and
	 * never arrives: fail now, naming the limit, not at the timeout. */
	if (b->accept_errno == EMFILE || b->accept_errno == ENFILE) {
		fr_tpb_seterr(b, FR_LOG_ERROR, "cannot accept rank %d: %s",
			      peer, fr_syserr(b->accept_errno));
		return FR_ESYS;
	}
	return FR_EAGAIN;
}

int fr_tpb_connect_done(struct fr_tp_conn *c)
{
	struct fr_tp *tp;

	if (!c)
		return FR_EINVAL;
	tp = fr_tpb_c(c)->tp;
	fr_tpb_of(tp)->cls->progress(tp, true);
	return fr_tpb_conn_status(c);
}

int fr_tpb_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	struct fr_tpb *b = fr_tpb_of(tp);

	if (!tp || max < 0 || (max && !cqe))
		return FR_EINVAL;
	b->cls->progress(tp, false);
	return fr_cqring_pop(b->cq, cqe, max);
}

int fr_tpb_wait_fd(struct fr_tp *tp)
{
	return tp ? fr_tpb_of(tp)->epfd : -1;
}

/* The one call another thread may make while wait() sleeps. */
void fr_tpb_wake(struct fr_tp *tp)
{
	struct fr_tpb *b = fr_tpb_of(tp);
	uint64_t one = 1;

	if (tp && write(b->wfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		fr_dbg("%s: rank %d: writing the wake eventfd: %s",
		       b->cls->name, b->rank, fr_syserr(errno));
}

void fr_tpb_close_conn(struct fr_tp_conn *c)
{
	struct fr_tpb *b;

	if (!c)
		return;
	b = fr_tpb_of(fr_tpb_c(c)->tp);
	if (b->cq)
		fr_cqring_purge(b->cq, c);
	fr_tpb_conn_free(c);
}

void fr_tpb_close(struct fr_tp *tp)
{
	if (!tp)
		return;
	fr_tpb_fini(fr_tpb_of(tp));
	free(tp);
}

int fr_tpb_conn_peer(const struct fr_tp_conn *c)
{
	return c ? fr_tpb_cc(c)->peer : -1;
}

const char *fr_tpb_last_error(struct fr_tp *tp)
{
	return tp ? fr_tpb_of(tp)->errbuf : "";
}

int fr_tpb_pending(struct fr_tp *tp, int *peers, int max)
{
	struct fr_tpb *b = fr_tpb_of(tp);
	const struct fr_tpb_conn *cb;
	int n = 0;

	if (!tp || !peers || !b->npending)
		return 0;
	for (struct fr_tp_conn *c = b->conns; c && n < max; c = cb->next) {
		cb = fr_tpb_c(c);
		if (cb->incoming && !cb->owned && cb->state == FR_TPB_UP)
			peers[n++] = cb->peer;
	}
	return n;
}

/* ---- connections
 * --------------------------------------------------------------- */

void *fr_tpb_conn_new(struct fr_tp *tp, size_t size, size_t esize)
{
	struct fr_tpb_conn *cb = calloc(1, size);

	if (!cb)
		return NULL;
	if (esize && fr_tpb_sq_init(&cb->sq, fr_tpb_of(tp)->sq_depth, esize)) {
		free(cb);
		return NULL;
	}
	cb->tp = tp;
	cb->peer = -1;
	return cb;
}

void fr_tpb_conn_destroy(struct fr_tp_conn *c)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	const struct fr_tpb_class *cls = fr_tpb_of(cb->tp)->cls;

	if (cls->conn_down)
		cls->conn_down(c);
	fr_tpb_sq_release(&cb->sq);
	fr_tpb_sq_fini(&cb->sq);
	if (cls->conn_free)
		cls->conn_free(c);
	free(c);
}

void fr_tpb_conn_link(struct fr_tp_conn *c)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_tpb *b = fr_tpb_of(cb->tp);

	cb->prev = NULL;
	cb->next = b->conns;
	if (b->conns)
		fr_tpb_c(b->conns)->prev = c;
	b->conns = c;
}

void fr_tpb_conn_unlink(struct fr_tp_conn *c)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_tpb *b = fr_tpb_of(cb->tp);

	if (cb->prev)
		fr_tpb_c(cb->prev)->next = cb->next;
	else
		b->conns = cb->next;
	if (cb->next)
		fr_tpb_c(cb->next)->prev = cb->prev;
	cb->prev = cb->next = NULL;
	if (cb->incoming && !cb->owned)
		b->npending--;
}

void fr_tpb_conn_free(struct fr_tp_conn *c)
{
	fr_tpb_conn_unlink(c);
	fr_tpb_conn_destroy(c);
}

uint64_t fr_tpb_conn_outgoing(struct fr_tp_conn *c, int peer, int backoff_ms)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	uint64_t now = fr_now_ms();

	cb->peer = peer;
	cb->owned = true;
	cb->deadline_ms = now + (uint64_t)fr_tpb_of(cb->tp)->timeout_ms;
	cb->backoff_ms = backoff_ms;
	return now;
}

void fr_tpb_conn_park(struct fr_tp_conn *c, int state, uint64_t now)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_tpb *b = fr_tpb_of(cb->tp);

	cb->incoming = true;
	cb->state = state;
	cb->deadline_ms = now + (uint64_t)b->timeout_ms;
	fr_tpb_conn_link(c);
	b->npending++;
}

struct fr_tp_conn *fr_tpb_take(struct fr_tpb *b, int peer)
{
	struct fr_tpb_conn *cb;

	for (struct fr_tp_conn *c = b->conns; c; c = cb->next) {
		cb = fr_tpb_c(c);
		if (cb->incoming && !cb->owned && cb->state == FR_TPB_UP &&
		    cb->peer == peer) {
			cb->owned = true;
			b->npending--;
			return c;
		}
	}
	return NULL;
}

int fr_tpb_hello_check(const struct fr_tpb *b, int rank, unsigned int version,
		       unsigned int ours, uint64_t nonce)
{
	if (version != ours) {
		fr_warn("%s: rank %d: refused rank %d: protocol version %u, we speak %u",
			b->cls->name, b->rank, rank, version, ours);
		return FR_EPROTO;
	}
	if (nonce != b->nonce) {
		fr_warn("%s: rank %d: refused a connection claiming rank %d: wrong job nonce",
			b->cls->name, b->rank, rank);
		return FR_EAUTH;
	}
	return 0;
}

int fr_tpb_conn_status(const struct fr_tp_conn *c)
{
	const struct fr_tpb_conn *cb = fr_tpb_cc(c);

	if (cb->state == FR_TPB_UP)
		return 0;
	if (cb->state == FR_TPB_FAILED)
		return cb->error;
	return FR_EAGAIN;
}

void fr_tpb_conn_verr(struct fr_tp_conn *c, int err, bool live, const char *fmt,
		      va_list ap)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	/* A peer breaking the protocol on a live connection deserves a
	 * warning; refused strangers were already reported when judged, the
	 * rest is reported by whoever gets the error code. */
	bool warn = live && cb->owned && (err == FR_ERANGE || err == FR_EPROTO);
	char msg[FR_TPB_CONN_MSG_LEN];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	fr_tpb_seterr(fr_tpb_of(cb->tp), warn ? FR_LOG_WARN : FR_LOG_DEBUG,
		      "connection %s rank %d: %s", cb->incoming ? "from" : "to",
		      cb->peer, msg);
}

void fr_tpb_conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_tpb *b = fr_tpb_of(cb->tp);
	bool was_up = cb->state == FR_TPB_UP;
	va_list ap;

	if (cb->state == FR_TPB_FAILED)
		return;
	va_start(ap, fmt);
	fr_tpb_conn_verr(c, err, true, fmt, ap);
	va_end(ap);
	if (b->cls->conn_down)
		b->cls->conn_down(c);
	fr_tpb_sq_release(&cb->sq);
	cb->error = err;
	cb->state = FR_TPB_FAILED;
	cb->err_owed = was_up && cb->owned;
}

void fr_tpb_retry(struct fr_tp_conn *c, int e, uint64_t now, int max_ms)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);

	cb->last_errno = e;
	cb->state = FR_TPB_RETRY;
	cb->retry_ms = now + (uint64_t)cb->backoff_ms;
	cb->backoff_ms = FR_MIN(cb->backoff_ms * 2, max_ms);
}

int fr_tpb_due(const struct fr_tp_conn *c, int t, uint64_t now)
{
	const struct fr_tpb_conn *cb = fr_tpb_cc(c);
	uint64_t due;

	if (cb->state == FR_TPB_UP || cb->state == FR_TPB_FAILED)
		return t;
	due = cb->state == FR_TPB_RETRY ? FR_MIN(cb->retry_ms, cb->deadline_ms)
					: cb->deadline_ms;
	due = due > now ? due - now : 0;
	if (due > INT_MAX)
		due = INT_MAX;
	return t < 0 || (int)due < t ? (int)due : t;
}

/* The oldest entry leaves the queue. */
static void fr_tpb_sq_pop(struct fr_tpb_sq *q)
{
	q->head = (q->head + 1) % q->depth;
	q->count--;
}

void fr_tpb_flush_failed(struct fr_tp_conn *c)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_cqring *cq = fr_tpb_of(cb->tp)->cq;
	struct fr_tpb_sq *q = &cb->sq;

	if (cb->err_owed) {
		if (fr_cqring_full(cq))
			return;
		fr_cqring_push(cq, FR_CQE_RECV, cb->error, c, 0, 0, 0);
		cb->err_owed = false;
	}
	while (q->count) {
		const struct fr_tpb_sqe *e = fr_tpb_sq_at(q, 0);

		if (fr_cqring_full(cq))
			return;
		fr_cqring_push(cq, FR_CQE_SEND, cb->error, c, e->ctx, 0, 0);
		fr_tpb_sq_pop(q);
	}
}

bool fr_tpb_owes(const struct fr_tp_conn *c)
{
	const struct fr_tpb_conn *cb = fr_tpb_cc(c);

	return cb->state == FR_TPB_FAILED && cb->owned &&
	       (cb->err_owed || cb->sq.count);
}

/* ---- a transport's own list
 * ---------------------------------------------------- */

void fr_tpb_list_add(struct fr_tpb_link **head, struct fr_tpb_link *n)
{
	n->prev = NULL;
	n->next = *head;
	if (*head)
		(*head)->prev = n;
	*head = n;
}

void fr_tpb_list_del(struct fr_tpb_link **head, struct fr_tpb_link *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		*head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	n->prev = n->next = NULL;
}

/* ---- the send queue
 * ------------------------------------------------------------ */

int fr_tpb_sq_init(struct fr_tpb_sq *q, unsigned int depth, size_t esize)
{
	q->e = calloc(depth, esize);
	if (!q->e)
		return FR_ENOMEM;
	q->esize = esize;
	q->depth = depth;
	q->head = q->count = 0;
	return 0;
}

void fr_tpb_sq_fini(struct fr_tpb_sq *q)
{
	free(q->e);
	q->e = NULL;
}

void fr_tpb_sq_post(struct fr_tpb_sq *q, struct fr_tpb_mr *mr, uint64_t ctx)
{
	struct fr_tpb_sqe *e = fr_tpb_sq_at(q, q->count);

	e->mr = mr;
	e->ctx = ctx;
	if (mr)
		mr->inflight++;
	q->count++;
}

void fr_tpb_sq_release(struct fr_tpb_sq *q)
{
	for (unsigned int i = 0; i < q->count; i++) {
		struct fr_tpb_sqe *e = fr_tpb_sq_at(q, i);

		if (e->mr) {
			e->mr->inflight--;
			e->mr = NULL;
		}
	}
}

void fr_tpb_sq_retire(struct fr_tp_conn *c)
{
	struct fr_tpb_conn *cb = fr_tpb_c(c);
	struct fr_tpb_sqe *e = fr_tpb_sq_at(&cb->sq, 0);

	fr_cqring_push(fr_tpb_of(cb->tp)->cq, FR_CQE_SEND, 0, c, e->ctx, 0, 0);
	if (e->mr) {
		e->mr->inflight--;
		e->mr = NULL;
	}
	fr_tpb_sq_pop(&cb->sq);
}

int fr_tpb_write_check(const struct fr_tp_conn *c, struct fr_tp_mr *lmr,
		       size_t loff, const struct fr_tp_rkey *rkey, size_t len)
{
	const struct fr_tpb_conn *cb = fr_tpb_cc(c);
	const struct fr_tpb_mr *m = fr_tpb_mr(lmr);

	if (!c)
		return FR_EINVAL;
	if (cb->state == FR_TPB_FAILED)
		return cb->error;
	if (cb->state != FR_TPB_UP)
		return FR_EAGAIN;
	/* The RECV completion reports the length in 32 bits. */
	if (len > UINT32_MAX)
		return FR_EINVAL;
	if (len) {
		if (!m || !rkey || m->tp != cb->tp || !rkey->d)
			return FR_EINVAL;
		if (loff > m->len || len > m->len - loff)
			return FR_ERANGE;
	}
	if (cb->sq.count == cb->sq.depth)
		return FR_EAGAIN;
	return 0;
}

/* ---- the region table
 * ---------------------------------------------------------- */

static uint32_t fr_tpb_gen_next(uint32_t gen)
{
	/* 0 is never a valid generation, so a zeroed key matches nothing. */
	return gen == UINT32_MAX ? 1 : gen + 1;
}

int fr_tpb_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		   struct fr_tp_mr **out)
{
	const int all =
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	struct fr_tpb *b = fr_tpb_of(tp);
	struct fr_tpb_slot *regions;
	struct fr_tpb_mr *mr;
	uint32_t id, i, cap;

	if (!tp || !out || (access & ~all) || (!buf && len) ||
	    (uintptr_t)buf + len < (uintptr_t)buf)
		return FR_EINVAL;
	for (id = 0; id < b->nregions; id++)
		if (!b->regions[id].mr)
			break;
	if (id == b->nregions) {
		if (b->nregions >= FR_TPB_MAX_REGIONS)
			return FR_ENOMEM;
		cap = b->nregions ? b->nregions * 2 : 16;
		regions = realloc(b->regions, cap * sizeof(*regions));
		if (!regions)
			return FR_ENOMEM;
		for (i = b->nregions; i < cap; i++) {
			regions[i].mr = NULL;
			regions[i].gen = 1;
		}
		b->regions = regions;
		b->nregions = cap;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return FR_ENOMEM;
	mr->tp = tp;
	mr->base = buf;
	mr->len = len;
	mr->access = access;
	mr->id = id;
	mr->gen = b->regions[id].gen;
	b->regions[id].mr = mr;
	*out = (struct fr_tp_mr *)(void *)mr;
	return 0;
}

int fr_tpb_dereg_check(struct fr_tpb *b, struct fr_tpb_mr *mr)
{
	if (!b || !mr || fr_tpb_of(mr->tp) != b || mr->id >= b->nregions ||
	    b->regions[mr->id].mr != mr)
		return FR_EINVAL;
	/* Queued sends still read from it: the caller must poll first. */
	if (mr->inflight)
		return FR_EBUSY;
	return 0;
}

int fr_tpb_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *m)
{
	struct fr_tpb *b = tp ? fr_tpb_of(tp) : NULL;
	struct fr_tpb_mr *mr = fr_tpb_mr(m);
	int rc = fr_tpb_dereg_check(b, mr);

	if (rc)
		return rc;
	b->regions[mr->id].mr = NULL;
	b->regions[mr->id].gen = fr_tpb_gen_next(mr->gen);
	free(mr);
	return 0;
}

struct fr_tpb_mr *fr_tpb_region(const struct fr_tpb *b, uint32_t id,
				uint32_t gen)
{
	struct fr_tpb_mr *mr = id < b->nregions ? b->regions[id].mr : NULL;

	return mr && mr->gen == gen ? mr : NULL;
}

/* The address field: only in a key of 28 bytes. */
#define FR_TPB_RKEY_ADDR_END 28

int fr_tpb_pack_rkey(struct fr_tp_mr *m, void *blob, size_t *len)
{
	const struct fr_tpb_mr *mr = fr_tpb_mr(m);
	const struct fr_tpb_class *cls;
	uint8_t *b = blob;

	if (!mr || !blob || !len)
		return FR_EINVAL;
	cls = fr_tpb_of(mr->tp)->cls;
	if (*len < cls->rkey.len)
		return FR_EINVAL;
	b[0] = cls->rkey.magic;
	b[1] = cls->rkey.version;
	fr_put_le16(b + 2, 0);
	fr_put_le32(b + 4, mr->id);
	fr_put_le32(b + 8, mr->gen);
	fr_put_le64(b + 12, mr->len);
	if (cls->rkey.len >= FR_TPB_RKEY_ADDR_END)
		fr_put_le64(b + 20, (uint64_t)(uintptr_t)mr->base);
	*len = cls->rkey.len;
	return 0;
}

int fr_tpb_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
		       struct fr_tp_rkey *rkey)
{
	const struct fr_tpb_class *cls;
	const uint8_t *b = blob;
	uint32_t id, gen;

	if (!tp || !blob || !rkey)
		return FR_EINVAL;
	cls = fr_tpb_of(tp)->cls;
	if (len != cls->rkey.len || b[0] != cls->rkey.magic ||
	    b[1] != cls->rkey.version || fr_get_le16(b + 2))
		return FR_EPROTO;
	id = fr_get_le32(b + 4);
	gen = fr_get_le32(b + 8);
	if (id >= FR_TPB_MAX_REGIONS || !gen)
		return FR_EPROTO;
	rkey->a = fr_get_le64(b + 12);
	rkey->b =
		cls->rkey.len >= FR_TPB_RKEY_ADDR_END ? fr_get_le64(b + 20) : 0;
	rkey->c = id;
	rkey->d = gen;
	return 0;
}
