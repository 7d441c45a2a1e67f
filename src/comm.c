/* SPDX-License-Identifier: MIT */
/*
 * comm.c - communicator creation, destruction, errors and counters.
 *
 * Creation, in order (and unwound in exactly the reverse order):
 *   1. settings from the config struct, else the environment, else defaults;
 *   2. rendezvous phase 1 (bootstrap.c): learn the interface that reaches
 *      rank 0;
 *   3. open the transport endpoint on it, register the staging slots and
 *      control inboxes once for the communicator's life;
 *   4. rendezvous phase 2: trade "cards" (endpoint address + remote keys);
 *   5. connect to the next rank and accept the previous one - only the two
 *      ring neighbours, never a mesh.
 *
 * Global state: the message of the last failed fr_comm_create*() is kept
 * per thread (for fr_comm_last_error(NULL)); that and the log level are the
 * library's only globals.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "env.h"
#include "internal.h"
#include "log.h"
#include "reduce.h"
#include "ring.h"
#include "util.h"

static _Thread_local char create_err[FR_ERRMSG_MAX];

int fr_comm_seterr(struct fr_comm *comm, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(comm->errmsg, sizeof(comm->errmsg), fmt, ap);
	va_end(ap);
	return err;
}

int fr_comm_fail(struct fr_comm *comm, int err, const char *fmt, ...)
{
	va_list ap;

	if (comm->failed)
		return comm->failed; /* keep the first, root-cause message */
	va_start(ap, fmt);
	vsnprintf(comm->errmsg, sizeof(comm->errmsg), fmt, ap);
	va_end(ap);
	comm->failed = err;
	fr_err("%s", comm->errmsg);
	/* Tell the neighbours so the failure travels around the ring. */
	fr_ring_send_abort(comm, err, comm->rank);
	return err;
}

void fr_config_init(fr_config_t *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
}

/* Settings after config, environment and defaults. */
struct settings {
	int rank, nranks;
	char rendezvous[300];
	const char *transport;
	const char *token;
	long timeout_ms;
	size_t segment_bytes;
	long slots, regcache, spin_us;
};

/* Fields of a caller's config that its size says it has. */
#define CFG_HAS(cfg, field)                                                    \
	((cfg)->size >= offsetof(fr_config_t, field) + sizeof((cfg)->field))

static int resolve_settings(const fr_config_t *cfg, struct settings *s,
			    char *err, size_t errlen)
{
	fr_getenv_fn get = fr_env_getenv;
	int rc;

	s->transport = cfg && CFG_HAS(cfg, transport) && cfg->transport ?
			       cfg->transport :
			       getenv("FR_TRANSPORT");
	if (!s->transport || !*s->transport)
		s->transport = "auto";
	s->token = cfg && CFG_HAS(cfg, job_token) && cfg->job_token ?
			   cfg->job_token :
			   getenv("FR_JOB_TOKEN");

	s->timeout_ms = FR_DEFAULT_TIMEOUT_MS;
	if (cfg && CFG_HAS(cfg, timeout_ms) && cfg->timeout_ms) {
		if (cfg->timeout_ms < 0) {
			snprintf(err, errlen, "config timeout_ms %d < 0",
				 cfg->timeout_ms);
			return FR_EINVAL;
		}
		s->timeout_ms = cfg->timeout_ms;
	} else {
		rc = fr_env_long(get, NULL, "FR_TIMEOUT_MS", 1, 86400000L,
				 &s->timeout_ms, err, errlen);
		if (rc < 0)
			return rc;
	}
	s->segment_bytes = FR_DEFAULT_SEGMENT;
	if (cfg && CFG_HAS(cfg, segment_bytes) && cfg->segment_bytes) {
		s->segment_bytes = cfg->segment_bytes;
	} else {
		rc = fr_env_size(get, NULL, "FR_SEGMENT_BYTES", 256, 1u << 30,
				 &s->segment_bytes, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (s->segment_bytes < 256 || s->segment_bytes > (1u << 30) ||
	    s->segment_bytes % 8) {
		snprintf(err, errlen,
			 "segment size %zu must be a multiple of 8 in [256, 1G]",
			 s->segment_bytes);
		return FR_EINVAL;
	}
	s->slots = FR_DEFAULT_SLOTS;
	if (cfg && CFG_HAS(cfg, slots) && cfg->slots) {
		s->slots = cfg->slots;
	} else {
		rc = fr_env_long(get, NULL, "FR_SLOTS", 2, FR_MAX_SLOTS,
				 &s->slots, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (s->slots < 2 || s->slots > FR_MAX_SLOTS) {
		snprintf(err, errlen, "slots %ld must be in [2, %d]", s->slots,
			 FR_MAX_SLOTS);
		return FR_EINVAL;
	}
	s->regcache = FR_DEFAULT_REGCACHE;
	if (cfg && CFG_HAS(cfg, regcache_entries) && cfg->regcache_entries > 0) {
		s->regcache = cfg->regcache_entries;
	} else {
		rc = fr_env_long(get, NULL, "FR_REGCACHE_MAX", 1, 1 << 20,
				 &s->regcache, err, errlen);
		if (rc < 0)
			return rc;
	}
	s->spin_us = FR_DEFAULT_SPIN_US;
	rc = fr_env_long(get, NULL, "FR_SPIN_US", 0, 10000000L, &s->spin_us,
			 err, errlen);
	if (rc < 0)
		return rc;
	/* FR_POLL: spin = never block, event = block at once, hybrid
	 * (default) = spin FR_SPIN_US, then block. */
	const char *poll = getenv("FR_POLL");

	if (poll && *poll && strcmp(poll, "hybrid")) {
		if (!strcmp(poll, "spin")) {
			s->spin_us = -1;
		} else if (!strcmp(poll, "event")) {
			s->spin_us = 0;
		} else {
			snprintf(err, errlen,
				 "FR_POLL=\"%s\" is not spin, event or hybrid",
				 poll);
			return FR_EINVAL;
		}
	}
	return 0;
}

static const struct fr_tp_ops *choose_transport(const char *name, char *err,
						size_t errlen)
{
	const struct fr_tp_ops *ops;
	char why[256] = "";

	if (!strcmp(name, "auto")) {
		ops = fr_transport_find("verbs");
		if (ops && !ops->probe(why, sizeof(why))) {
			fr_info("transport: verbs (an active RDMA port was found)");
			return ops;
		}
		fr_info("transport: tcp (%s)",
			ops ? why : "the verbs transport is not built in");
		return fr_transport_find("tcp");
	}
	ops = fr_transport_find(name);
	if (!ops) {
		snprintf(err, errlen,
			 "transport \"%s\" is unknown or not built in (FR_TRANSPORT=auto|tcp|verbs)",
			 name);
		return NULL;
	}
	if (ops->probe(why, sizeof(why))) {
		snprintf(err, errlen, "transport %s is not usable here: %s",
			 name, why);
		return NULL;
	}
	return ops;
}

/*
 * A card: what a rank tells the others at the rendezvous.
 *   u8 addr_len, addr, u8 staging_key_len, key, u8 inbox_key_len, key
 */
static int card_build(struct fr_comm *c, const void *addr, size_t addrlen,
		      struct fr_boot_card *card)
{
	uint8_t *p = card->data;
	size_t kl;
	int rc;

	*p++ = (uint8_t)addrlen;
	memcpy(p, addr, addrlen);
	p += addrlen;
	kl = FR_TP_RKEY_MAX;
	rc = c->tp_ops->pack_rkey(c->staging_mem->tp_mr, p + 1, &kl);
	if (rc)
		return rc;
	*p = (uint8_t)kl;
	p += 1 + kl;
	kl = FR_TP_RKEY_MAX;
	rc = c->tp_ops->pack_rkey(c->ctrl_in_mem->tp_mr, p + 1, &kl);
	if (rc)
		return rc;
	*p = (uint8_t)kl;
	p += 1 + kl;
	card->len = (uint16_t)(p - card->data);
	return 0;
}

struct card_view {
	const uint8_t *addr, *staging_key, *inbox_key;
	size_t addrlen, staging_len, inbox_len;
};

static int card_parse(const struct fr_boot_card *card, struct card_view *v)
{
	const uint8_t *p = card->data, *end = card->data + card->len;

	if (p >= end || *p > FR_TP_ADDR_MAX || end - p < 1 + *p + 1)
		return FR_EPROTO;
	v->addrlen = *p;
	v->addr = p + 1;
	p += 1 + *p;
	if (*p > FR_TP_RKEY_MAX || end - p < 1 + *p + 1)
		return FR_EPROTO;
	v->staging_len = *p;
	v->staging_key = p + 1;
	p += 1 + *p;
	if (*p > FR_TP_RKEY_MAX || end - p != 1 + *p)
		return FR_EPROTO;
	v->inbox_len = *p;
	v->inbox_key = p + 1;
	return 0;
}

/* FNV-1a: the transport's job nonce, equal on all ranks of one job. */
static uint64_t job_hash(const struct settings *s)
{
	uint64_t h = 1469598103934665603ull;
	char buf[400];

	snprintf(buf, sizeof(buf), "%s|%s|%d", s->token ? s->token : "",
		 s->rendezvous, s->nranks);
	for (const char *p = buf; *p; p++) {
		h ^= (unsigned char)*p;
		h *= 1099511628211ull;
	}
	return h;
}

/* Connect to the next rank and accept the previous one. */
static int connect_ring(struct fr_comm *c, const struct card_view *nextv,
			const struct card_view *prevv, uint64_t deadline)
{
	const struct fr_tp_ops *o = c->tp_ops;
	bool next_ok = false, prev_ok = false;
	int rc;

	rc = o->connect(c->tp, c->next.rank, nextv->addr, nextv->addrlen,
			&c->next.conn);
	if (rc)
		return fr_comm_seterr(c, rc,
				      "rank %d: connecting to rank %d (next) failed: %s",
				      c->rank, c->next.rank, fr_strerror(rc));
	while (!next_ok || !prev_ok) {
		uint64_t now = fr_now_ms();

		if (!prev_ok && !c->prev.conn) {
			rc = o->accept(c->tp, c->prev.rank, &c->prev.conn);
			if (rc && rc != FR_EAGAIN)
				return fr_comm_seterr(c, rc,
						      "rank %d: accepting rank %d (prev) failed: %s",
						      c->rank, c->prev.rank,
						      fr_strerror(rc));
		}
		if (!prev_ok && c->prev.conn) {
			rc = o->connect_done(c->prev.conn);
			if (rc && rc != FR_EAGAIN)
				return fr_comm_seterr(c, rc,
						      "rank %d: connection from rank %d (prev) failed: %s",
						      c->rank, c->prev.rank,
						      fr_strerror(rc));
			prev_ok = !rc;
		}
		if (!next_ok) {
			rc = o->connect_done(c->next.conn);
			if (rc && rc != FR_EAGAIN)
				return fr_comm_seterr(c, rc,
						      "rank %d: connecting to rank %d (next) failed: %s",
						      c->rank, c->next.rank,
						      fr_strerror(rc));
			next_ok = !rc;
		}
		if (next_ok && prev_ok)
			break;
		if (now >= deadline)
			return fr_comm_seterr(c, FR_ETIMEDOUT,
					      "rank %d: timed out connecting the ring (%s rank %d not connected)",
					      c->rank, next_ok ? "prev" : "next",
					      next_ok ? c->prev.rank : c->next.rank);
		rc = o->wait(c->tp, (int)FR_MIN(deadline - now, 50));
		if (rc)
			return fr_comm_seterr(c, rc, "rank %d: transport wait: %s",
					      c->rank, fr_strerror(rc));
	}
	return 0;
}

static int unpack_neighbours(struct fr_comm *c, const struct card_view *nextv,
			     const struct card_view *prevv)
{
	const struct fr_tp_ops *o = c->tp_ops;
	int rc;

	rc = o->unpack_rkey(c->tp, nextv->staging_key, nextv->staging_len,
			    &c->next_staging_rkey);
	if (!rc)
		rc = o->unpack_rkey(c->tp, nextv->inbox_key, nextv->inbox_len,
				    &c->next.ctrl_rkey);
	if (!rc)
		rc = o->unpack_rkey(c->tp, prevv->inbox_key, prevv->inbox_len,
				    &c->prev.ctrl_rkey);
	if (rc)
		return fr_comm_seterr(c, rc,
				      "rank %d: a neighbour's remote keys are malformed",
				      c->rank);
	return 0;
}

/* Register the areas peers write into, once for the communicator. */
static int alloc_areas(struct fr_comm *c)
{
	size_t ps = 4096, sz;
	int rc;

	sz = (size_t)c->slots * c->segment_bytes;
	c->staging = aligned_alloc(ps, (sz + ps - 1) / ps * ps);
	if (!c->staging)
		return FR_ENOMEM;
	rc = fr_mem_register_internal(c, c->staging, sz,
				      FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
				      false, &c->staging_mem);
	if (rc)
		goto err_staging;
	c->ctrl_in = aligned_alloc(ps, ps);
	if (!c->ctrl_in) {
		rc = FR_ENOMEM;
		goto err_in;
	}
	memset(c->ctrl_in, 0, ps);
	rc = fr_mem_register_internal(c, c->ctrl_in,
				      2 * FR_CTRL_SLOTS * FR_CTRL_MSG_SIZE,
				      FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
				      false, &c->ctrl_in_mem);
	if (rc)
		goto err_in_reg;
	c->ctrl_out = aligned_alloc(ps, ps);
	if (!c->ctrl_out) {
		rc = FR_ENOMEM;
		goto err_out;
	}
	rc = fr_mem_register_internal(c, c->ctrl_out,
				      FR_CTRL_SLOTS * FR_CTRL_MSG_SIZE,
				      FR_TP_LOCAL_READ, false,
				      &c->ctrl_out_mem);
	if (rc)
		goto err_out_reg;
	return 0;

err_out_reg:
	free(c->ctrl_out);
	c->ctrl_out = NULL;
err_out:
	fr_mem_free_internal(c->ctrl_in_mem);
	c->ctrl_in_mem = NULL;
err_in_reg:
	free(c->ctrl_in);
	c->ctrl_in = NULL;
err_in:
	fr_mem_free_internal(c->staging_mem);
	c->staging_mem = NULL;
err_staging:
	free(c->staging);
	c->staging = NULL;
	return rc;
}

static void free_areas(struct fr_comm *c)
{
	fr_mem_free_internal(c->ctrl_out_mem);
	free(c->ctrl_out);
	fr_mem_free_internal(c->ctrl_in_mem);
	free(c->ctrl_in);
	fr_mem_free_internal(c->staging_mem);
	free(c->staging);
	c->ctrl_out_mem = c->ctrl_in_mem = c->staging_mem = NULL;
	c->ctrl_out = c->ctrl_in = NULL;
	c->staging = NULL;
}

static void copy_msg(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src);

	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

static int comm_create(const struct settings *s, fr_comm_t **out, char *err,
		       size_t errlen)
{
	struct fr_tp_params tp = { .size = sizeof(tp) };
	struct fr_boot_params bp = { 0 };
	struct fr_boot *boot = NULL;
	struct fr_boot_card mine, *cards = NULL;
	struct card_view nextv, prevv;
	uint8_t addr[FR_TP_ADDR_MAX];
	size_t addrlen = sizeof(addr);
	char config[128];
	struct fr_comm *c;
	uint64_t deadline = fr_now_ms() + (uint64_t)s->timeout_ms;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return FR_ENOMEM;
	c->rank = s->rank;
	c->nranks = s->nranks;
	c->timeout_ms = (int)s->timeout_ms;
	c->segment_bytes = s->segment_bytes;
	c->slots = (int)s->slots;
	c->credits = c->slots;
	c->regcache_max = (int)s->regcache;
	c->spin_us = (int)s->spin_us;
	c->next.rank = (s->rank + 1) % s->nranks;
	c->prev.rank = (s->rank + s->nranks - 1) % s->nranks;
	c->stats.size = sizeof(c->stats);
	c->tp_ops = choose_transport(s->transport, err, errlen);
	if (!c->tp_ops) {
		rc = !strcmp(s->transport, "verbs") ? FR_ENODEV : FR_EINVAL;
		goto err_transport;
	}

	/* 2. rendezvous, phase 1 */
	bp.rank = s->rank;
	bp.nranks = s->nranks;
	bp.rendezvous = s->rendezvous;
	bp.token = s->token;
	bp.timeout_ms = (int)s->timeout_ms;
	bp.err = err;
	bp.errlen = errlen;
	rc = fr_boot_begin(&bp, &boot);
	if (rc)
		goto err_boot;

	/* 3. endpoint and the areas peers write into */
	tp.rank = s->rank;
	tp.job_nonce = job_hash(s);
	tp.local_ip = fr_boot_local_ip(boot);
	tp.timeout_ms = (int)s->timeout_ms;
	tp.errbuf = err;
	tp.errlen = errlen;
	rc = c->tp_ops->open(&tp, &c->tp, addr, &addrlen);
	if (rc && !strcmp(s->transport, "auto") &&
	    strcmp(c->tp_ops->name, "tcp")) {
		/* auto: an RDMA port that cannot be used means TCP (should
		 * the other ranks differ, the rendezvous says so) */
		fr_warn("rank %d: %s transport unusable (%s); using tcp",
			s->rank, c->tp_ops->name, err);
		c->tp_ops = fr_transport_find("tcp");
		addrlen = sizeof(addr);
		rc = c->tp_ops->open(&tp, &c->tp, addr, &addrlen);
		if (!rc)
			err[0] = '\0';
	}
	if (rc)
		goto err_open;
	rc = alloc_areas(c);
	if (rc) {
		copy_msg(err, errlen, c->errmsg);
		goto err_areas;
	}
	rc = card_build(c, addr, addrlen, &mine);
	if (rc)
		goto err_cards;

	/* 4. rendezvous, phase 2: everything here must match on all ranks */
	cards = calloc((size_t)s->nranks, sizeof(*cards));
	if (!cards) {
		rc = FR_ENOMEM;
		goto err_cards;
	}
	snprintf(config, sizeof(config), "transport=%s segment=%zu slots=%ld",
		 c->tp_ops->name, c->segment_bytes, s->slots);
	rc = fr_boot_exchange(boot, config, &mine, cards, &c->job_nonce);
	if (rc)
		goto err_exchange;
	fr_boot_end(boot);
	boot = NULL;

	/* 5. the two ring connections */
	if (s->nranks > 1) {
		if (card_parse(&cards[c->next.rank], &nextv) ||
		    card_parse(&cards[c->prev.rank], &prevv)) {
			snprintf(err, errlen,
				 "rank %d: malformed card from a neighbour",
				 s->rank);
			rc = FR_EPROTO;
			goto err_exchange;
		}
		rc = unpack_neighbours(c, &nextv, &prevv);
		if (!rc)
			rc = connect_ring(c, &nextv, &prevv, deadline);
		if (rc) {
			copy_msg(err, errlen, c->errmsg);
			goto err_connect;
		}
	}
	free(cards);
	c->errmsg[0] = '\0';
	c->last_activity_ms = fr_now_ms();
	fr_info("rank %d/%d: communicator up over %s (job %016llx)", c->rank,
		c->nranks, c->tp_ops->name, (unsigned long long)c->job_nonce);
	*out = c;
	return 0;

err_connect:
	if (c->prev.conn)
		c->tp_ops->close_conn(c->prev.conn);
	if (c->next.conn)
		c->tp_ops->close_conn(c->next.conn);
err_exchange:
	free(cards);
err_cards:
	free_areas(c);
err_areas:
	c->tp_ops->close(c->tp);
err_open:
	fr_boot_end(boot);
err_boot:
err_transport:
	free(c);
	return rc;
}

int fr_comm_create(const fr_config_t *cfg, fr_comm_t **comm)
{
	struct settings s = { 0 };
	char host[256];
	uint16_t port;
	int rc;

	create_err[0] = '\0';
	if (comm)
		*comm = NULL;
	if (!cfg || !comm || cfg->size < offsetof(fr_config_t, transport)) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create: %s", !cfg || !comm ?
				 "NULL argument" :
				 "config size too small (use fr_config_init)");
		return FR_EINVAL;
	}
	if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create: rank %d / nranks %d out of range",
			 cfg->rank, cfg->nranks);
		return FR_EINVAL;
	}
	if (cfg->nranks > 1 &&
	    (!cfg->rendezvous || fr_parse_hostport(cfg->rendezvous, host,
						   sizeof(host), &port))) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create: rendezvous \"%s\" is not host:port",
			 cfg->rendezvous ? cfg->rendezvous : "(null)");
		return FR_EINVAL;
	}
	rc = resolve_settings(cfg, &s, create_err, sizeof(create_err));
	if (rc)
		return rc;
	s.rank = cfg->rank;
	s.nranks = cfg->nranks;
	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s",
		 cfg->rendezvous ? cfg->rendezvous : "127.0.0.1:1");
	return comm_create(&s, comm, create_err, sizeof(create_err));
}

int fr_comm_create_from_env(const fr_config_t *cfg, fr_comm_t **comm)
{
	struct fr_launch l;
	struct settings s = { 0 };
	int rc;

	create_err[0] = '\0';
	if (comm)
		*comm = NULL;
	if (!comm || (cfg && cfg->size < offsetof(fr_config_t, transport))) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create_from_env: %s",
			 !comm ? "NULL argument" :
				 "config size too small (use fr_config_init)");
		return FR_EINVAL;
	}
	rc = fr_env_detect(fr_env_getenv, NULL, &l, create_err,
			   sizeof(create_err));
	if (rc)
		return rc;
	rc = resolve_settings(cfg, &s, create_err, sizeof(create_err));
	if (rc)
		return rc;
	s.rank = l.rank;
	s.nranks = l.nranks;
	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s", l.rendezvous);
	fr_dbg("rank %d/%d from %s, rendezvous %s", l.rank, l.nranks,
	       l.launcher, l.rendezvous);
	return comm_create(&s, comm, create_err, sizeof(create_err));
}

/*
 * Say goodbye to both neighbours and wait (bounded) for theirs, reading
 * and dropping whatever else arrives, so that no connection is closed while
 * the other side may still send on it: closing a TCP socket with unread
 * data resets it, and the reset can destroy a neighbour's last segments
 * still in flight.  A failed communicator waits less: its neighbours are
 * failing too, or dead.
 */
static void goodbye(struct fr_comm *c)
{
	uint64_t wait_ms = (uint64_t)(c->failed ? FR_MIN(c->timeout_ms, 2000) :
						  c->timeout_ms);
	uint64_t deadline = fr_now_ms() + wait_ms;
	bool sent_next = false, sent_prev = false;
	struct fr_tp_cqe cqe[32];

	while (fr_now_ms() < deadline) {
		int n;

		/* a neighbour already gone needs no goodbye */
		if (!sent_next)
			sent_next = c->next.bye || !fr_ring_send_bye(c, true);
		if (!sent_prev)
			sent_prev = c->prev.bye || !fr_ring_send_bye(c, false);
		n = c->tp_ops->poll(c->tp, cqe, 32);
		if (n < 0)
			break;
		for (int i = 0; i < n; i++)
			fr_ring_goodbye_cqe(c, &cqe[i]);
		if (sent_next && sent_prev && c->next.bye && c->prev.bye &&
		    c->outstanding <= 0)
			return;
		if (!n)
			c->tp_ops->wait(c->tp, 20);
	}
	fr_dbg("rank %d: goodbye incomplete", c->rank);
}

int fr_comm_destroy(fr_comm_t *comm)
{
	if (!comm)
		return 0;
	fr_requests_abandon(comm);
	if (comm->nranks > 1) {
		goodbye(comm);
		comm->tp_ops->close_conn(comm->prev.conn);
		comm->tp_ops->close_conn(comm->next.conn);
	}
	fr_mem_cache_flush(comm);
	free_areas(comm);
	comm->tp_ops->close(comm->tp);
	free(comm);
	return 0;
}

int fr_comm_rank(const fr_comm_t *comm)
{
	return comm ? comm->rank : FR_EINVAL;
}

int fr_comm_size(const fr_comm_t *comm)
{
	return comm ? comm->nranks : FR_EINVAL;
}

const char *fr_comm_transport(const fr_comm_t *comm)
{
	return comm ? comm->tp_ops->name : "?";
}

const char *fr_comm_last_error(const fr_comm_t *comm)
{
	return comm ? comm->errmsg : create_err;
}

int fr_comm_stats(const fr_comm_t *comm, fr_stats_t *stats)
{
	size_t n;

	if (!comm || !stats || stats->size < sizeof(size_t))
		return FR_EINVAL;
	n = FR_MIN(stats->size, sizeof(comm->stats));
	/* Copy only what the caller's version of the struct has room for. */
	memcpy((char *)stats + sizeof(size_t),
	       (const char *)&comm->stats + sizeof(size_t), n - sizeof(size_t));
	return 0;
}
