/* SPDX-License-Identifier: MIT */
/*
 * fr_mux.c - the mixed transports: shared memory to the peers on this
 * node, TCP ("shm+tcp") or verbs ("shm+verbs") to the others, behind the
 * one interface the algorithms see.
 *
 * Design
 *   - An endpoint opens both children.  Its address blob carries both
 *     addresses; connect() reads the node id inside the shm address and
 *     connects through shm when the peer is on our node, else through the
 *     network child (tcp or verbs).
 *     accept() takes whichever child the peer came in by.
 *   - A connection wraps the child's and says which child; completions
 *     name the child's connection and poll() translates them back (a
 *     list, most recently used first: a rank has few connections).
 *   - A region is registered with both children; its key blob is the
 *     network key followed by the shm key, unpacked into a struct
 *     fr_mux_rkey in the opaque room of struct fr_tp_rkey: the network
 *     key where a child's key goes (a/b/c/d, so that it reaches the
 *     network child as it is), the shm key after it.
 *   - poll() polls both; wait() arms both (wait_prepare) and sleeps in an
 *     epoll set of its own holding both children's wait_fd() and a wake
 *     eventfd.  The connection list, the epoll set and the wake are the
 *     transport base's (transports/common/tp_base.h).
 *
 *   address blob: u8 magic 0xfb, u8 version 1, u8 shm length, shm address,
 *     u8 network length, network address (the lengths must add up
 *     exactly).  key blob: u8 network key length, network key, shm key
 *     without its bytes 2 and 3 (reserved, always 0: restored on unpack,
 *     so that a verbs key and an shm key fit FR_TP_RKEY_MAX together).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "../common/tp_base.h"
#include "fastreduce.h"
#include "log.h"
#include "transport.h"
#include "util.h"

#define MUX_MAGIC 0xfb
#define MUX_VERSION 1

struct fr_tp_mr; /* ours is struct mux_mr, cast at the interface */

struct mux_mr {
	struct fr_tpb_link link; /* in tp->mrs (first): freed at close */
	struct fr_tp_mr *net, *shm;
	const struct fr_tp_ops *nops;
};

/*
 * A peer's region, as the mixed transport unpacks it into the opaque room
 * of struct fr_tp_rkey: one key per child, each in the fields a child's
 * key uses (tcp, shm and verbs fill a/b/c/d only).  The network key comes
 * first, where the generic fields are, so the network child is handed the
 * caller's struct as it is.
 */
struct mux_key {
	uint64_t a, b;
	uint32_t c, d;
};

struct fr_mux_rkey {
	struct mux_key net, shm;
};

_Static_assert(sizeof(struct fr_mux_rkey) <= FR_TP_RKEY_BYTES,
	       "two keys fit struct fr_tp_rkey");
_Static_assert(
	offsetof(struct fr_tp_rkey, a) == offsetof(struct mux_key, a) &&
		offsetof(struct fr_tp_rkey, b) == offsetof(struct mux_key, b) &&
		offsetof(struct fr_tp_rkey, c) == offsetof(struct mux_key, c) &&
		offsetof(struct fr_tp_rkey, d) == offsetof(struct mux_key, d),
	"the network key is where a child's key goes");

/* A connection: the child's, wrapped (completions are translated back). */
struct fr_tp_conn {
	struct fr_tpb_conn b; /* endpoint, list (most recently used first),
			       * peer */
	bool shm;
	void *child; /* the child transport's connection */
};

struct fr_tp {
	struct fr_tpb b; /* rank, connections, epoll set, wake eventfd */
	struct fr_tp *net, *shm;
	const struct fr_tp_ops *nops, *sops;
	struct fr_tpb_link *mrs; /* our regions (struct mux_mr) */
	uint64_t node; /* ours, from our shm address (FR_NODE at open) */
};

FR_TPB_FIRST(fr_tp);
FR_TPB_FIRST(fr_tp_conn);

/* The base keeps our list of wrappers, the epoll set and the wake; the
 * children do the rest (a wrapper holds nothing the base must release). */
static const struct fr_tpb_class mux_class = {
	.name = "mux",
};

static const struct fr_tp_ops *ops_of(const struct fr_tp_conn *c)
{
	return c->shm ? &fr_shm_ops : c->b.tp->nops;
}

/* Wrap a child's new connection to peer into *conn (closed again if out
 * of memory). */
static int wrap(struct fr_tp *tp, int peer, bool shm, void *child,
		struct fr_tp_conn **conn)
{
	struct fr_tp_conn *c = fr_tpb_conn_new(tp, sizeof(*c), 0);

	if (!c) {
		(shm ? tp->sops : tp->nops)->close_conn(child);
		return FR_ENOMEM;
	}
	c->b.peer = peer;
	c->shm = shm;
	c->child = child;
	fr_tpb_conn_link(c);
	*conn = c;
	return 0;
}

/* The wrapper of a child connection (completions name the child's). */
static struct fr_tp_conn *unwrap_cqe(struct fr_tp *tp, const void *child)
{
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next)
		if (c->child == child) {
			/* move to front: a few peers carry most traffic */
			if (c != tp->b.conns) {
				fr_tpb_conn_unlink(c);
				fr_tpb_conn_link(c);
			}
			return c;
		}
	return NULL;
}

static int mux_probe_net(const struct fr_tp_ops *net, char *errbuf,
			 size_t errlen)
{
	int rc = fr_shm_ops.probe(errbuf, errlen);

	return rc ? rc : net->probe(errbuf, errlen);
}

static int mux_probe(char *errbuf, size_t errlen)
{
	return mux_probe_net(&fr_tcp_ops, errbuf, errlen);
}

static int mux_open_net(const struct fr_tp_ops *net,
			const struct fr_tp_params *p, struct fr_tp **out,
			void *addr, size_t *addrlen)
{
	uint8_t sa[FR_TP_ADDR_MAX], na[FR_TP_ADDR_MAX], *b = addr;
	size_t sl = sizeof(sa), nl = sizeof(na);
	struct fr_tp_params q;
	struct fr_tp *tp;
	const char *what;
	int rc;

	if (!p || !out || !addr || !addrlen)
		return FR_EINVAL;
	/* our own copy for the base (fields past the caller's size read as
	 * zero); the children get the caller's */
	memset(&q, 0, sizeof(q));
	memcpy(&q, p, FR_MIN(p->size, sizeof(q)));
	tp = fr_tpb_alloc(&mux_class, &q, sizeof(*tp));
	if (!tp)
		return FR_ENOMEM;
	tp->sops = &fr_shm_ops;
	tp->nops = net;
	rc = tp->sops->open(p, &tp->shm, sa, &sl);
	if (rc)
		goto err_shm;
	rc = tp->nops->open(p, &tp->net, na, &nl);
	if (rc)
		goto err_net;
	rc = FR_EINVAL;
	if (4 + sl + nl > *addrlen || sl < 16 || sl > 255 || nl > 255)
		goto err_addr;
	tp->node = fr_get_le64(sa + 8);
	rc = FR_ESYS;
	if (fr_tpb_open_fds(&tp->b, &what))
		goto err_ctl;
	/* each child's descriptor names its child: mux_wait() lets only the
	 * one that has news take it */
	if (fr_tpb_watch(&tp->b, tp->sops->wait_fd(tp->shm), EPOLLIN,
			 tp->shm) ||
	    fr_tpb_watch(&tp->b, tp->nops->wait_fd(tp->net), EPOLLIN, tp->net))
		goto err_ctl;
	b[0] = MUX_MAGIC;
	b[1] = MUX_VERSION;
	b[2] = (uint8_t)sl;
	memcpy(b + 3, sa, sl);
	b[3 + sl] = (uint8_t)nl;
	memcpy(b + 4 + sl, na, nl);
	*addrlen = 4 + sl + nl;
	*out = tp;
	return 0;

err_ctl:
	fr_tpb_fini(&tp->b);
err_addr:
	tp->nops->close(tp->net);
err_net:
	tp->sops->close(tp->shm);
err_shm:
	free(tp);
	return rc;
}

static int mux_open(const struct fr_tp_params *p, struct fr_tp **out,
		    void *addr, size_t *addrlen)
{
	return mux_open_net(&fr_tcp_ops, p, out, addr, addrlen);
}

static int mux_connect(struct fr_tp *tp, int peer, const void *addr,
		       size_t addrlen, struct fr_tp_conn **conn)
{
	const uint8_t *b = addr;
	struct fr_tp_conn *cc;
	size_t sl;
	bool shm;
	int rc;

	if (!tp || !addr || !conn)
		return FR_EINVAL;
	if (addrlen < 4 || b[0] != MUX_MAGIC || b[1] != MUX_VERSION ||
	    4 + (size_t)b[2] > addrlen ||
	    4 + (size_t)b[2] + b[3 + b[2]] != addrlen)
		return FR_EPROTO;
	sl = b[2];
	/* the shm address carries the node id at bytes 8..15 */
	shm = sl >= 16 && fr_get_le64(b + 3 + 8) == tp->node;
	rc = shm ? tp->sops->connect(tp->shm, peer, b + 3, sl, &cc)
		 : tp->nops->connect(tp->net, peer, b + 4 + sl,
				     addrlen - 4 - sl, &cc);
	return rc ? rc : wrap(tp, peer, shm, cc, conn);
}

static int mux_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **conn)
{
	struct fr_tp_conn *cc;
	bool shm = true;
	int rc;

	if (!tp || !conn)
		return FR_EINVAL;
	rc = tp->sops->accept(tp->shm, peer, &cc);
	if (rc == FR_EAGAIN) {
		shm = false;
		rc = tp->nops->accept(tp->net, peer, &cc);
	}
	return rc ? rc : wrap(tp, peer, shm, cc, conn);
}

static int mux_connect_done(struct fr_tp_conn *c)
{
	return c ? ops_of(c)->connect_done(c->child) : FR_EINVAL;
}

static int mux_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		       struct fr_tp_mr **out)
{
	struct mux_mr *m;
	int rc;

	if (!tp || !out)
		return FR_EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return FR_ENOMEM;
	m->nops = tp->nops;
	rc = tp->nops->reg_mem(tp->net, buf, len, access, &m->net);
	if (rc)
		goto err_net;
	rc = tp->sops->reg_mem(tp->shm, buf, len, access, &m->shm);
	if (rc)
		goto err_shm;
	fr_tpb_list_add(&tp->mrs, &m->link);
	*out = (struct fr_tp_mr *)m;
	return 0;

err_shm:
	tp->nops->dereg_mem(tp->net, m->net);
err_net:
	free(m);
	return rc;
}

static int mux_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr)
{
	struct mux_mr *m = (struct mux_mr *)mr;
	int rc;

	if (!tp || !m)
		return FR_EINVAL;
	/* a child still busy (FR_EBUSY) says so; the caller polls and
	 * retries, and what went already stays gone */
	if (m->shm) {
		rc = tp->sops->dereg_mem(tp->shm, m->shm);
		if (rc)
			return rc;
		m->shm = NULL;
	}
	rc = tp->nops->dereg_mem(tp->net, m->net);
	if (rc)
		return rc;
	fr_tpb_list_del(&tp->mrs, &m->link);
	free(m);
	return 0;
}

static int mux_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len)
{
	struct mux_mr *m = (struct mux_mr *)mr;
	uint8_t *b = blob, sk[FR_TP_RKEY_MAX];
	size_t nl, sl = sizeof(sk);
	int rc;

	if (!m || !blob || !len || *len < 2)
		return FR_EINVAL;
	nl = *len - 1;
	rc = m->nops->pack_rkey(m->net, b + 1, &nl);
	if (rc || nl > 255)
		return rc ? rc : FR_EINVAL;
	rc = fr_shm_ops.pack_rkey(m->shm, sk, &sl);
	if (rc)
		return rc;
	/* bytes 2 and 3 of an shm key are reserved zeros: left out */
	if (sl < 4 || sk[2] || sk[3] || 1 + nl + sl - 2 > *len)
		return FR_EINVAL;
	memcpy(b + 1 + nl, sk, 2);
	memcpy(b + 1 + nl + 2, sk + 4, sl - 4);
	b[0] = (uint8_t)nl;
	*len = 1 + nl + sl - 2;
	return 0;
}

static int mux_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
			   struct fr_tp_rkey *rkey)
{
	const uint8_t *b = blob;
	uint8_t sk[FR_TP_RKEY_MAX + 2];
	struct fr_tp_rkey s;
	struct mux_key k;
	size_t sl;
	int rc;

	if (!tp || !blob || !rkey)
		return FR_EINVAL;
	if (len < 1 || 1 + (size_t)b[0] + 2 > len ||
	    len - 1 - b[0] + 2 > sizeof(sk))
		return FR_EPROTO;
	rc = tp->nops->unpack_rkey(tp->net, b + 1, b[0], rkey);
	if (rc)
		return rc;
	/* the shm key with its reserved bytes 2 and 3 put back */
	sl = len - 1 - b[0];
	memcpy(sk, b + 1 + b[0], 2);
	sk[2] = sk[3] = 0;
	memcpy(sk + 4, b + 1 + b[0] + 2, sl - 2);
	rc = tp->sops->unpack_rkey(tp->shm, sk, sl + 2, &s);
	if (rc)
		return rc;
	k.a = s.a;
	k.b = s.b;
	k.c = s.c;
	k.d = s.d;
	memcpy(rkey->raw + offsetof(struct fr_mux_rkey, shm), &k, sizeof(k));
	return 0;
}

/* The shm side's key inside a mixed key. */
static void mux_shm_key(const struct fr_tp_rkey *rkey, struct fr_tp_rkey *s)
{
	struct mux_key k;

	memcpy(&k, rkey->raw + offsetof(struct fr_mux_rkey, shm), sizeof(k));
	s->a = k.a;
	s->b = k.b;
	s->c = k.c;
	s->d = k.d;
}

static int mux_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr,
			 size_t loff, const struct fr_tp_rkey *rkey,
			 uint64_t roff, size_t len, uint32_t imm, uint64_t ctx)
{
	struct mux_mr *m = (struct mux_mr *)lmr;
	struct fr_tp_rkey s = {0};

	if (!c)
		return FR_EINVAL;
	if (len && !m)
		return FR_EINVAL;
	if (!c->shm)
		return c->b.tp->nops->write_imm(c->child, m ? m->net : NULL,
						loff, rkey, roff, len, imm,
						ctx);
	if (rkey)
		mux_shm_key(rkey, &s);
	if (len && !m->shm)
		return FR_EINVAL;
	return fr_shm_ops.write_imm(c->child, m ? m->shm : NULL, loff,
				    rkey ? &s : NULL, roff, len, imm, ctx);
}

/* The side's own, where it has one; else FR_EAGAIN: the caller then uses
 * write_imm, as transport.h allows. */
static int mux_write_inline(struct fr_tp_conn *c, const void *buf,
			    const struct fr_tp_rkey *rkey, uint64_t roff,
			    size_t len, uint32_t imm)
{
	struct fr_tp_rkey s = {0};

	if (!c || !buf || !rkey || !len || len > FR_TP_INLINE_MAX)
		return FR_EINVAL;
	if (!c->shm)
		return c->b.tp->nops->write_inline
			       ? c->b.tp->nops->write_inline(
					 c->child, buf, rkey, roff, len, imm)
			       : FR_EAGAIN;
	mux_shm_key(rkey, &s);
	return fr_shm_ops.write_inline(c->child, buf, &s, roff, len, imm);
}

/* Lines are the shm side's (transport.h): a peer over the network has
 * none, and the one-shot over lines is chosen only where every rank is on
 * this node (algo/ll.c), so a put or get to it is refused. */
static size_t mux_line_bytes(struct fr_tp *tp)
{
	return tp ? fr_shm_ops.line_bytes(tp->shm) : 0;
}

static int mux_line_put(struct fr_tp_conn *c, uint64_t seq, const void *buf,
			size_t len)
{
	if (!c || !c->shm)
		return FR_EINVAL;
	return fr_shm_ops.line_put(c->child, seq, buf, len);
}

static int mux_line_get(struct fr_tp_conn *c, uint64_t seq, void *buf,
			size_t len)
{
	if (!c || !c->shm)
		return FR_EINVAL;
	return fr_shm_ops.line_get(c->child, seq, buf, len);
}

static int mux_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	int n, k;

	if (!tp || max < 0 || (max && !cqe))
		return FR_EINVAL;
	n = tp->sops->poll(tp->shm, cqe, max);
	if (n < 0)
		return n;
	k = tp->nops->poll(tp->net, cqe + n, max - n);
	if (k < 0)
		return k;
	for (int i = 0; i < n + k; i++)
		cqe[i].conn = unwrap_cqe(tp, cqe[i].conn);
	return n + k;
}

static int mux_wait(struct fr_tp *tp, int timeout_ms)
{
	struct epoll_event ev[4];
	int t = timeout_ms, rs, rn, n;

	if (!tp)
		return FR_EINVAL;
	rs = tp->sops->wait_prepare(tp->shm, &t);
	if (rs) {
		if (rs > 0)
			tp->sops->wait_finish(tp->shm);
		return rs < 0 ? rs : 0;
	}
	rn = tp->nops->wait_prepare(tp->net, &t);
	if (rn) {
		tp->sops->wait_finish(tp->shm);
		return rn < 0 ? rn : 0;
	}
	n = epoll_wait(tp->b.epfd, ev, (int)FR_ARRAY_SIZE(ev), t);
	tp->sops->wait_finish(tp->shm);
	tp->nops->wait_finish(tp->net);
	if (n < 0 && errno != EINTR)
		return FR_ESYS;
	/*
	 * Let the child that has news take its socket events now (a zero
	 * wait), so that the next sleep does not wake at once for the same
	 * event; read the wake eventfd only when it fired.  A stream's every
	 * wake-up otherwise cost two epoll_wait() calls and a read() that
	 * found nothing (perf/bench/README.md, "System calls per byte").
	 */
	for (int i = 0; i < n; i++) {
		if (ev[i].data.ptr == &tp->b.wfd)
			fr_tpb_wake_drain(&tp->b);
		else if (ev[i].data.ptr == tp->shm)
			tp->sops->wait(tp->shm, 0);
		else if (ev[i].data.ptr == tp->net)
			tp->nops->wait(tp->net, 0);
	}
	return 0;
}

static void mux_close_conn(struct fr_tp_conn *c)
{
	if (!c)
		return;
	ops_of(c)->close_conn(c->child);
	fr_tpb_conn_free(c);
}

static void mux_close(struct fr_tp *tp)
{
	if (!tp)
		return;
	/* our wrappers only: the children close their connections below */
	fr_tpb_fini(&tp->b);
	/* the children free their regions; ours are only the pairs */
	while (tp->mrs) {
		struct fr_tpb_link *m = tp->mrs;

		tp->mrs = m->next;
		free(m); /* a struct mux_mr, its first member */
	}
	tp->nops->close(tp->net);
	tp->sops->close(tp->shm);
	free(tp);
}

static int mux_pending(struct fr_tp *tp, int *peers, int max)
{
	int n;

	if (!tp || !peers || max <= 0)
		return 0;
	n = tp->sops->pending ? tp->sops->pending(tp->shm, peers, max) : 0;
	if (n < max && tp->nops->pending)
		n += tp->nops->pending(tp->net, peers + n, max - n);
	return n;
}

/* The children's most recent error text: the network's first (an HCA's
 * status, a socket's error), else shm's. */
static const char *mux_last_error(struct fr_tp *tp)
{
	const char *e;

	if (!tp)
		return "";
	e = tp->nops->last_error ? tp->nops->last_error(tp->net) : NULL;
	if (e && *e)
		return e;
	e = tp->sops->last_error ? tp->sops->last_error(tp->shm) : NULL;
	return e ? e : "";
}

/* The network adapter's CPUs (verbs), for the progress thread. */
static int mux_locality(struct fr_tp *tp, cpu_set_t *cpus)
{
	if (!tp || !tp->nops->locality)
		return FR_ENODEV;
	return tp->nops->locality(tp->net, cpus);
}

#define MUX_OPS(name_, probe_, open_)                                         \
	{                                                                     \
		.size = sizeof(struct fr_tp_ops), .name = name_,              \
		.probe = probe_, .open = open_, .connect = mux_connect,       \
		.accept = mux_accept, .connect_done = mux_connect_done,       \
		.reg_mem = mux_reg_mem, .dereg_mem = mux_dereg_mem,           \
		.pack_rkey = mux_pack_rkey, .unpack_rkey = mux_unpack_rkey,   \
		.write_imm = mux_write_imm, .write_inline = mux_write_inline, \
		.poll = mux_poll, .wait = mux_wait, .wake = fr_tpb_wake,      \
		.close_conn = mux_close_conn, .close = mux_close,             \
		.conn_peer = fr_tpb_conn_peer, .pending = mux_pending,        \
		.last_error = mux_last_error, .locality = mux_locality,       \
		.line_bytes = mux_line_bytes, .line_put = mux_line_put,       \
		.line_get = mux_line_get,                                     \
	}

const struct fr_tp_ops fr_mux_ops = MUX_OPS("shm+tcp", mux_probe, mux_open);

#ifdef FR_HAVE_VERBS
static int mux_verbs_probe(char *errbuf, size_t errlen)
{
	return mux_probe_net(&fr_verbs_ops, errbuf, errlen);
}

static int mux_verbs_open(const struct fr_tp_params *p, struct fr_tp **out,
			  void *addr, size_t *addrlen)
{
	return mux_open_net(&fr_verbs_ops, p, out, addr, addrlen);
}

const struct fr_tp_ops fr_mux_verbs_ops =
	MUX_OPS("shm+verbs", mux_verbs_probe, mux_verbs_open);
#endif
