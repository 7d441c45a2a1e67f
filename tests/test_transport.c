/* SPDX-License-Identifier: MIT */
/*
 * test_transport.c - the transport conformance suite.
 *
 * Written against `const struct fr_tp_ops *` only, so the same tests run
 * against every transport: FR_TEST_TRANSPORT names it (default "tcp";
 * "fake" is the unit tests' in-process transport, tests/fake_tp.c, whose
 * endpoints cannot live in a child process).  A
 * transport whose probe() fails here is skipped (exit 77).  The mixed
 * transports (shm+tcp, shm+verbs) connect endpoints of one process through
 * shm; FR_TEST_MUX_NODES=1 gives every endpoint a node of its own
 * (FR_NODE), so that every pair goes through their network side.
 *
 * Most tests use two endpoints in this process, driven from one thread by
 * polling both; the peer-failure and wait() tests fork a child that owns
 * its own endpoint, so that it can really die or send while we sleep.
 * Every loop is bounded by DEADLINE_MS: a hang is a failure, not a stuck
 * test.  The last tests are white-box checks of the TCP wire format and are
 * skipped for other transports.
 *
 * Requirements checked beyond transport.h's own list:
 *   - address and key blobs are validated: truncated, extended, all-zero
 *     and all-0xff blobs are refused (so every blob needs a magic or
 *     version byte);
 *   - pack_rkey and open take *len / *addrlen as the buffer's capacity;
 *   - writes posted after a failed one never land (the connection is dead);
 *   - close_conn drops the connection's completions not yet polled.
 */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fake_tp.h"
#include "fastreduce.h"
#include "transport.h"

#define DEADLINE_MS 10000
#define NONCE 0x5eed1234abcd0001ull
#define MAX_EPS 32
#define MAX_BUFS 64
#define GUARD 4096
#define GUARD_BYTE 0xa5
#define KiB (1024u)
#define MiB (1024u * 1024u)

static const struct fr_tp_ops *ops;

/*
 * Transports that place a large write in the peer's memory without the
 * peer's help (the RDMA NIC; shared memory's cross-memory attach): such a
 * write can complete although the peer never polls, or dies right after.
 */
static bool mux_nodes; /* FR_TEST_MUX_NODES=1: see ep_open() */

/* Are writes carried by an RDMA adapter (its checks, its NAKs)? */
static bool over_verbs(void)
{
	return !strcmp(ops->name, "verbs") ||
	       (mux_nodes && !strcmp(ops->name, "shm+verbs"));
}

static bool one_sided(void)
{
	if (mux_nodes) /* every pair over the mixed transport's network */
		return !strcmp(ops->name, "shm+verbs");
	return !strcmp(ops->name, "verbs") || !strcmp(ops->name, "shm") ||
	       !strcmp(ops->name, "shm+tcp") || /* one process: all shm */
	       !strcmp(ops->name, "shm+verbs");
}

/* The unit tests' fake (FR_TEST_TRANSPORT=fake) reaches only endpoints
 * of this process: the tests whose peer is a child process skip. */
static bool in_process(void)
{
	return !strcmp(ops->name, "fake");
}

/* An endpoint and every completion polled from it, in order. */
struct ep {
	struct fr_tp *tp;
	int rank;
	uint8_t addr[FR_TP_ADDR_MAX];
	size_t addrlen;
	struct fr_tp_cqe *cq;
	size_t ncq, cap;
};

static struct ep eps[MAX_EPS];
static int neps;
static void *bufs[MAX_BUFS];
static int nbufs;

/* ---- helpers ---------------------------------------------------------------
 */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Memory freed at teardown, after the endpoints are closed. */
static void *tbuf(size_t len)
{
	void *p;

	assert_true(nbufs < MAX_BUFS);
	p = malloc(len ? len : 1);
	assert_non_null(p);
	bufs[nbufs++] = p;
	return p;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		if (!(i & 7)) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
		}
		p[i] = (uint8_t)(x >> ((i & 7) * 8));
	}
}

/* A buffer with GUARD bytes of GUARD_BYTE on both sides of p[0, len). */
struct gbuf {
	uint8_t *all;
	uint8_t *p;
	size_t len;
};

static struct gbuf gbuf_new(size_t len, uint8_t fillb)
{
	struct gbuf g;

	g.all = tbuf(len + 2 * GUARD);
	g.p = g.all + GUARD;
	g.len = len;
	memset(g.all, GUARD_BYTE, GUARD);
	memset(g.p, fillb, len);
	memset(g.p + len, GUARD_BYTE, GUARD);
	return g;
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t b)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != b)
			return false;
	return true;
}

static void check_guards(const struct gbuf *g)
{
	assert_true(all_bytes(g->all, GUARD, GUARD_BYTE));
	assert_true(all_bytes(g->p + g->len, GUARD, GUARD_BYTE));
}

static int ep_try_open(int rank, uint64_t nonce, const char *ip, int sq_depth,
		       int timeout_ms, struct ep **out)
{
	struct fr_tp_params p;
	char err[256] = "";
	struct ep *e;
	int rc;

	assert_true(neps < MAX_EPS);
	e = &eps[neps];
	memset(e, 0, sizeof(*e));
	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.rank = rank;
	p.job_nonce = nonce;
	p.local_ip = ip;
	p.timeout_ms = timeout_ms;
	p.sq_depth = sq_depth;
	p.errbuf = err;
	p.errlen = sizeof(err);
	e->addrlen = sizeof(e->addr);
	if (mux_nodes) {
		/* each endpoint a node of its own: the mixed transports then
		 * connect every pair through their network side */
		char node[32];

		snprintf(node, sizeof(node), "conformance-node-%d", neps);
		setenv("FR_NODE", node, 1);
	}
	rc = ops->open(&p, &e->tp, e->addr, &e->addrlen);
	if (rc) {
		print_message("open: %s\n", err);
		return rc;
	}
	assert_true(e->addrlen > 0 && e->addrlen <= FR_TP_ADDR_MAX);
	e->rank = rank;
	neps++;
	*out = e;
	return 0;
}

static struct ep *ep_open_ex(int rank, uint64_t nonce, int sq_depth,
			     int timeout_ms)
{
	struct ep *e = NULL;

	assert_int_equal(
		ep_try_open(rank, nonce, "127.0.0.1", sq_depth, timeout_ms, &e),
		0);
	return e;
}

static struct ep *ep_open(int rank)
{
	return ep_open_ex(rank, NONCE, 0, DEADLINE_MS);
}

static void ep_close(struct ep *e)
{
	if (e->tp)
		ops->close(e->tp);
	e->tp = NULL;
	free(e->cq);
	e->cq = NULL;
	e->ncq = e->cap = 0;
}

/* Poll one endpoint dry, recording its completions. */
static void drain(struct ep *e)
{
	struct fr_tp_cqe c[16];
	int n;

	do {
		n = ops->poll(e->tp, c, 16);
		assert_true(n >= 0 && n <= 16);
		if (!n)
			break;
		if (e->ncq + (size_t)n > e->cap) {
			e->cap = (e->cap + (size_t)n) * 2;
			e->cq = realloc(e->cq, e->cap * sizeof(*e->cq));
			assert_non_null(e->cq);
		}
		memcpy(e->cq + e->ncq, c, (size_t)n * sizeof(*c));
		e->ncq += (size_t)n;
	} while (n == 16);
}

static void pump(void)
{
	for (int i = 0; i < neps; i++)
		if (eps[i].tp)
			drain(&eps[i]);
}

static void pump_for(int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;

	while (now_ms() < end)
		pump();
}

#define PUMP_UNTIL(cond)                                                     \
	do {                                                                 \
		uint64_t dl_ = now_ms() + DEADLINE_MS;                       \
		while (!(cond)) {                                            \
			if (now_ms() > dl_)                                  \
				fail_msg("timed out waiting for %s", #cond); \
			pump();                                              \
		}                                                            \
	} while (0)

/* Completions on c: want 0 = successful, -1 = failed, 1 = any. */
static size_t count(const struct ep *e, const struct fr_tp_conn *c, int kind,
		    int want)
{
	size_t n = 0;

	for (size_t i = 0; i < e->ncq; i++) {
		const struct fr_tp_cqe *q = &e->cq[i];

		if (q->conn != c || (kind && q->kind != kind))
			continue;
		if (want == 1 || (want == 0 && !q->status) ||
		    (want == -1 && q->status < 0))
			n++;
	}
	return n;
}

static size_t n_ok(const struct ep *e, const struct fr_tp_conn *c, int kind)
{
	return count(e, c, kind, 0);
}

static size_t n_err(const struct ep *e, const struct fr_tp_conn *c)
{
	return count(e, c, 0, -1);
}

static int first_err(const struct ep *e, const struct fr_tp_conn *c)
{
	for (size_t i = 0; i < e->ncq; i++)
		if (e->cq[i].conn == c && e->cq[i].status < 0)
			return e->cq[i].status;
	return 0;
}

/* The idx-th successful completion of `kind` on c, or NULL. */
static const struct fr_tp_cqe *
nth_ok(const struct ep *e, const struct fr_tp_conn *c, int kind, size_t idx)
{
	for (size_t i = 0; i < e->ncq; i++) {
		const struct fr_tp_cqe *q = &e->cq[i];

		if (q->conn == c && q->kind == kind && !q->status && !idx--)
			return q;
	}
	return NULL;
}

static struct fr_tp_conn *accept_from(struct ep *e, int rank);

static void connect_pair(struct ep *a, struct ep *b, struct fr_tp_conn **ab,
			 struct fr_tp_conn **ba)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	int rc = FR_EAGAIN, ra;

	*ba = NULL;
	assert_int_equal(ops->connect(a->tp, b->rank, b->addr, b->addrlen, ab),
			 0);
	while (rc || !*ba) {
		if (rc) {
			rc = ops->connect_done(*ab);
			if (rc != FR_EAGAIN)
				assert_int_equal(rc, 0);
		}
		if (!*ba) {
			ra = ops->accept(b->tp, a->rank, ba);
			if (ra != FR_EAGAIN)
				assert_int_equal(ra, 0);
		}
		if (now_ms() > dl)
			fail_msg("connection %d -> %d not established", a->rank,
				 b->rank);
	}
	assert_int_equal(ops->connect_done(*ba), 0);
	assert_int_equal(ops->conn_peer(*ab), b->rank);
	assert_int_equal(ops->conn_peer(*ba), a->rank);
}

static struct fr_tp_mr *reg(struct ep *e, void *buf, size_t len, int access)
{
	struct fr_tp_mr *mr = NULL;

	assert_int_equal(ops->reg_mem(e->tp, buf, len, access, &mr), 0);
	assert_non_null(mr);
	return mr;
}

/* owner's key for mr, as `user` sees it. */
static struct fr_tp_rkey rkey_of(struct ep *owner, struct fr_tp_mr *mr,
				 struct ep *user)
{
	uint8_t blob[FR_TP_RKEY_MAX];
	size_t len = sizeof(blob);
	struct fr_tp_rkey rk;

	(void)owner;
	assert_int_equal(ops->pack_rkey(mr, blob, &len), 0);
	assert_true(len > 0 && len <= FR_TP_RKEY_MAX);
	memset(&rk, 0, sizeof(rk));
	assert_int_equal(ops->unpack_rkey(user->tp, blob, len, &rk), 0);
	return rk;
}

/* write_imm, polling through back-pressure. */
static void post(struct fr_tp_conn *c, struct fr_tp_mr *mr, size_t loff,
		 const struct fr_tp_rkey *rk, uint64_t roff, size_t len,
		 uint32_t imm, uint64_t ctx)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	int rc;

	while ((rc = ops->write_imm(c, mr, loff, rk, roff, len, imm, ctx)) ==
	       FR_EAGAIN) {
		if (now_ms() > dl)
			fail_msg("send queue never drained");
		pump();
	}
	assert_int_equal(rc, 0);
}

/* Bounded waitpid; a child that does not exit is killed and fails. */
static int reap(pid_t pid)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	int st = 0;

	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (now_ms() > dl) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("child %d did not exit", (int)pid);
		}
		sleep_ms(5);
	}
	return st;
}

/* Wait for one byte on fd without driving any endpoint. */
static char read_byte(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char ch = 0;

	if (poll(&p, 1, DEADLINE_MS) != 1 || read(fd, &ch, 1) != 1)
		fail_msg("no message from the child");
	return ch;
}

static int setup(void **state)
{
	neps = 0;
	nbufs = 0;
	return 0;
}

/* FR_TCP_RCVBUF as the suite started (a test may change it) */
static char *tcp_rcvbuf_env;

static int teardown(void **state)
{
	if (tcp_rcvbuf_env)
		setenv("FR_TCP_RCVBUF", tcp_rcvbuf_env, 1);
	else
		unsetenv("FR_TCP_RCVBUF");
	for (int i = 0; i < neps; i++)
		ep_close(&eps[i]);
	neps = 0;
	for (int i = 0; i < nbufs; i++)
		free(bufs[i]);
	nbufs = 0;
	return 0;
}

/* ---- establishment ------------------------------------------------------- */

static void test_handshake(void **state)
{
	struct fr_tp_conn *ab, *ba, *aa, *aa2, *x;
	struct ep *a = ep_open(0), *b = ep_open(1);
	char err[128] = "";
	uint64_t dl;
	int rc = FR_EAGAIN;

	assert_int_equal(ops->probe(err, sizeof(err)), 0);
	assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
	connect_pair(a, b, &ab, &ba);
	/* Each hello is handed out once, and only to the rank it names. */
	assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
	assert_int_equal(ops->accept(b->tp, 7, &x), FR_EAGAIN);
	assert_int_equal(ops->accept(a->tp, 1, &x), FR_EAGAIN);

	/* A one-rank ring connects an endpoint to itself. */
	aa2 = NULL;
	assert_int_equal(ops->connect(a->tp, 0, a->addr, a->addrlen, &aa), 0);
	dl = now_ms() + DEADLINE_MS;
	while (rc || !aa2) {
		if (rc) {
			rc = ops->connect_done(aa);
			if (rc != FR_EAGAIN)
				assert_int_equal(rc, 0);
		}
		if (!aa2 && ops->accept(a->tp, 0, &aa2) != FR_EAGAIN)
			assert_non_null(aa2);
		assert_true(now_ms() < dl);
	}
	assert_int_equal(ops->conn_peer(aa), 0);
	assert_int_equal(ops->conn_peer(aa2), 0);
	assert_ptr_not_equal(aa, aa2);

	/* Idle connections produce no completions. */
	pump_for(50);
	assert_int_equal(a->ncq, 0);
	assert_int_equal(b->ncq, 0);
	ops->close_conn(aa);
	ops->close_conn(aa2);
	ops->close_conn(ab);
	ops->close_conn(ba);
}

static void test_wrong_nonce(void **state)
{
	struct ep *b = ep_open_ex(1, NONCE, 0, DEADLINE_MS);
	struct ep *a = ep_open_ex(0, NONCE + 1, 0, DEADLINE_MS);
	struct ep *good;
	struct fr_tp_conn *ab, *x = NULL, *gb, *bg;
	uint64_t dl = now_ms() + DEADLINE_MS;
	int rc;

	assert_int_equal(ops->connect(a->tp, 1, b->addr, b->addrlen, &ab), 0);
	while ((rc = ops->connect_done(ab)) == FR_EAGAIN) {
		assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
		if (now_ms() > dl)
			fail_msg("the refusal never came");
	}
	assert_int_equal(rc, FR_EAUTH);
	pump_for(50);
	assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
	/* Later operations on the refused connection fail too. */
	assert_true(ops->write_imm(ab, NULL, 0, NULL, 0, 0, 1, 1) < 0);
	assert_true(ops->write_imm(ab, NULL, 0, NULL, 0, 0, 1, 1) != FR_EAGAIN);
	ops->close_conn(ab);

	/* The endpoint still takes a genuine rank 0 afterwards. */
	good = ep_open(0);
	connect_pair(good, b, &gb, &bg);
}

static void test_connect_refused_times_out(void **state)
{
	struct ep *x = ep_open(1), *a;
	uint8_t addr[FR_TP_ADDR_MAX];
	size_t addrlen = x->addrlen;
	struct fr_tp_conn *c;
	uint64_t t0, dl;
	int rc;

	/* An address where nothing listens any more. */
	memcpy(addr, x->addr, addrlen);
	ep_close(x);
	a = ep_open_ex(0, NONCE, 0, 400);
	t0 = now_ms();
	dl = t0 + DEADLINE_MS;
	assert_int_equal(ops->connect(a->tp, 1, addr, addrlen, &c), 0);
	while ((rc = ops->connect_done(c)) == FR_EAGAIN) {
		assert_int_equal(ops->wait(a->tp, 50), 0);
		if (now_ms() > dl)
			fail_msg("connect_done never gave up");
	}
	/* It kept retrying until the timeout, then said so. */
	assert_true(rc == FR_ETIMEDOUT || rc == FR_EPEER);
	assert_true(now_ms() - t0 >= 300);
	ops->close_conn(c);
}

static void test_duplicate_rank(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1), *imposter = ep_open(0);
	struct fr_tp_conn *ab, *ba, *ib, *x = NULL;
	uint8_t *src = tbuf(8), *dst = tbuf(8);
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	uint64_t dl = now_ms() + DEADLINE_MS;
	int rc;

	connect_pair(a, b, &ab, &ba);
	assert_int_equal(
		ops->connect(imposter->tp, 1, b->addr, b->addrlen, &ib), 0);
	while ((rc = ops->connect_done(ib)) == FR_EAGAIN) {
		assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
		if (now_ms() > dl)
			fail_msg("the duplicate was never refused");
	}
	assert_true(rc < 0);
	assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);

	/* The original connection is unharmed. */
	fill(src, 8, 1);
	memset(dst, 0, 8);
	smr = reg(a, src, 8, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 8, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	post(ab, smr, 0, &rk, 0, 8, 11, 12);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1);
	assert_memory_equal(dst, src, 8);
	assert_int_equal(n_err(b, ba), 0);
}

/*
 * The connector may write as soon as connect_done() says 0, before the
 * acceptor has called accept(): nothing may surface on the acceptor naming
 * a connection it does not know yet, and nothing may be lost.
 */
static void test_write_before_accept(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *src = tbuf(4 * KiB), *dst = tbuf(4 * KiB);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;

	fill(src, 4 * KiB, 31);
	memset(dst, 0, 4 * KiB);
	smr = reg(a, src, 4 * KiB, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 4 * KiB, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	assert_int_equal(ops->connect(a->tp, 1, b->addr, b->addrlen, &ab), 0);
	PUMP_UNTIL(ops->connect_done(ab) == 0);
	post(ab, smr, 0, &rk, 0, 4 * KiB, 0x99, 1);
	post(ab, NULL, 0, NULL, 0, 0, 0x9a, 2);
	pump_for(100);
	assert_int_equal(b->ncq, 0);
	ba = accept_from(b, 0);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 2);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 0)->imm, 0x99);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 1)->imm, 0x9a);
	assert_memory_equal(dst, src, 4 * KiB);
	for (size_t i = 0; i < b->ncq; i++)
		assert_ptr_equal(b->cq[i].conn, ba);
}

/*
 * pending() names the ranks whose connections wait for accept(), so that
 * the core can take one it does not need yet; once accepted (or before the
 * handshake is done) they are not listed.
 */
static void test_pending(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1), *c = ep_open(2);
	struct fr_tp_conn *ab, *cb, *ba, *x = NULL;
	int q[4] = {-1, -1, -1, -1}, n;

	if (!ops->pending)
		skip();
	assert_int_equal(ops->pending(b->tp, q, 4), 0);
	assert_int_equal(ops->connect(a->tp, 1, b->addr, b->addrlen, &ab), 0);
	assert_int_equal(ops->connect(c->tp, 1, b->addr, b->addrlen, &cb), 0);
	PUMP_UNTIL(ops->connect_done(ab) == 0 && ops->connect_done(cb) == 0 &&
		   ops->pending(b->tp, q, 4) == 2);
	assert_true((q[0] == 0 && q[1] == 2) || (q[0] == 2 && q[1] == 0));
	/* room for one: one */
	assert_int_equal(ops->pending(b->tp, q, 1), 1);
	assert_true(q[0] == 0 || q[0] == 2);
	assert_int_equal(ops->pending(b->tp, q, 0), 0);
	/* accepted: no longer pending */
	ba = accept_from(b, 2);
	n = ops->pending(b->tp, q, 4);
	assert_int_equal(n, 1);
	assert_int_equal(q[0], 0);
	ba = accept_from(b, 0);
	assert_int_equal(ops->pending(b->tp, q, 4), 0);
	assert_int_equal(ops->accept(b->tp, 0, &x), FR_EAGAIN);
	(void)ba;
}

/* ---- data path -------------------------------------------------------------
 */

static void test_write_sizes(void **state)
{
	static const size_t sizes[] = {8, 64 * KiB, 8 * MiB};
	struct ep *a = ep_open(0), *b = ep_open(1);
	struct fr_tp_conn *ab, *ba;

	connect_pair(a, b, &ab, &ba);
	for (size_t k = 0; k < 3; k++) {
		size_t len = sizes[k], loff = 7, roff = 33;
		uint8_t *src = tbuf(len + 64);
		struct gbuf dst = gbuf_new(len + 128, 0);
		struct fr_tp_mr *smr, *dmr;
		const struct fr_tp_cqe *q;
		struct fr_tp_rkey rk;

		fill(src, len + 64, k + 1);
		smr = reg(a, src, len + 64, FR_TP_LOCAL_READ);
		dmr = reg(b, dst.p, dst.len,
			  FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		rk = rkey_of(b, dmr, a);
		post(ab, smr, loff, &rk, roff, len, 0x1000 + (uint32_t)k,
		     0xc0ffee00 + k);
		PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == k + 1 &&
			   n_ok(a, ab, FR_CQE_SEND) == k + 1);
		q = nth_ok(b, ba, FR_CQE_RECV, k);
		assert_int_equal(q->imm, 0x1000 + k);
		assert_int_equal(q->len, len);
		assert_memory_equal(dst.p + roff, src + loff, len);
		assert_true(all_bytes(dst.p, roff, 0));
		assert_true(
			all_bytes(dst.p + roff + len, dst.len - roff - len, 0));
		check_guards(&dst);
		q = nth_ok(a, ab, FR_CQE_SEND, k);
		assert_int_equal(q->ctx, 0xc0ffee00 + k);
		assert_int_equal(ops->dereg_mem(a->tp, smr), 0);
		assert_int_equal(ops->dereg_mem(b->tp, dmr), 0);
	}
	assert_int_equal(n_err(a, ab), 0);
	assert_int_equal(n_err(b, ba), 0);
}

static void test_zero_length(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	struct fr_tp_conn *ab, *ba;
	struct gbuf dst = gbuf_new(16, 0x11);
	uint8_t *src = tbuf(16);
	const struct fr_tp_cqe *q;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;

	connect_pair(a, b, &ab, &ba);
	post(ab, NULL, 0, NULL, 0, 0, 0xdeadbeef, 77);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1 &&
		   n_ok(a, ab, FR_CQE_SEND) == 1);
	q = nth_ok(b, ba, FR_CQE_RECV, 0);
	assert_int_equal(q->imm, 0xdeadbeef);
	assert_int_equal(q->len, 0);
	assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, 0)->ctx, 77);

	/* With real regions, len 0 still moves no bytes. */
	memset(src, 0x22, 16);
	smr = reg(a, src, 16, FR_TP_LOCAL_READ);
	dmr = reg(b, dst.p, 16, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	post(ab, smr, 4, &rk, 8, 0, 0xfeed, 78);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 2);
	q = nth_ok(b, ba, FR_CQE_RECV, 1);
	assert_int_equal(q->imm, 0xfeed);
	assert_int_equal(q->len, 0);
	assert_true(all_bytes(dst.p, 16, 0x11));
	check_guards(&dst);
}

/*
 * write_inline (optional; skipped where NULL): writes of 1 ..
 * FR_TP_INLINE_MAX bytes from unregistered memory, mixed with write_imm
 * writes on one connection (256 bytes, and 20 KiB: several shm slots, a
 * striped write where FR_IB_STRIPE_BYTES is small), land in place and
 * complete in the order posted, and only the write_imm ones give SEND
 * completions (those with ctx 0 too: on verbs an unsignalled write
 * followed only by inline writes still needs its fence).  One refused
 * with FR_EAGAIN goes by write_imm, as the peer layer does.  Bad
 * arguments are refused; one outside the receiver's region fails the
 * connection with FR_ERANGE and writes nothing; later ones fail.
 */
static void test_write_inline(void **state)
{
	enum { N = 400, SLOT = 24 * 1024 };
	struct ep *a, *b;
	uint8_t *src = tbuf((size_t)N * SLOT), tmp[FR_TP_INLINE_MAX + 1];
	struct gbuf dst = gbuf_new((size_t)N * SLOT, 0);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	size_t nimm = 0, ninl = 0, len[N];
	uint64_t ctx[N];
	int rc;

	if (!ops->write_inline)
		skip();
	a = ep_open(0);
	b = ep_open(1);
	connect_pair(a, b, &ab, &ba);
	fill(src, (size_t)N * SLOT, 77);
	smr = reg(a, src, (size_t)N * SLOT, FR_TP_LOCAL_READ);
	dmr = reg(b, dst.p, dst.len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	for (uint32_t i = 0; i < N; i++) {
		uint8_t *p = src + (size_t)i * SLOT;

		len[i] = i % 14 == 6	? 256
			 : i % 14 == 13 ? 20 * 1024 + i
					: i % FR_TP_INLINE_MAX + 1;
		if (len[i] <= FR_TP_INLINE_MAX) {
			/* from a copy on the stack: any memory will do */
			memcpy(tmp, p, len[i]);
			rc = ops->write_inline(ab, tmp, &rk, (uint64_t)i * SLOT,
					       len[i], i);
			memset(tmp, 0, sizeof(tmp)); /* copied already */
			if (!rc) {
				ninl++;
				continue;
			}
			assert_int_equal(rc, FR_EAGAIN);
		}
		ctx[nimm] = nimm % 3 ? 5000u + nimm : 0;
		post(ab, smr, (size_t)i * SLOT, &rk, (uint64_t)i * SLOT, len[i],
		     i, ctx[nimm]);
		nimm++;
		/* seldom enough that queues fill: inline writes then wait
		 * their turn (FR_EAGAIN) behind queued ones */
		if (i % 100 == 0)
			pump();
	}
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == N &&
		   n_ok(a, ab, FR_CQE_SEND) == nimm);
	/* the mixed transport's network side may have no inline writes
	 * (TCP): all of them then go by write_imm */
	if (!mux_nodes)
		assert_true(ninl > 0);
	for (uint32_t i = 0; i < N; i++) {
		const struct fr_tp_cqe *r = nth_ok(b, ba, FR_CQE_RECV, i);

		assert_int_equal(r->imm, i);
		assert_int_equal(r->len, len[i]);
		assert_memory_equal(dst.p + (size_t)i * SLOT,
				    src + (size_t)i * SLOT, len[i]);
		assert_true(all_bytes(dst.p + (size_t)i * SLOT + len[i],
				      SLOT - len[i], 0));
	}
	for (size_t k = 0; k < nimm; k++)
		assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, k)->ctx, ctx[k]);
	pump_for(20);
	assert_int_equal(n_ok(a, ab, FR_CQE_SEND), nimm);
	check_guards(&dst);
	assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);

	/* bad arguments: refused, the connection stays usable */
	assert_int_equal(ops->write_inline(ab, tmp, &rk, 0, 0, 1), FR_EINVAL);
	assert_int_equal(
		ops->write_inline(ab, tmp, &rk, 0, FR_TP_INLINE_MAX + 1, 1),
		FR_EINVAL);
	assert_int_equal(ops->write_inline(ab, NULL, &rk, 0, 4, 1), FR_EINVAL);
	assert_int_equal(ops->write_inline(ab, tmp, NULL, 0, 4, 1), FR_EINVAL);
	assert_int_equal(ops->write_inline(NULL, tmp, &rk, 0, 4, 1), FR_EINVAL);
	if (!ninl)
		return; /* it never takes inline writes on this connection */

	/* a write with ctx 0, then inline writes only, then idle: its SEND
	 * completion still comes, and every write lands */
	post(ab, smr, 0, &rk, 0, 64, 7777, 0);
	for (uint32_t k = 0; k < 3; k++)
		PUMP_UNTIL((rc = ops->write_inline(ab, src + 64 + 8 * k, &rk,
						   64 + 8 * k, 8, 7778 + k)) !=
			   FR_EAGAIN);
	assert_int_equal(rc, 0);
	PUMP_UNTIL(n_ok(a, ab, FR_CQE_SEND) == nimm + 1 &&
		   n_ok(b, ba, FR_CQE_RECV) == N + 4);
	assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, nimm)->ctx, 0);
	for (uint32_t k = 0; k < 4; k++)
		assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, N + k)->imm,
				 7777 + k);
	assert_memory_equal(dst.p, src, 88);
	pump_for(20);
	assert_int_equal(n_ok(a, ab, FR_CQE_SEND), nimm + 1);

	/* past the end of the receiver's region: nothing written */
	memset(tmp, 0x77, sizeof(tmp));
	PUMP_UNTIL((rc = ops->write_inline(ab, tmp, &rk, dst.len - 4, 8, 9)) !=
		   FR_EAGAIN);
	if (!over_verbs()) {
		assert_int_equal(rc, 0);
		PUMP_UNTIL(n_err(b, ba) >= 1);
		assert_int_equal(first_err(b, ba), FR_ERANGE);
		PUMP_UNTIL(n_err(a, ab) >= 1);
	} else {
		/* the key carries the length: refused before posting */
		assert_int_equal(rc, FR_ERANGE);
	}
	assert_int_equal(n_ok(b, ba, FR_CQE_RECV), N + 4);
	check_guards(&dst);
	assert_true(all_bytes(dst.p + dst.len - 4, 4, 0));
	if (!over_verbs()) {
		rc = ops->write_inline(ab, tmp, &rk, 0, 4, 1);
		assert_true(rc < 0 && rc != FR_EAGAIN);
	}
}

/*
 * Lines (optional; skipped where the transport has none, or where the
 * mixed transport's pair is over its network): numbers 1 .. N go back and
 * forth, each of another length, so that both lines of each direction
 * are reused many times; a get sees exactly the put of its number (never
 * the other line's, never the line's previous number), copies at most the
 * bytes asked for and returns the count put; lines make no completions;
 * a wait returns at once for a line a get waits for; bad arguments are
 * refused; and a line put before its connection closed is still read.
 */
static void test_lines(void **state)
{
	enum { N = 2000 };
	struct ep *a, *b;
	struct fr_tp_conn *ab, *ba;
	uint8_t out[FR_TP_LINE_MAX], in[FR_TP_LINE_MAX + 8];
	size_t max;
	uint64_t t0;
	int rc;

	if (!ops->line_put || mux_nodes)
		skip();
	a = ep_open(0);
	b = ep_open(1);
	max = ops->line_bytes(a->tp);
	if (!max)
		skip();
	assert_true(max <= FR_TP_LINE_MAX);
	connect_pair(a, b, &ab, &ba);
	assert_int_equal(ops->line_get(ba, 1, in, sizeof(in)), 0);
	for (uint64_t seq = 1; seq <= N; seq++) {
		struct fr_tp_conn *tx = seq & 2 ? ba : ab,
				  *rx = seq & 2 ? ab : ba;
		size_t len = 1 + (seq * 37) % max;

		for (size_t i = 0; i < len; i++)
			out[i] = (uint8_t)(seq * 131 + i);
		/* the number after: not there yet, whatever its line holds */
		assert_int_equal(ops->line_get(rx, seq, in, sizeof(in)), 0);
		PUMP_UNTIL((rc = ops->line_put(tx, seq, out, len)) !=
			   FR_EAGAIN);
		assert_int_equal(rc, 0);
		memset(out, 0, len); /* copied by the put */
		memset(in, 0xee, sizeof(in));
		PUMP_UNTIL((rc = ops->line_get(rx, seq, in, sizeof(in))) != 0);
		assert_int_equal(rc, (int)len);
		for (size_t i = 0; i < len; i++)
			assert_int_equal(in[i], (uint8_t)(seq * 131 + i));
		assert_int_equal(in[len], 0xee);
		assert_int_equal(ops->line_get(rx, seq + 1, in, sizeof(in)), 0);
		/* the lines of the other direction never hold it */
		assert_int_equal(ops->line_get(tx, seq, in, sizeof(in)), 0);
	}
	/* fewer bytes asked for than put: those, and the count put */
	memset(out, 0x5a, max);
	assert_int_equal(ops->line_put(ab, N + 1, out, max), 0);
	memset(in, 0, sizeof(in));
	PUMP_UNTIL((rc = ops->line_get(ba, N + 1, in, 3)) != 0);
	assert_int_equal(rc, (int)max);
	assert_true(all_bytes(in, 3, 0x5a));
	assert_true(all_bytes(in + 3, sizeof(in) - 3, 0));
	/* no completion came of any of it */
	pump_for(20);
	assert_int_equal(n_ok(a, ab, FR_CQE_RECV) + n_ok(a, ab, FR_CQE_SEND) +
				 n_ok(b, ba, FR_CQE_RECV) +
				 n_ok(b, ba, FR_CQE_SEND) + n_err(a, ab) +
				 n_err(b, ba),
			 0);
	/* a wait for a line that came returns at once */
	assert_int_equal(ops->line_get(ba, N + 2, in, sizeof(in)), 0);
	assert_int_equal(ops->line_put(ab, N + 2, out, 8), 0);
	t0 = now_ms();
	assert_int_equal(ops->wait(b->tp, 5000), 0);
	assert_true(now_ms() - t0 < 2000);
	assert_int_equal(ops->line_get(ba, N + 2, in, sizeof(in)), 8);
	/* bad arguments */
	assert_int_equal(ops->line_put(ab, N + 3, out, 0), FR_EINVAL);
	assert_int_equal(ops->line_put(ab, N + 3, out, max + 1), FR_EINVAL);
	assert_int_equal(ops->line_put(ab, 0, out, 8), FR_EINVAL);
	assert_int_equal(ops->line_put(ab, N + 3, NULL, 8), FR_EINVAL);
	assert_int_equal(ops->line_put(NULL, N + 3, out, 8), FR_EINVAL);
	assert_int_equal(ops->line_get(ba, 0, in, 8), FR_EINVAL);
	assert_int_equal(ops->line_get(NULL, N + 3, in, 8), FR_EINVAL);
	/* put, then gone: the line is still read, the next number fails */
	assert_int_equal(ops->line_put(ab, N + 3, out, 8), 0);
	ops->close_conn(ab);
	PUMP_UNTIL(n_err(b, ba) >= 1);
	assert_int_equal(ops->line_get(ba, N + 3, in, sizeof(in)), 8);
	rc = ops->line_get(ba, N + 4, in, sizeof(in));
	assert_true(rc < 0);
	assert_true(ops->line_put(ba, N + 4, out, 8) < 0);
}

/* Set or unset an environment variable (NULL: unset). */
static void env_set(const char *name, const char *v)
{
	if (v)
		assert_int_equal(setenv(name, v, 1), 0);
	else
		unsetenv(name);
}

/*
 * verbs, FR_IB_QPS and FR_IB_STRIPE_BYTES: bad values fail open() with
 * FR_EINVAL; two endpoints with different FR_IB_QPS (read at open) agree
 * on the smaller number, and a burst of striped and whole writes both
 * ways arrives intact, in order, with whole lengths.
 */
static void test_verbs_qps(void **state)
{
	static const char *const bad_qps[] = {"0", "9", "-1", "x", "2x"};
	static const char *const bad_stripe[] = {"0", "2G", "abc", "1Q"};
	static const char *const pairs[][2] = {
		{"4", "1"}, {"1", "3"}, {"2", "4"}, {"3", "3"}, {"8", "8"}};
	static const size_t sizes[] = {64 * KiB, 8, 1 * MiB + 3, 0,
				       300 * KiB, 4096, 4095, 2 * MiB};
	enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
	char *old_q = getenv("FR_IB_QPS"),
	     *old_s = getenv("FR_IB_STRIPE_BYTES");
	struct ep *e;
	size_t k, total = 0, off[NS];

	(void)state;
	if (strcmp(ops->name, "verbs"))
		skip();
	old_q = old_q ? strdup(old_q) : NULL;
	old_s = old_s ? strdup(old_s) : NULL;
	for (k = 0; k < NS; k++) {
		off[k] = total;
		total += sizes[k] + 64;
	}
	env_set("FR_IB_STRIPE_BYTES", NULL);
	for (k = 0; k < sizeof(bad_qps) / sizeof(bad_qps[0]); k++) {
		env_set("FR_IB_QPS", bad_qps[k]);
		assert_int_equal(
			ep_try_open(0, NONCE, "127.0.0.1", 0, DEADLINE_MS, &e),
			FR_EINVAL);
	}
	env_set("FR_IB_QPS", NULL);
	for (k = 0; k < sizeof(bad_stripe) / sizeof(bad_stripe[0]); k++) {
		env_set("FR_IB_STRIPE_BYTES", bad_stripe[k]);
		assert_int_equal(
			ep_try_open(0, NONCE, "127.0.0.1", 0, DEADLINE_MS, &e),
			FR_EINVAL);
	}
	env_set("FR_IB_STRIPE_BYTES", "4K");
	for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
		struct ep *a, *b;
		struct fr_tp_conn *ab, *ba;
		uint8_t *src = tbuf(total);
		struct gbuf da = gbuf_new(total, 0), db = gbuf_new(total, 0);
		struct fr_tp_mr *sa, *sb, *ma, *mb;
		struct fr_tp_rkey ka, kb;

		env_set("FR_IB_QPS", pairs[p][0]);
		a = ep_open(0);
		env_set("FR_IB_QPS", pairs[p][1]);
		b = ep_open(1);
		connect_pair(a, b, &ab, &ba);
		fill(src, total, 70 + p);
		sa = reg(a, src, total, FR_TP_LOCAL_READ);
		sb = reg(b, src, total, FR_TP_LOCAL_READ);
		ma = reg(a, da.p, total,
			 FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		mb = reg(b, db.p, total,
			 FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		kb = rkey_of(b, mb, a);
		ka = rkey_of(a, ma, b);
		/* Give the connector's lanes-ready message time to arrive,
		 * so that the acceptor stripes too. */
		pump_for(100);
		for (k = 0; k < NS; k++) {
			post(ab, sa, off[k], &kb, off[k], sizes[k],
			     (uint32_t)(100 + k), 500 + k);
			post(ba, sb, off[k], &ka, off[k], sizes[k],
			     (uint32_t)(200 + k), 600 + k);
		}
		PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == NS &&
			   n_ok(a, ab, FR_CQE_RECV) == NS &&
			   n_ok(a, ab, FR_CQE_SEND) == NS &&
			   n_ok(b, ba, FR_CQE_SEND) == NS);
		for (k = 0; k < NS; k++) {
			const struct fr_tp_cqe *q;

			q = nth_ok(b, ba, FR_CQE_RECV, k);
			assert_int_equal(q->imm, 100 + k);
			assert_int_equal(q->len, sizes[k]);
			q = nth_ok(a, ab, FR_CQE_RECV, k);
			assert_int_equal(q->imm, 200 + k);
			assert_int_equal(q->len, sizes[k]);
			assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, k)->ctx,
					 500 + k);
			assert_int_equal(nth_ok(b, ba, FR_CQE_SEND, k)->ctx,
					 600 + k);
			assert_memory_equal(db.p + off[k], src + off[k],
					    sizes[k]);
			assert_memory_equal(da.p + off[k], src + off[k],
					    sizes[k]);
			assert_true(all_bytes(db.p + off[k] + sizes[k], 64, 0));
			assert_true(all_bytes(da.p + off[k] + sizes[k], 64, 0));
		}
		check_guards(&da);
		check_guards(&db);
		assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
		ep_close(a);
		ep_close(b);
	}
	env_set("FR_IB_QPS", old_q);
	env_set("FR_IB_STRIPE_BYTES", old_s);
	free(old_q);
	free(old_s);
}

/*
 * verbs, a connection that fails and resumes (fr_verbs.c, "Link flaps"):
 * bad FR_IB_FAULT / FR_IB_STALL_MS values fail open() with FR_EINVAL;
 * with FR_IB_FAULT=0:n rank 0 stops its QPs at every n-th write, and a
 * burst of write_imm (whole and striped over 2 QPs) and write_inline both
 * ways still arrives exactly once each, in order, intact, every write_imm
 * completing once with its ctx, in order, and no error anywhere.
 */
static void test_verbs_resume(void **state)
{
	static const char *const bad_fault[] = {"1",   "x:3",  "1:0",
						"1:x", "-1:2", "1:2x"};
	static const char *const bad_stall[] = {"x", "-1", "1e3"};
	static const char *const every[] = {"7", "1"};
	enum { N = 240, SLOT = 24 * 1024 };
	char *old_f = getenv("FR_IB_FAULT"), *old_q = getenv("FR_IB_QPS"),
	     *old_s = getenv("FR_IB_STRIPE_BYTES");
	struct ep *e;
	size_t k;

	(void)state;
	if (strcmp(ops->name, "verbs"))
		skip();
	old_f = old_f ? strdup(old_f) : NULL;
	old_q = old_q ? strdup(old_q) : NULL;
	old_s = old_s ? strdup(old_s) : NULL;
	for (k = 0; k < sizeof(bad_fault) / sizeof(bad_fault[0]); k++) {
		env_set("FR_IB_FAULT", bad_fault[k]);
		assert_int_equal(
			ep_try_open(0, NONCE, "127.0.0.1", 0, DEADLINE_MS, &e),
			FR_EINVAL);
	}
	env_set("FR_IB_FAULT", NULL);
	for (k = 0; k < sizeof(bad_stall) / sizeof(bad_stall[0]); k++) {
		env_set("FR_IB_STALL_MS", bad_stall[k]);
		assert_int_equal(
			ep_try_open(0, NONCE, "127.0.0.1", 0, DEADLINE_MS, &e),
			FR_EINVAL);
	}
	env_set("FR_IB_STALL_MS", NULL);
	env_set("FR_IB_QPS", "2");
	env_set("FR_IB_STRIPE_BYTES", "4K");
	for (size_t p = 0; p < sizeof(every) / sizeof(every[0]); p++) {
		char fault[16];
		struct ep *a, *b;
		struct fr_tp_conn *ab, *ba;
		uint8_t *src = tbuf((size_t)N * SLOT);
		struct gbuf da = gbuf_new((size_t)N * SLOT, 0),
			    db = gbuf_new((size_t)N * SLOT, 0);
		struct fr_tp_mr *sa, *sb, *ma, *mb;
		struct fr_tp_rkey ka, kb;
		size_t len[N], nimm = 0;
		uint64_t ctx[N];

		snprintf(fault, sizeof(fault), "0:%s", every[p]);
		env_set("FR_IB_FAULT", fault);
		a = ep_open(0);
		b = ep_open(1);
		env_set("FR_IB_FAULT", NULL);
		connect_pair(a, b, &ab, &ba);
		fill(src, (size_t)N * SLOT, 90 + p);
		sa = reg(a, src, (size_t)N * SLOT, FR_TP_LOCAL_READ);
		sb = reg(b, src, (size_t)N * SLOT, FR_TP_LOCAL_READ);
		ma = reg(a, da.p, da.len,
			 FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		mb = reg(b, db.p, db.len,
			 FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		kb = rkey_of(b, mb, a);
		ka = rkey_of(a, ma, b);
		pump_for(100);
		for (uint32_t i = 0; i < N; i++) {
			size_t o = (size_t)i * SLOT;
			int rc = FR_EAGAIN;

			len[i] = i % 5 == 1   ? 20 * 1024 + i
				 : i % 5 == 3 ? 300 + i
					      : i % FR_TP_INLINE_MAX + 1;
			if (len[i] <= FR_TP_INLINE_MAX && ops->write_inline)
				rc = ops->write_inline(ab, src + o, &kb, o,
						       len[i], i);
			assert_true(rc == 0 || rc == FR_EAGAIN);
			if (rc) {
				ctx[nimm++] = 7000u + i;
				post(ab, sa, o, &kb, o, len[i], i, 7000u + i);
			}
			post(ba, sb, o, &ka, o, len[i], 1000u + i, 9000u + i);
			if (i % 16 == 0)
				pump();
		}
		PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) >= N &&
			   n_ok(a, ab, FR_CQE_RECV) >= N &&
			   n_ok(a, ab, FR_CQE_SEND) >= nimm &&
			   n_ok(b, ba, FR_CQE_SEND) >= N);
		pump_for(50);
		assert_int_equal(n_ok(b, ba, FR_CQE_RECV), N);
		assert_int_equal(n_ok(a, ab, FR_CQE_RECV), N);
		assert_int_equal(n_ok(a, ab, FR_CQE_SEND), nimm);
		assert_int_equal(n_ok(b, ba, FR_CQE_SEND), N);
		for (uint32_t i = 0; i < N; i++) {
			size_t o = (size_t)i * SLOT;
			const struct fr_tp_cqe *q =
				nth_ok(b, ba, FR_CQE_RECV, i);

			assert_int_equal(q->imm, i);
			assert_int_equal(q->len, len[i]);
			q = nth_ok(a, ab, FR_CQE_RECV, i);
			assert_int_equal(q->imm, 1000u + i);
			assert_int_equal(q->len, len[i]);
			assert_int_equal(nth_ok(b, ba, FR_CQE_SEND, i)->ctx,
					 9000u + i);
			assert_memory_equal(db.p + o, src + o, len[i]);
			assert_memory_equal(da.p + o, src + o, len[i]);
			assert_true(
				all_bytes(db.p + o + len[i], SLOT - len[i], 0));
			assert_true(
				all_bytes(da.p + o + len[i], SLOT - len[i], 0));
		}
		for (k = 0; k < nimm; k++)
			assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, k)->ctx,
					 ctx[k]);
		check_guards(&da);
		check_guards(&db);
		assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
		ep_close(a);
		ep_close(b);
	}
	env_set("FR_IB_FAULT", old_f);
	env_set("FR_IB_QPS", old_q);
	env_set("FR_IB_STRIPE_BYTES", old_s);
	free(old_f);
	free(old_q);
	free(old_s);
}

static void test_fifo_many(void **state)
{
	enum { N = 2000, SLOT = 2048 };
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *src = tbuf((size_t)N * SLOT);
	struct gbuf dst = gbuf_new((size_t)N * SLOT, 0);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;

	connect_pair(a, b, &ab, &ba);
	fill(src, (size_t)N * SLOT, 42);
	smr = reg(a, src, (size_t)N * SLOT, FR_TP_LOCAL_READ);
	dmr = reg(b, dst.p, dst.len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	for (uint32_t i = 0; i < N; i++) {
		size_t len = i % 10 == 9 ? 0 : (i * 37u) % SLOT + 1;

		post(ab, smr, (size_t)i * SLOT, &rk, (uint64_t)i * SLOT, len, i,
		     1000000u + i);
	}
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == N &&
		   n_ok(a, ab, FR_CQE_SEND) == N);
	for (uint32_t i = 0; i < N; i++) {
		size_t len = i % 10 == 9 ? 0 : (i * 37u) % SLOT + 1;
		const struct fr_tp_cqe *r = nth_ok(b, ba, FR_CQE_RECV, i);
		const struct fr_tp_cqe *s = nth_ok(a, ab, FR_CQE_SEND, i);

		assert_int_equal(r->imm, i);
		assert_int_equal(r->len, len);
		assert_int_equal(s->ctx, 1000000u + i);
		assert_memory_equal(dst.p + (size_t)i * SLOT,
				    src + (size_t)i * SLOT, len);
		assert_true(all_bytes(dst.p + (size_t)i * SLOT + len,
				      SLOT - len, 0));
	}
	check_guards(&dst);
	assert_int_equal(n_err(b, ba), 0);
}

static void test_bidirectional(void **state)
{
	enum { N = 200, SMALL = 16 * KiB };
	const size_t big = 4 * MiB, total = (size_t)N * SMALL + big;
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *sa = tbuf(total), *sb = tbuf(total);
	uint8_t *da = tbuf(total), *db = tbuf(total);
	struct fr_tp_mr *msa, *msb, *mda, *mdb;
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_rkey to_b, to_a;

	connect_pair(a, b, &ab, &ba);
	fill(sa, total, 7);
	fill(sb, total, 8);
	memset(da, 0, total);
	memset(db, 0, total);
	msa = reg(a, sa, total, FR_TP_LOCAL_READ);
	msb = reg(b, sb, total, FR_TP_LOCAL_READ);
	mda = reg(a, da, total, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	mdb = reg(b, db, total, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	to_b = rkey_of(b, mdb, a);
	to_a = rkey_of(a, mda, b);
	/* The big ones first, so that small ones queue behind them. */
	post(ab, msa, 0, &to_b, 0, big, 0xb16, 0);
	post(ba, msb, 0, &to_a, 0, big, 0xb16, 0);
	for (uint32_t i = 0; i < N; i++) {
		size_t off = big + (size_t)i * SMALL;

		post(ab, msa, off, &to_b, off, SMALL, i, i + 1);
		post(ba, msb, off, &to_a, off, SMALL, i, i + 1);
	}
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == N + 1 &&
		   n_ok(a, ab, FR_CQE_RECV) == N + 1 &&
		   n_ok(a, ab, FR_CQE_SEND) == N + 1 &&
		   n_ok(b, ba, FR_CQE_SEND) == N + 1);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 0)->imm, 0xb16);
	assert_int_equal(nth_ok(a, ab, FR_CQE_RECV, 0)->imm, 0xb16);
	for (uint32_t i = 0; i < N; i++) {
		assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, i + 1)->imm, i);
		assert_int_equal(nth_ok(a, ab, FR_CQE_RECV, i + 1)->imm, i);
		assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, i + 1)->ctx, i + 1);
		assert_int_equal(nth_ok(b, ba, FR_CQE_SEND, i + 1)->ctx, i + 1);
	}
	assert_memory_equal(db, sa, total);
	assert_memory_equal(da, sb, total);
	assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
}

/*
 * tcp, FR_TCP_RCVBUF: a value that is not a size (or past INT_MAX) fails
 * open() with FR_EINVAL; 0 (the kernel's autotuning), a small and a large
 * buffer all carry a 3 MiB write each way at once, intact.
 */
static void test_tcp_rcvbuf(void **state)
{
	static const char *const bad[] = {"abc", "1Q", "3G", "-1"};
	static const char *const good[] = {"0", "64K", "8M"};
	const size_t len = 3 * MiB + 1;
	struct ep *e = NULL;

	(void)state;
	if (strcmp(ops->name, "tcp"))
		skip();
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		env_set("FR_TCP_RCVBUF", bad[k]);
		assert_int_equal(
			ep_try_open(0, NONCE, "127.0.0.1", 0, DEADLINE_MS, &e),
			FR_EINVAL);
	}
	for (size_t k = 0; k < sizeof(good) / sizeof(good[0]); k++) {
		struct ep *a, *b;
		uint8_t *sa = tbuf(len), *sb = tbuf(len);
		uint8_t *da = tbuf(len), *db = tbuf(len);
		struct fr_tp_conn *ab, *ba;
		struct fr_tp_rkey to_a, to_b;

		env_set("FR_TCP_RCVBUF", good[k]);
		a = ep_open(0);
		b = ep_open(1);
		connect_pair(a, b, &ab, &ba);
		fill(sa, len, 11 + k);
		fill(sb, len, 21 + k);
		memset(da, 0, len);
		memset(db, 0, len);
		to_b = rkey_of(
			b,
			reg(b, db, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE),
			a);
		to_a = rkey_of(
			a,
			reg(a, da, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE),
			b);
		post(ab, reg(a, sa, len, FR_TP_LOCAL_READ), 0, &to_b, 0, len, 7,
		     1);
		post(ba, reg(b, sb, len, FR_TP_LOCAL_READ), 0, &to_a, 0, len, 8,
		     2);
		PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1 &&
			   n_ok(a, ab, FR_CQE_RECV) == 1);
		assert_memory_equal(db, sa, len);
		assert_memory_equal(da, sb, len);
		assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
		ep_close(a);
		ep_close(b);
	}
	/* teardown puts FR_TCP_RCVBUF back as the suite found it */
}

/* ---- bounds
 * ------------------------------------------------------------------ */

enum bad_kind {
	BAD_PAST_END,
	BAD_AT_END,
	BAD_OVERFLOW,
	BAD_DEREGISTERED,
	BAD_SLOT_REUSED,
	BAD_NO_REMOTE_WRITE,
};

/*
 * One bad write on a fresh connection, then a good one behind it: the
 * receiver fails the connection with FR_ERANGE, writes nothing outside the
 * region (guards), and the later write never lands.
 */
static void bad_write_case(enum bad_kind kind)
{
	const size_t rlen = 4096;
	struct ep *a = ep_open(0), *b = ep_open(1);
	struct gbuf dst = gbuf_new(rlen, 0x3c);
	struct gbuf okd = gbuf_new(64, 0x4d);
	uint8_t *src = tbuf(rlen);
	struct fr_tp_mr *smr, *dmr, *okmr, *newmr = NULL;
	struct fr_tp_rkey rk, okrk;
	struct fr_tp_conn *ab, *ba;
	struct gbuf fresh = gbuf_new(rlen, 0x5e);
	uint64_t roff = 0;
	size_t len = 64;
	int access = FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;

	connect_pair(a, b, &ab, &ba);
	fill(src, rlen, 99);
	smr = reg(a, src, rlen, FR_TP_LOCAL_READ);
	if (kind == BAD_NO_REMOTE_WRITE)
		access = FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE;
	dmr = reg(b, dst.p, rlen, access);
	okmr = reg(b, okd.p, 64, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	okrk = rkey_of(b, okmr, a);
	switch (kind) {
	case BAD_PAST_END:
		roff = rlen - 96;
		len = 200;
		break;
	case BAD_AT_END:
		roff = rlen;
		len = 1;
		break;
	case BAD_OVERFLOW:
		roff = UINT64_MAX - 50;
		len = 100;
		break;
	case BAD_DEREGISTERED:
		assert_int_equal(ops->dereg_mem(b->tp, dmr), 0);
		break;
	case BAD_SLOT_REUSED:
		/* A new region, probably in the old one's slot: the stale
		 * key must not reach it. */
		assert_int_equal(ops->dereg_mem(b->tp, dmr), 0);
		newmr = reg(b, fresh.p, rlen,
			    FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
		break;
	case BAD_NO_REMOTE_WRITE:
		break;
	}
	if (over_verbs() &&
	    (kind == BAD_PAST_END || kind == BAD_AT_END || kind == BAD_OVERFLOW)) {
		/* The key carries the region's length: refused before posting,
		 * nothing sent, the connection stays usable. */
		assert_int_equal(ops->write_imm(ab, smr, 0, &rk, roff, len, 1, 1),
				 FR_ERANGE);
		post(ab, smr, 0, &okrk, 0, 64, 2, 2);
		PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1 && n_ok(a, ab, FR_CQE_SEND) == 1);
		pump_for(50);
		assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
		assert_memory_equal(okd.p, src, 64);
		assert_true(all_bytes(dst.p, rlen, 0x3c));
		check_guards(&dst);
		check_guards(&okd);
		ep_close(a);
		ep_close(b);
		return;
	}
	post(ab, smr, 0, &rk, roff, len, 1, 1);
	post(ab, smr, 0, &okrk, 0, 64, 2, 2);
	PUMP_UNTIL(n_err(b, ba) >= 1);
	assert_int_equal(first_err(b, ba), FR_ERANGE);
	/* The sender learns that its connection is gone, and its transport
	 * says why naming the peer (the core quotes it: peer.c tp_about) */
	PUMP_UNTIL(n_err(a, ab) >= 1);
	if (ops->last_error) {
		const char *e = ops->last_error(a->tp);

		if (!e || !strstr(e, "rank 1"))
			fail_msg("the sender's last error does not name rank 1: \"%s\"",
				 e ? e : "(null)");
	}
	pump_for(50);
	assert_int_equal(n_ok(b, ba, FR_CQE_RECV), 0);
	assert_int_equal(count(b, ba, FR_CQE_RECV, -1), 1);
	check_guards(&dst);
	check_guards(&okd);
	assert_true(all_bytes(okd.p, 64, 0x4d));
	if (kind == BAD_SLOT_REUSED) {
		assert_true(all_bytes(fresh.p, rlen, 0x5e));
		check_guards(&fresh);
		assert_non_null(newmr);
	}
	if (kind == BAD_NO_REMOTE_WRITE || kind == BAD_DEREGISTERED ||
	    kind == BAD_AT_END || kind == BAD_OVERFLOW)
		assert_true(all_bytes(dst.p, rlen, 0x3c));
	/* Later operations on both ends fail. */
	assert_true(ops->write_imm(ba, NULL, 0, NULL, 0, 0, 3, 3) < 0);
	assert_true(ops->write_imm(ab, NULL, 0, NULL, 0, 0, 3, 3) < 0);
	assert_true(ops->write_imm(ab, NULL, 0, NULL, 0, 0, 3, 3) != FR_EAGAIN);
	ep_close(a);
	ep_close(b);
}

static void test_bounds_past_end(void **state)
{
	bad_write_case(BAD_PAST_END);
	bad_write_case(BAD_AT_END);
}

static void test_bounds_overflow(void **state)
{
	bad_write_case(BAD_OVERFLOW);
}

static void test_bounds_deregistered(void **state)
{
	bad_write_case(BAD_DEREGISTERED);
	bad_write_case(BAD_SLOT_REUSED);
}

static void test_bounds_no_remote_write(void **state)
{
	bad_write_case(BAD_NO_REMOTE_WRITE);
}

/*
 * A large write (the size that shm moves by cross-memory attach and verbs
 * by RDMA, not through a ring or a socket) into a region
 * that the receiver has deregistered and whose memory it already uses for
 * something else, from a writer that has not heard of it yet (a stale
 * key): it must be refused, not land, even while only the writer makes
 * progress.  A fresh region in the freed slot is not reached either.
 */
static void test_bounds_deregistered_large(void **state)
{
	const size_t len = 1 * MiB;
	struct ep *a = ep_open(0), *b = ep_open(1);
	struct gbuf dst = gbuf_new(len, 0);
	struct gbuf fresh = gbuf_new(len, 0x5e);
	uint8_t *src = tbuf(len);
	struct fr_tp_mr *smr, *dmr, *newmr;
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_rkey rk;

	connect_pair(a, b, &ab, &ba);
	fill(src, len, 23);
	smr = reg(a, src, len, FR_TP_LOCAL_READ);
	dmr = reg(b, dst.p, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	/* The same write, while the region is there: it lands. */
	post(ab, smr, 0, &rk, 0, len, 1, 1);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1 &&
		   n_ok(a, ab, FR_CQE_SEND) == 1);
	assert_memory_equal(dst.p, src, len);

	/* The receiver drops the region, registers another one (probably
	 * in the same slot) and reuses the old memory; the writer still
	 * holds the old key. */
	assert_int_equal(ops->dereg_mem(b->tp, dmr), 0);
	newmr = reg(b, fresh.p, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	memset(dst.p, 0x3c, len);
	post(ab, smr, 0, &rk, 0, len, 2, 2);
	post(ab, NULL, 0, NULL, 0, 0, 3, 3); /* and one behind it */
	/* Only the writer progresses: nothing may land meanwhile. */
	for (uint64_t end = now_ms() + 100; now_ms() < end;)
		drain(a);
	assert_true(all_bytes(dst.p, len, 0x3c));
	assert_true(all_bytes(fresh.p, len, 0x5e));

	/* Now the receiver: it refuses the write, the writer learns it.
	 * (verbs: the responder's HCA refuses it with a NAK; what the
	 * receiver's own completions say then is the device's business) */
	if (!over_verbs()) {
		PUMP_UNTIL(n_err(b, ba) >= 1);
		assert_int_equal(first_err(b, ba), FR_ERANGE);
	}
	PUMP_UNTIL(n_err(a, ab) >= 1);
	pump_for(50);
	assert_int_equal(n_ok(b, ba, FR_CQE_RECV), 1); /* the first only */
	assert_true(all_bytes(dst.p, len, 0x3c));
	assert_true(all_bytes(fresh.p, len, 0x5e));
	check_guards(&dst);
	check_guards(&fresh);
	assert_non_null(newmr);
	/* The writer's source is no longer in use either. */
	assert_int_equal(ops->dereg_mem(a->tp, smr), 0);
}

/* ---- flow control ----------------------------------------------------------
 */

static void test_backpressure(void **state)
{
	enum { N = 256, STEP = 64 };
	const size_t len = 128 * KiB, srclen = len + (size_t)N * STEP;
	struct ep *a = ep_open_ex(0, NONCE, 4, DEADLINE_MS), *b = ep_open(1);
	uint8_t *src = tbuf(srclen);
	struct gbuf dst = gbuf_new((size_t)N * len, 0);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	uint32_t i = 0;
	int rc;

	connect_pair(a, b, &ab, &ba);
	/* Message i is a different window of src, so mix-ups show. */
	fill(src, srclen, 5);
	smr = reg(a, src, srclen, FR_TP_LOCAL_READ);
	dmr = reg(b, dst.p, dst.len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	/* Nobody polls: the queue must fill up and say so. */
	for (;;) {
		if (i == N)
			fail_msg(
				"%d writes of %zu bytes posted without FR_EAGAIN",
				N, len);
		rc = ops->write_imm(ab, smr, (size_t)i * STEP, &rk,
				    (uint64_t)i * len, len, i, i);
		if (rc == FR_EAGAIN)
			break;
		assert_int_equal(rc, 0);
		i++;
	}
	assert_true(i >= 1);
	/* Refused posts stay refused until someone polls. */
	assert_int_equal(ops->write_imm(ab, smr, (size_t)i * STEP, &rk,
					(uint64_t)i * len, len, i, i),
			 FR_EAGAIN);
	for (; i < N; i++)
		post(ab, smr, (size_t)i * STEP, &rk, (uint64_t)i * len, len, i,
		     i);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == N &&
		   n_ok(a, ab, FR_CQE_SEND) == N);
	for (i = 0; i < N; i++) {
		assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, i)->imm, i);
		assert_int_equal(nth_ok(a, ab, FR_CQE_SEND, i)->ctx, i);
		assert_memory_equal(dst.p + (size_t)i * len,
				    src + (size_t)i * STEP, len);
	}
	check_guards(&dst);
	assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
}

/* ---- peer failure ----------------------------------------------------------
 */

static int child_open_connect(int rank, const uint8_t *addr, size_t addrlen,
			      struct fr_tp **tp, struct fr_tp_conn **c)
{
	uint8_t mine[FR_TP_ADDR_MAX];
	size_t ml = sizeof(mine);
	struct fr_tp_params p;
	uint64_t dl = now_ms() + DEADLINE_MS;
	int rc;

	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.rank = rank;
	p.job_nonce = NONCE;
	p.local_ip = "127.0.0.1";
	p.timeout_ms = DEADLINE_MS;
	if (mux_nodes)
		setenv("FR_NODE", "conformance-child", 1);
	if (ops->open(&p, tp, mine, &ml))
		return -1;
	if (ops->connect(*tp, 0, addr, addrlen, c))
		return -1;
	while ((rc = ops->connect_done(*c)) == FR_EAGAIN) {
		if (now_ms() > dl)
			return -1;
		ops->wait(*tp, 20);
	}
	return rc ? -1 : 0;
}

static struct fr_tp_conn *accept_from(struct ep *e, int rank)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	struct fr_tp_conn *c = NULL;
	int rc;

	while ((rc = ops->accept(e->tp, rank, &c)) == FR_EAGAIN) {
		if (now_ms() > dl)
			fail_msg("rank %d never connected", rank);
		assert_int_equal(ops->wait(e->tp, 20), 0);
	}
	assert_int_equal(rc, 0);
	return c;
}

/* Child: start a write bigger than the socket buffers, then _exit(). */
static int child_sender(const struct ep *parent, const uint8_t *blob,
			size_t bloblen, uint8_t *src, size_t len, int report)
{
	struct fr_tp_cqe q[8];
	struct fr_tp_rkey rk;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	struct fr_tp *tp;
	uint64_t end;
	char ch = 'R';
	int n;

	if (child_open_connect(1, parent->addr, parent->addrlen, &tp, &c))
		return 2;
	if (ops->reg_mem(tp, src, len, FR_TP_LOCAL_READ, &mr) ||
	    ops->unpack_rkey(tp, blob, bloblen, &rk))
		return 3;
	memset(src, 0x77, len);
	if (ops->write_imm(c, mr, 0, &rk, 0, len, 42, 1))
		return 4;
	/* Push what the kernel takes; the parent is not reading. */
	end = now_ms() + 200;
	while (now_ms() < end) {
		n = ops->poll(tp, q, 8);
		for (int i = 0; i < n; i++)
			if (q[i].kind == FR_CQE_SEND)
				ch = 'F'; /* it all went: no mid-transfer death
					   */
		sleep_ms(1);
	}
	if (write(report, &ch, 1) != 1)
		return 5;
	return 0; /* _exit() with the message half sent */
}

/* This program, resolved at start: under valgrind /proc/self/exe itself
 * would name valgrind's launcher, readlink() names us. */
static char exe_path[4096] = "/proc/self/exe";
static char hexbuf[2][2 * FR_TP_ADDR_MAX + 1];
static const char *hex(int k, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sprintf(hexbuf[k] + 2 * i, "%02x", b[i]);
	hexbuf[k][2 * n] = 0;
	return hexbuf[k];
}
static size_t unhex(const char *s, uint8_t *b)
{
	size_t n = 0;
	unsigned int v;

	while (s[0] && s[1] && sscanf(s, "%2x", &v) == 1) {
		b[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}
/* RDMA contexts do not survive fork(): the child runs as a new program. */
static void exec_child(const char *role, const struct ep *p, const uint8_t *blob,
		       size_t bl, size_t len, int fd1, int fd2)
{
	char lens[32], f1[16], f2[16];

	/* A child left waiting by a failed check (the sink pauses until
	 * SIGKILL) would outlive the suite and hold its output pipe open:
	 * it dies with us instead (kept across exec). */
	(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
	snprintf(lens, sizeof(lens), "%zu", len);
	snprintf(f1, sizeof(f1), "%d", fd1);
	snprintf(f2, sizeof(f2), "%d", fd2);
	execl(exe_path, "test_transport", "--child", role,
	      hex(0, p->addr, p->addrlen), hex(1, blob, bl), lens, f1, f2,
	      (char *)NULL);
	_exit(127);
}
static int child_sink(const struct ep *parent, void *dst, size_t len, int report);
static int child_late_sender(const struct ep *parent, const uint8_t *blob,
			     size_t bloblen, int report, int go);
static int child_main(char **argv)
{
	struct ep parent;
	uint8_t blob[FR_TP_ADDR_MAX];
	size_t bl, len = strtoul(argv[5], NULL, 10);
	int fd1 = atoi(argv[6]), fd2 = atoi(argv[7]);

	memset(&parent, 0, sizeof(parent));
	parent.addrlen = unhex(argv[3], parent.addr);
	bl = unhex(argv[4], blob);
	if (!strcmp(argv[2], "sender"))
		return child_sender(&parent, blob, bl, malloc(len), len, fd1);
	if (!strcmp(argv[2], "sink"))
		return child_sink(&parent, malloc(len), len, fd1);
	return child_late_sender(&parent, blob, bl, fd1, fd2);
}

/*
 * The two tests below need a write that the kernel cannot take whole: TCP
 * buffers what the receiver has not read, and with the default
 * FR_TCP_RCVBUF (4 MiB, doubled by the kernel, fr_tcp.c) all of 8 MiB may
 * fit into the two sockets.  They run, and their children (which inherit
 * the environment), with 64 KiB.
 */
static void small_tcp_buffers(void)
{
	assert_int_equal(setenv("FR_TCP_RCVBUF", "64K", 1), 0);
}

static void test_peer_exits_mid_transfer(void **state)
{
	const size_t len = 8 * MiB;
	struct ep *p;
	struct gbuf dst = gbuf_new(len, 0);
	uint8_t blob[FR_TP_RKEY_MAX];
	size_t bloblen = sizeof(blob);
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	int pfd[2];
	pid_t pid;

	if (in_process())
		skip();
	small_tcp_buffers();
	p = ep_open(0);

	mr = reg(p, dst.p, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	assert_int_equal(ops->pack_rkey(mr, blob, &bloblen), 0);
	assert_int_equal(pipe(pfd), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(pfd[0]);
		exec_child("sender", p, blob, bloblen, len, pfd[1], -1);
	}
	close(pfd[1]);
	c = accept_from(p, 1);
	/* Not polling until the child is gone keeps the message unfinished. */
	char ch = read_byte(pfd[0]);
	assert_true(ch == 'R' || (ch == 'F' && one_sided()));
	print_message("child reported %c\n", ch);
	close(pfd[0]);
	assert_true(WIFEXITED(reap(pid)));
	PUMP_UNTIL(n_err(p, c) >= 1);
	assert_int_equal(first_err(p, c), FR_EPEER);
	/* 'R' from a one-sided sender means only that its completion had
	 * not come back yet: the last packet may have landed here while the
	 * acknowledgement was on its way (Soft-RoCE under emulation takes
	 * about the 200 ms the child waits to move 8 MiB). Then the message
	 * arrived whole, and says so once. */
	size_t got = n_ok(p, c, FR_CQE_RECV);
	print_message("messages arrived whole: %zu\n", got);
	if (ch == 'F')
		assert_int_equal(got, 1);
	else if (!one_sided())
		assert_int_equal(got, 0);
	else
		assert_true(got <= 1);
	if (got) {
		const struct fr_tp_cqe *q = nth_ok(p, c, FR_CQE_RECV, 0);
		assert_int_equal(q->imm, 42);
		for (size_t i = 0; i < len; i++)
			if (((uint8_t *)dst.p)[i] != 0x77)
				fail_msg("byte %zu of a whole message is %#x",
					 i, ((uint8_t *)dst.p)[i]);
	}
	assert_int_equal(ops->write_imm(c, NULL, 0, NULL, 0, 0, 1, 1),
			 FR_EPEER);
	pump_for(100);
	assert_int_equal(n_err(p, c), 1);
	check_guards(&dst);
}

/* Child: connect, hand over a key, then sleep without reading. */
static int child_sink(const struct ep *parent, void *dst, size_t len,
		      int report)
{
	uint8_t msg[1 + FR_TP_RKEY_MAX];
	size_t kl = FR_TP_RKEY_MAX;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	struct fr_tp *tp;

	if (child_open_connect(1, parent->addr, parent->addrlen, &tp, &c))
		return 2;
	if (ops->reg_mem(tp, dst, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE,
			 &mr) ||
	    ops->pack_rkey(mr, msg + 1, &kl))
		return 3;
	msg[0] = (uint8_t)kl;
	if (write(report, msg, 1 + kl) != (ssize_t)(1 + kl))
		return 4;
	for (;;)
		pause(); /* until SIGKILL */
}

static void test_peer_killed_while_sending(void **state)
{
	const size_t len = 8 * MiB;
	struct ep *p;
	uint8_t *src = tbuf(len), msg[1 + FR_TP_RKEY_MAX];
	struct fr_tp_rkey rk;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	const struct fr_tp_cqe *q = NULL;
	int pfd[2];
	pid_t pid;

	if (in_process())
		skip();
	small_tcp_buffers();
	p = ep_open(0);

	assert_int_equal(pipe(pfd), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(pfd[0]);
		exec_child("sink", p, NULL, 0, len, pfd[1], -1);
	}
	close(pfd[1]);
	c = accept_from(p, 1);
	msg[0] = (uint8_t)read_byte(pfd[0]);
	assert_true(msg[0] > 0 && msg[0] <= FR_TP_RKEY_MAX);
	assert_int_equal(read(pfd[0], msg + 1, msg[0]), msg[0]);
	close(pfd[0]);
	assert_int_equal(ops->unpack_rkey(p->tp, msg + 1, msg[0], &rk), 0);
	fill(src, len, 3);
	mr = reg(p, src, len, FR_TP_LOCAL_READ);
	/* Writes on an accepted connection go the other way. */
	post(c, mr, 0, &rk, 0, len, 9, 99);
	pump_for(200);
	if (!one_sided())
		assert_int_equal(count(p, c, FR_CQE_SEND, 1), 0); /* stuck */
	kill(pid, SIGKILL);
	assert_true(WIFSIGNALED(reap(pid)));
	PUMP_UNTIL(count(p, c, FR_CQE_SEND, 1) == 1 && n_err(p, c) >= 1);
	for (size_t i = 0; i < p->ncq; i++)
		if (p->cq[i].kind == FR_CQE_SEND && p->cq[i].conn == c)
			q = &p->cq[i];
	assert_non_null(q);
	assert_int_equal(q->ctx, 99);
	print_message("send status %d\n", q->status);
	assert_true(q->status < 0 || one_sided());
	assert_true(n_err(p, c) >= 1);
	assert_int_equal(n_ok(p, c, FR_CQE_RECV), 0);
	assert_int_equal(ops->write_imm(c, NULL, 0, NULL, 0, 0, 1, 1),
			 FR_EPEER);
	/* Its source is no longer in use. */
	assert_int_equal(ops->dereg_mem(p->tp, mr), 0);
}

/* ---- wait() ----------------------------------------------------------------
 */

static void test_wait_idle_and_wake(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *src = tbuf(8), *dst = tbuf(8);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	uint64_t t0, el, dl;

	connect_pair(a, b, &ab, &ba);
	fill(src, 8, 4);
	memset(dst, 0, 8);
	smr = reg(a, src, 8, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 8, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	pump_for(20);

	/* Nothing to do: wait() sleeps for its timeout, not a spin. */
	t0 = now_ms();
	assert_int_equal(ops->wait(b->tp, 150), 0);
	el = now_ms() - t0;
	assert_true(el >= 100 && el < 2000);

	/* Data already there: wait() returns at once. */
	post(ab, smr, 0, &rk, 0, 8, 0x77, 1);
	dl = now_ms() + DEADLINE_MS;
	while (!n_ok(a, ab, FR_CQE_SEND)) {
		drain(a); /* only the sender: b must not consume it yet */
		assert_true(now_ms() < dl);
	}
	t0 = now_ms();
	assert_int_equal(ops->wait(b->tp, 5000), 0);
	assert_true(now_ms() - t0 < 1000);
	dl = now_ms() + DEADLINE_MS;
	while (!n_ok(b, ba, FR_CQE_RECV)) {
		drain(b);
		assert_true(now_ms() < dl);
	}
	assert_memory_equal(dst, src, 8);
}

/* Child: connect, sleep, send 8 bytes, wait for the parent's word. */
static int child_late_sender(const struct ep *parent, const uint8_t *blob,
			     size_t bloblen, int report, int go)
{
	uint64_t src = 0x0123456789abcdefull, dl;
	struct fr_tp_cqe q[4];
	struct fr_tp_rkey rk;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	struct fr_tp *tp;
	bool sent = false;
	char ch = 'C';
	int n;

	if (child_open_connect(1, parent->addr, parent->addrlen, &tp, &c))
		return 2;
	if (ops->reg_mem(tp, &src, 8, FR_TP_LOCAL_READ, &mr) ||
	    ops->unpack_rkey(tp, blob, bloblen, &rk))
		return 3;
	if (write(report, &ch, 1) != 1)
		return 4;
	sleep_ms(300);
	if (ops->write_imm(c, mr, 0, &rk, 0, 8, 0x5157, 1))
		return 5;
	dl = now_ms() + DEADLINE_MS;
	while (!sent) {
		n = ops->poll(tp, q, 4);
		for (int i = 0; i < n; i++)
			if (q[i].kind == FR_CQE_SEND && !q[i].status)
				sent = true;
		if (n < 0 || now_ms() > dl)
			return 6;
		if (!n)
			ops->wait(tp, 20);
	}
	{
		struct pollfd pf = {.fd = go, .events = POLLIN};

		if (poll(&pf, 1, DEADLINE_MS) != 1)
			return 7;
	}
	ops->close_conn(c);
	ops->dereg_mem(tp, mr);
	ops->close(tp);
	return 0;
}

static void test_wait_wakes_on_arrival(void **state)
{
	struct ep *p = ep_open(0);
	uint8_t blob[FR_TP_RKEY_MAX], *dst = tbuf(8);
	size_t bloblen = sizeof(blob);
	const struct fr_tp_cqe *q;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	uint64_t t0, dl, want = 0x0123456789abcdefull;
	int report[2], go[2], waits = 0, st;
	pid_t pid;

	if (in_process())
		skip();

	memset(dst, 0, 8);
	mr = reg(p, dst, 8, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	assert_int_equal(ops->pack_rkey(mr, blob, &bloblen), 0);
	assert_int_equal(pipe(report), 0);
	assert_int_equal(pipe(go), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(report[0]);
		close(go[1]);
		exec_child("late", p, blob, bloblen, 0, report[1], go[0]);
	}
	close(report[1]);
	close(go[0]);
	c = accept_from(p, 1);
	assert_int_equal(read_byte(report[0]), 'C');
	drain(p);
	/* Sleep in wait(); the child's write must wake us. */
	t0 = now_ms();
	dl = t0 + DEADLINE_MS;
	while (!n_ok(p, c, FR_CQE_RECV)) {
		drain(p);
		if (n_ok(p, c, FR_CQE_RECV))
			break;
		if (now_ms() > dl)
			fail_msg("the child's write never arrived");
		assert_int_equal(ops->wait(p->tp, 5000), 0);
		waits++;
	}
	assert_true(now_ms() - t0 < 3000);
	assert_true(waits <= 20); /* blocked, did not spin */
	q = nth_ok(p, c, FR_CQE_RECV, 0);
	assert_int_equal(q->imm, 0x5157);
	assert_int_equal(q->len, 8);
	assert_memory_equal(dst, &want, 8);
	assert_int_equal(write(go[1], "D", 1), 1);
	close(go[1]);
	close(report[0]);
	st = reap(pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/*
 * A sender whose stream is full sleeps in wait() and is woken by room:
 * the receiver, drained by a thread of its own, empties the socket (or
 * ring) while we sleep, and the rest of one large write must go out from
 * the wake-ups alone.  Over TCP a short send marks the socket full and
 * only epoll's EPOLLOUT may clear it (tcp_tx): a mark that nothing
 * clears would leave the write half sent, and this test at its deadline.
 */
struct room_drainer {
	struct ep *e;
	const struct fr_tp_conn *c;
	size_t want;
	uint64_t dl;
};

/* Only this thread touches the receiver until it is joined: it stops on
 * its own once every write has landed, or at the deadline. */
static void *room_drainer_main(void *arg)
{
	struct room_drainer *d = arg;

	while (n_ok(d->e, d->c, FR_CQE_RECV) < d->want && now_ms() < d->dl)
		drain(d->e);
	return NULL;
}

static void test_wait_wakes_on_room(void **state)
{
	/* 16 MiB in 2 MiB writes: under every port's largest message
	 * (Soft-RoCE's is 8 MiB), far over the sockets' 64 KiB */
	enum { NW = 8 };
	const size_t wlen = 2u << 20, len = NW * wlen;
	struct ep *a, *b;
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	struct room_drainer d;
	uint8_t *src, *dst;
	uint64_t dl;
	pthread_t t;
	int waits = 0;

	small_tcp_buffers();
	a = ep_open(0);
	b = ep_open(1);
	src = tbuf(len);
	dst = tbuf(len);
	connect_pair(a, b, &ab, &ba);
	fill(src, len, 11);
	memset(dst, 0, len);
	smr = reg(a, src, len, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	/* all posted before anyone polls: the first fills the stream */
	for (uint32_t i = 0; i < NW; i++)
		assert_int_equal(ops->write_imm(ab, smr, i * wlen, &rk,
						i * wlen, wlen, 0x7000 + i, i),
				 0);
	dl = now_ms() + DEADLINE_MS;
	d.e = b;
	d.c = ba;
	d.want = NW;
	d.dl = dl;
	assert_int_equal(pthread_create(&t, NULL, room_drainer_main, &d), 0);
	while (n_ok(a, ab, FR_CQE_SEND) < NW && now_ms() < dl) {
		drain(a);
		if (n_ok(a, ab, FR_CQE_SEND) == NW)
			break;
		assert_int_equal(ops->wait(a->tp, 1000), 0);
		waits++;
	}
	pthread_join(t, NULL);
	if (n_ok(a, ab, FR_CQE_SEND) < NW)
		fail_msg("%d of %d writes of %zu bytes sent after %d waits",
			 (int)n_ok(a, ab, FR_CQE_SEND), NW, wlen, waits);
	assert_int_equal(n_ok(b, ba, FR_CQE_RECV), NW);
	for (uint32_t i = 0; i < NW; i++)
		assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, i)->imm,
				 0x7000 + i);
	assert_memory_equal(dst, src, len);
	assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
}

/*
 * A small write right after a large one wakes a receiver that sleeps in
 * wait().  Over TCP a payload whose rest has not arrived sets SO_RCVLOWAT
 * to what it lacks, so that epoll reports the socket once for the rest
 * (tcp_data.c, tcp_rx_lowat); the mark must be back at 1 before the next
 * header is awaited, or an 8-byte message behind the large one would wait
 * for bytes that never come (at least until the wait's timeout, 3 s
 * here).  The sender posts the small write only after the large one has
 * landed and the receiver has gone back to sleep, and it must arrive well
 * within those 3 s.
 */
struct lowat_sender {
	struct ep *e;
	struct fr_tp_conn *c;
	struct fr_tp_mr *mr;
	struct fr_tp_rkey rk;
	size_t big;
	int landed; /* set by the receiver (atomic): the large one is in */
	uint64_t small_posted_ms, dl;
	int rc;
};

/* The sender's own endpoint only: until n of its writes have gone. */
static void lowat_sent(struct lowat_sender *s, size_t n)
{
	while (!s->rc && n_ok(s->e, s->c, FR_CQE_SEND) < n &&
	       now_ms() < s->dl) {
		drain(s->e);
		if (n_ok(s->e, s->c, FR_CQE_SEND) < n)
			(void)ops->wait(s->e->tp, 100);
	}
}

static void *lowat_sender_main(void *arg)
{
	struct lowat_sender *s = arg;

	s->rc = ops->write_imm(s->c, s->mr, 0, &s->rk, 0, s->big, 0x6101, 1);
	lowat_sent(s, 1);
	while (!__atomic_load_n(&s->landed, __ATOMIC_ACQUIRE) &&
	       now_ms() < s->dl)
		usleep(1000);
	usleep(100000); /* the receiver is asleep in wait() again */
	__atomic_store_n(&s->small_posted_ms, now_ms(), __ATOMIC_RELEASE);
	if (!s->rc)
		s->rc = ops->write_imm(s->c, s->mr, s->big, &s->rk, s->big, 8,
				       0x6102, 2);
	lowat_sent(s, 2);
	return NULL;
}

static void test_small_after_large_wakes(void **state)
{
	const size_t big = 4u << 20, len = big + 8;
	struct lowat_sender s;
	struct ep *a, *b;
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *dmr;
	uint8_t *src, *dst;
	uint64_t dl, posted, arrived = 0;
	pthread_t t;

	a = ep_open(0);
	b = ep_open(1);
	src = tbuf(len);
	dst = tbuf(len);
	connect_pair(a, b, &ab, &ba);
	fill(src, len, 23);
	memset(dst, 0, len);
	memset(&s, 0, sizeof(s));
	s.e = a;
	s.c = ab;
	s.big = big;
	s.mr = reg(a, src, len, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, len, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	s.rk = rkey_of(b, dmr, a);
	dl = now_ms() + DEADLINE_MS;
	s.dl = dl;
	assert_int_equal(pthread_create(&t, NULL, lowat_sender_main, &s), 0);
	/* only this thread drives the receiver, sleeping whenever it has
	 * nothing: the large write lands in pieces, across wake-ups */
	while (n_ok(b, ba, FR_CQE_RECV) < 2 && now_ms() < dl) {
		drain(b);
		if (n_ok(b, ba, FR_CQE_RECV) >= 1)
			__atomic_store_n(&s.landed, 1, __ATOMIC_RELEASE);
		if (n_ok(b, ba, FR_CQE_RECV) >= 2) {
			arrived = now_ms();
			break;
		}
		assert_int_equal(ops->wait(b->tp, 3000), 0);
	}
	pthread_join(t, NULL);
	assert_int_equal(s.rc, 0);
	if (n_ok(b, ba, FR_CQE_RECV) < 2)
		fail_msg("%d of 2 writes arrived (4 MiB, then 8 bytes)",
			 (int)n_ok(b, ba, FR_CQE_RECV));
	posted = __atomic_load_n(&s.small_posted_ms, __ATOMIC_ACQUIRE);
	/* a receiver that slept through it would see it after its 3 s wait
	 * at the earliest; the margin is for valgrind */
	if (arrived - posted >= 2500)
		fail_msg("the 8-byte write arrived %llu ms after it was posted",
			 (unsigned long long)(arrived - posted));
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 0)->imm, 0x6101);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 1)->imm, 0x6102);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 1)->len, 8);
	assert_memory_equal(dst, src, len);
	assert_int_equal(n_err(a, ab) + n_err(b, ba), 0);
}

/* ---- validation ---------------------------------------------------------- */

static void test_malformed_rkey(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t blob[FR_TP_RKEY_MAX + 8], bad[FR_TP_RKEY_MAX + 8];
	uint8_t *buf = tbuf(64);
	size_t len = FR_TP_RKEY_MAX, small;
	struct fr_tp_rkey rk;
	struct fr_tp_mr *mr;

	mr = reg(b, buf, 64, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	memset(blob, 0, sizeof(blob));
	assert_int_equal(ops->pack_rkey(mr, blob, &len), 0);
	assert_true(len > 1 && len <= FR_TP_RKEY_MAX);
	assert_int_equal(ops->unpack_rkey(a->tp, blob, len, &rk), 0);
	/* *len is the capacity: too small a buffer is refused. */
	small = 1;
	assert_true(ops->pack_rkey(mr, bad, &small) < 0);

	assert_true(ops->unpack_rkey(a->tp, blob, len - 1, &rk) < 0);
	assert_true(ops->unpack_rkey(a->tp, blob, len + 1, &rk) < 0);
	assert_true(ops->unpack_rkey(a->tp, blob, 0, &rk) < 0);
	assert_true(ops->unpack_rkey(a->tp, NULL, len, &rk) < 0);
	memset(bad, 0, sizeof(bad));
	assert_true(ops->unpack_rkey(a->tp, bad, len, &rk) < 0);
	memset(bad, 0xff, sizeof(bad));
	assert_true(ops->unpack_rkey(a->tp, bad, len, &rk) < 0);
	memcpy(bad, blob, len);
	bad[0] ^= 0xff;
	assert_true(ops->unpack_rkey(a->tp, bad, len, &rk) < 0);
	/* Still fine after all that. */
	assert_int_equal(ops->unpack_rkey(a->tp, blob, len, &rk), 0);
}

/* A refused blob fails in connect() or, at the latest, in connect_done(). */
static void expect_bad_addr(struct ep *a, const void *blob, size_t len)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	struct fr_tp_conn *c = NULL;
	int rc;

	rc = ops->connect(a->tp, 1, blob, len, &c);
	if (rc) {
		assert_true(rc < 0 && rc != FR_EAGAIN);
		return;
	}
	/* Drive every endpoint, so that a blob that does reach a listener
	 * would really connect (and fail the test). */
	while ((rc = ops->connect_done(c)) == FR_EAGAIN) {
		pump();
		if (now_ms() > dl)
			fail_msg("a malformed address was still connecting");
	}
	assert_true(rc < 0);
	ops->close_conn(c);
}

static void test_malformed_addr(void **state)
{
	struct ep *a = ep_open_ex(0, NONCE, 0, 300), *b = ep_open(1);
	uint8_t bad[FR_TP_ADDR_MAX + 8];

	memcpy(bad, b->addr, b->addrlen);
	expect_bad_addr(a, bad, 0);
	expect_bad_addr(a, bad, 3);
	expect_bad_addr(a, bad, b->addrlen - 1);
	bad[b->addrlen] = 0;
	expect_bad_addr(a, bad, b->addrlen + 1);
	memset(bad, 0, sizeof(bad));
	expect_bad_addr(a, bad, b->addrlen);
	memset(bad, 0xff, sizeof(bad));
	expect_bad_addr(a, bad, b->addrlen);
}

static void test_local_validation(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *src = tbuf(100), *dst = tbuf(100);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	int rc;

	connect_pair(a, b, &ab, &ba);
	fill(src, 100, 6);
	memset(dst, 0, 100);
	smr = reg(a, src, 100, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 100, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);

	rc = ops->write_imm(ab, smr, 50, &rk, 0, 51, 1, 1);
	assert_true(rc < 0 && rc != FR_EAGAIN);
	rc = ops->write_imm(ab, smr, SIZE_MAX - 1, &rk, 0, 4, 1, 1);
	assert_true(rc < 0 && rc != FR_EAGAIN);
	rc = ops->write_imm(ab, NULL, 0, &rk, 0, 10, 1, 1);
	assert_true(rc < 0 && rc != FR_EAGAIN);
	rc = ops->write_imm(ab, smr, 0, NULL, 0, 10, 1, 1);
	assert_true(rc < 0 && rc != FR_EAGAIN);
	rc = ops->write_imm(NULL, smr, 0, &rk, 0, 10, 1, 1);
	assert_true(rc < 0 && rc != FR_EAGAIN);

	/* None of them went anywhere; the connection still works. */
	post(ab, smr, 0, &rk, 0, 100, 5, 5);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) >= 1 &&
		   n_ok(a, ab, FR_CQE_SEND) >= 1);
	pump_for(50);
	assert_int_equal(count(b, ba, 0, 1), 1);
	assert_int_equal(count(a, ab, 0, 1), 1);
	assert_int_equal(nth_ok(b, ba, FR_CQE_RECV, 0)->imm, 5);
	assert_memory_equal(dst, src, 100);
}

static void test_close_drops_completions(void **state)
{
	struct ep *a = ep_open(0), *b = ep_open(1);
	uint8_t *src = tbuf(256 * KiB), *dst = tbuf(256 * KiB);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;
	const void *gone;
	int rc;

	connect_pair(a, b, &ab, &ba);
	fill(src, 256 * KiB, 2);
	smr = reg(a, src, 256 * KiB, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 256 * KiB, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	for (int i = 0; i < 8; i++) {
		rc = ops->write_imm(ab, smr, 0, &rk, 0, 256 * KiB, (uint32_t)i,
				    (uint64_t)i);
		if (rc == FR_EAGAIN)
			break;
		assert_int_equal(rc, 0);
	}
	gone = ab;
	ops->close_conn(ab);
	/* Nothing may surface naming the closed connection. */
	pump_for(50);
	for (size_t i = 0; i < a->ncq; i++)
		assert_ptr_not_equal(a->cq[i].conn, gone);
	/* Its sources are free again. */
	assert_int_equal(ops->dereg_mem(a->tp, smr), 0);
	/* The peer sees the close, once. */
	PUMP_UNTIL(n_err(b, ba) >= 1);
	assert_int_equal(first_err(b, ba), FR_EPEER);
	pump_for(50);
	assert_int_equal(n_err(b, ba), 1);
}

static void test_ipv6_loopback(void **state)
{
	struct ep *a = NULL, *b = NULL;
	uint8_t *src = tbuf(64 * KiB), *dst = tbuf(64 * KiB);
	struct fr_tp_conn *ab, *ba;
	struct fr_tp_mr *smr, *dmr;
	struct fr_tp_rkey rk;

	if (ep_try_open(0, NONCE, "::1", 0, DEADLINE_MS, &a) ||
	    ep_try_open(1, NONCE, "::1", 0, DEADLINE_MS, &b))
		skip();
	connect_pair(a, b, &ab, &ba);
	fill(src, 64 * KiB, 66);
	memset(dst, 0, 64 * KiB);
	smr = reg(a, src, 64 * KiB, FR_TP_LOCAL_READ);
	dmr = reg(b, dst, 64 * KiB, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	rk = rkey_of(b, dmr, a);
	post(ab, smr, 0, &rk, 0, 64 * KiB, 6, 6);
	PUMP_UNTIL(n_ok(b, ba, FR_CQE_RECV) == 1);
	assert_memory_equal(dst, src, 64 * KiB);
}

/* ---- TCP white-box: the wire format from the outside ------------------------
 */

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)v);
	put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

#define WB_MAGIC 0x43545246u

static void wb_hello(uint8_t *h, uint32_t magic, uint16_t version, int rank,
		     uint64_t nonce)
{
	put32(h, magic);
	put16(h + 4, version);
	put16(h + 6, 1);
	put32(h + 8, (uint32_t)rank);
	put32(h + 12, 0);
	put64(h + 16, nonce);
}

static void wb_header(uint8_t *h, uint8_t version, uint32_t imm, uint32_t id,
		      uint32_t gen, uint64_t off, uint32_t len)
{
	memset(h, 0, 32);
	h[0] = version;
	h[1] = 1;
	put32(h + 4, imm);
	put32(h + 8, id);
	put32(h + 12, gen);
	put64(h + 16, off);
	put32(h + 24, len);
}

static void wb_sendall(int fd, const void *buf, size_t len)
{
	assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* A plain socket to an IPv4 endpoint, taken from its address blob. */
static int wb_connect(const struct ep *e)
{
	struct sockaddr_in sa;
	int fd;

	/* util.h's address blob: magic 0xfa (tcp), version 1, family 4 */
	assert_int_equal(e->addrlen, 28);
	assert_int_equal(e->addr[0], 0xfa);
	assert_int_equal(e->addr[2], 4);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)(e->addr[4] | e->addr[5] << 8));
	memcpy(&sa.sin_addr, e->addr + 12, 4);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	return fd;
}

/* Read up to cap bytes until EOF, driving the endpoints meanwhile. */
static size_t wb_read_to_eof(int fd, uint8_t *buf, size_t cap)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	size_t have = 0;
	ssize_t n;

	for (;;) {
		pump();
		n = recv(fd, buf + have, cap - have, 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return have;
		if (n > 0)
			have += (size_t)n;
		else
			assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
		assert_true(have < cap);
		if (now_ms() > dl)
			fail_msg("the endpoint kept the connection open");
	}
}

static void wb_read_exact(int fd, uint8_t *buf, size_t len)
{
	uint64_t dl = now_ms() + DEADLINE_MS;
	size_t have = 0;
	ssize_t n;

	while (have < len) {
		pump();
		n = recv(fd, buf + have, len - have, 0);
		if (n > 0)
			have += (size_t)n;
		else if (n == 0)
			fail_msg("EOF after %zu of %zu bytes", have, len);
		else
			assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
		if (now_ms() > dl)
			fail_msg("got %zu of %zu bytes", have, len);
	}
}

static void wb_expect_refusal(struct ep *b, const uint8_t *hello, size_t len,
			      int status)
{
	uint8_t r[64];
	size_t n;
	int fd = wb_connect(b);

	wb_sendall(fd, hello, len);
	n = wb_read_to_eof(fd, r, sizeof(r));
	if (status) {
		assert_int_equal(n, 12);
		assert_int_equal(get32(r), WB_MAGIC);
		assert_int_equal(r[6], 2);
		assert_int_equal((int32_t)get32(r + 8), status);
	} else {
		assert_int_equal(n, 0);
	}
	close(fd);
}

static void test_tcp_wire_acceptor(void **state)
{
	uint8_t h[64], r[12], key[FR_TP_RKEY_MAX], payload[16];
	struct fr_tp_conn *c5, *c6, *x = NULL;
	struct gbuf region;
	struct fr_tp_mr *mr;
	size_t kl = sizeof(key);
	struct ep *b;
	int fd;

	if (strcmp(ops->name, "tcp"))
		skip();
	b = ep_open(1);
	/* Not our protocol at all: closed without a word. */
	memset(h, 'x', sizeof(h));
	memcpy(h, "GET / HTTP/1.0\r\n\r\n", 18);
	wb_expect_refusal(b, h, 24, 0);
	/* Our magic, another version / nonce / a negative rank. */
	wb_hello(h, WB_MAGIC, 99, 3, NONCE);
	wb_expect_refusal(b, h, 24, FR_EPROTO);
	wb_hello(h, WB_MAGIC, 1, 3, NONCE ^ 1);
	wb_expect_refusal(b, h, 24, FR_EAUTH);
	wb_hello(h, WB_MAGIC, 1, -4, NONCE);
	wb_expect_refusal(b, h, 24, FR_EPROTO);
	/* Half a hello, then gone. */
	fd = wb_connect(b);
	wb_sendall(fd, h, 10);
	close(fd);
	pump_for(30);
	assert_int_equal(ops->accept(b->tp, 3, &x), FR_EAGAIN);

	/* A well-formed peer: then a malformed header fails it (EPROTO). */
	fd = wb_connect(b);
	wb_hello(h, WB_MAGIC, 1, 5, NONCE);
	wb_sendall(fd, h, 24);
	wb_read_exact(fd, r, 12);
	assert_int_equal(get32(r), WB_MAGIC);
	assert_int_equal((int32_t)get32(r + 8), 0);
	c5 = accept_from(b, 5);
	wb_header(h, 9, 1, 0, 1, 0, 0);
	wb_sendall(fd, h, 32);
	PUMP_UNTIL(n_err(b, c5) == 1);
	assert_int_equal(first_err(b, c5), FR_EPROTO);
	assert_int_equal(wb_read_to_eof(fd, h, sizeof(h)), 0);
	close(fd);

	/* One good write as the header documents, then EOF mid-payload. */
	region = gbuf_new(256, 0);
	mr = reg(b, region.p, 256, FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
	assert_int_equal(ops->pack_rkey(mr, key, &kl), 0);
	assert_int_equal(kl, 20);
	assert_int_equal(key[0], 0xfc);
	assert_int_equal(get64(key + 12), 256);
	fd = wb_connect(b);
	wb_hello(h, WB_MAGIC, 1, 6, NONCE);
	wb_sendall(fd, h, 24);
	wb_read_exact(fd, r, 12);
	c6 = accept_from(b, 6);
	fill(payload, 16, 9);
	wb_header(h, 1, 0x77, get32(key + 4), get32(key + 8), 16, 16);
	memcpy(h + 32, payload, 16);
	wb_sendall(fd, h, 48);
	PUMP_UNTIL(n_ok(b, c6, FR_CQE_RECV) == 1);
	assert_int_equal(nth_ok(b, c6, FR_CQE_RECV, 0)->imm, 0x77);
	assert_memory_equal(region.p + 16, payload, 16);
	wb_header(h, 1, 0x78, get32(key + 4), get32(key + 8), 100, 100);
	memcpy(h + 32, payload, 10);
	wb_sendall(fd, h, 42);
	close(fd);
	PUMP_UNTIL(n_err(b, c6) == 1);
	assert_int_equal(first_err(b, c6), FR_EPEER);
	assert_int_equal(n_ok(b, c6, FR_CQE_RECV), 1);
	check_guards(&region);
}

static void test_tcp_wire_connector(void **state)
{
	uint8_t blob[28], key[20], h[96], r[12], *src;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct fr_tp_conn *c;
	struct fr_tp_rkey rk;
	struct fr_tp_mr *mr;
	uint64_t dl;
	struct ep *a;
	int lfd, fd = -1, one = 1, rc;

	if (strcmp(ops->name, "tcp"))
		skip();
	a = ep_open(0);
	/* A port where nobody listens yet. */
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	close(lfd);
	memset(blob, 0, sizeof(blob));
	blob[0] = 0xfa;
	blob[1] = 1;
	blob[2] = 4;
	put16(blob + 4, ntohs(sa.sin_port));
	memcpy(blob + 12, &sa.sin_addr, 4);
	assert_int_equal(ops->connect(a->tp, 1, blob, sizeof(blob), &c), 0);
	/* Refused, and refused again: it keeps trying. */
	dl = now_ms() + 300;
	while (now_ms() < dl)
		assert_int_equal(ops->connect_done(c), FR_EAGAIN);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(fcntl(lfd, F_SETFL, O_NONBLOCK), 0);
	dl = now_ms() + DEADLINE_MS;
	while (fd < 0) {
		assert_int_equal(ops->connect_done(c), FR_EAGAIN);
		fd = accept(lfd, NULL, NULL);
		if (now_ms() > dl)
			fail_msg("the retry never came");
	}
	close(lfd);
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	wb_read_exact(fd, h, 24);
	assert_int_equal(get32(h), WB_MAGIC);
	assert_int_equal(h[4] | h[5] << 8, 1);
	assert_int_equal(h[6] | h[7] << 8, 1);
	assert_int_equal(get32(h + 8), 0);
	assert_int_equal(get32(h + 12), 0);
	assert_true(get64(h + 16) == NONCE);
	put32(r, WB_MAGIC);
	put16(r + 4, 1);
	put16(r + 6, 2);
	put32(r + 8, 0);
	wb_sendall(fd, r, 12);
	dl = now_ms() + DEADLINE_MS;
	while ((rc = ops->connect_done(c)) == FR_EAGAIN)
		assert_true(now_ms() < dl);
	assert_int_equal(rc, 0);

	/* A key as a TCP peer would send it; then check the frame. */
	key[0] = 0xfc;
	key[1] = 1;
	put16(key + 2, 0);
	put32(key + 4, 3);
	put32(key + 8, 9);
	put64(key + 12, 4096);
	assert_int_equal(ops->unpack_rkey(a->tp, key, 20, &rk), 0);
	src = tbuf(8);
	fill(src, 8, 1);
	mr = reg(a, src, 8, FR_TP_LOCAL_READ);
	post(c, mr, 0, &rk, 16, 8, 0xabcdef01, 5);
	post(c, NULL, 0, NULL, 0, 0, 0x42, 6);
	wb_read_exact(fd, h, 40 + 32);
	assert_int_equal(h[0], 1);
	assert_int_equal(h[1], 1);
	assert_int_equal(h[2] | h[3], 0);
	assert_int_equal(get32(h + 4), 0xabcdef01);
	assert_int_equal(get32(h + 8), 3);
	assert_int_equal(get32(h + 12), 9);
	assert_true(get64(h + 16) == 16);
	assert_int_equal(get32(h + 24), 8);
	assert_int_equal(get32(h + 28), 0);
	assert_memory_equal(h + 32, src, 8);
	assert_int_equal(get32(h + 40 + 4), 0x42);
	assert_int_equal(get32(h + 40 + 24), 0);
	PUMP_UNTIL(n_ok(a, c, FR_CQE_SEND) == 2);
	close(fd);
	PUMP_UNTIL(n_err(a, c) == 1);
	assert_int_equal(first_err(a, c), FR_EPEER);
}

/* wake() ends a wait() in progress from another thread, and one that comes
 * later returns at once; without it wait() sleeps its full timeout. */
struct waker {
	struct fr_tp *tp;
	int delay_ms;
};

static void *waker_main(void *arg)
{
	struct waker *w = arg;

	sleep_ms(w->delay_ms);
	ops->wake(w->tp);
	return NULL;
}

static void test_wake(void **state)
{
	struct ep *a = ep_open(0);
	struct waker w = { .tp = a->tp, .delay_ms = 50 };
	struct fr_tp_cqe cqe[4];
	pthread_t t;
	uint64_t t0;

	(void)state;
	assert_non_null(ops->wake);
	assert_int_equal(ops->poll(a->tp, cqe, 4), 0);
	t0 = now_ms();
	assert_int_equal(ops->wait(a->tp, 100), 0);
	assert_true(now_ms() - t0 >= 90); /* nothing to wake it */
	assert_int_equal(pthread_create(&t, NULL, waker_main, &w), 0);
	assert_int_equal(ops->poll(a->tp, cqe, 4), 0);
	t0 = now_ms();
	assert_int_equal(ops->wait(a->tp, 10000), 0);
	assert_true(now_ms() - t0 < 5000);
	pthread_join(t, NULL);
	/* a wake before the wait is not lost (a poll in between may use it
	 * up: the caller looks then), and is used up by the wait */
	assert_int_equal(ops->poll(a->tp, cqe, 4), 0);
	ops->wake(a->tp);
	t0 = now_ms();
	assert_int_equal(ops->wait(a->tp, 10000), 0);
	assert_true(now_ms() - t0 < 5000);
	t0 = now_ms();
	assert_int_equal(ops->poll(a->tp, cqe, 4), 0);
	assert_int_equal(ops->wait(a->tp, 100), 0);
	assert_true(now_ms() - t0 >= 90);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
		T(test_wake),
		T(test_handshake),
		T(test_wrong_nonce),
		T(test_connect_refused_times_out),
		T(test_duplicate_rank),
		T(test_write_before_accept),
		T(test_pending),
		T(test_write_sizes),
		T(test_verbs_qps),
		T(test_verbs_resume),
		T(test_zero_length),
		T(test_write_inline),
		T(test_lines),
		T(test_fifo_many),
		T(test_bidirectional),
		T(test_tcp_rcvbuf),
		T(test_bounds_past_end),
		T(test_bounds_overflow),
		T(test_bounds_deregistered),
		T(test_bounds_no_remote_write),
		T(test_bounds_deregistered_large),
		T(test_backpressure),
		T(test_peer_exits_mid_transfer),
		T(test_peer_killed_while_sending),
		T(test_wait_idle_and_wake),
		T(test_wait_wakes_on_arrival),
		T(test_wait_wakes_on_room),
		T(test_small_after_large_wakes),
		T(test_malformed_rkey),
		T(test_malformed_addr),
		T(test_local_validation),
		T(test_close_drops_completions),
		T(test_ipv6_loopback),
		T(test_tcp_wire_acceptor),
		T(test_tcp_wire_connector),
#undef T
	};
	const char *name = getenv("FR_TEST_TRANSPORT");
	char err[256] = "";

	ssize_t el = readlink("/proc/self/exe", exe_path, sizeof(exe_path) - 1);

	if (el > 0)
		exe_path[el] = '\0';
	else
		strcpy(exe_path, "/proc/self/exe");
	if (getenv("FR_TCP_RCVBUF"))
		tcp_rcvbuf_env = strdup(getenv("FR_TCP_RCVBUF"));
	mux_nodes = getenv("FR_TEST_MUX_NODES") &&
		    !strcmp(getenv("FR_TEST_MUX_NODES"), "1");
	/* the unit tests' in-process transport (tests/fake_tp.c) too */
	fake_tp_install();
	if (argc > 7 && !strcmp(argv[1], "--child")) {
		ops = fr_transport_find(name && *name ? name : "tcp");
		/* the child never cleans up: _exit, as before the exec */
		_exit(child_main(argv));
	}

	if (!name || !*name)
		name = "tcp";
	ops = fr_transport_find(name);
	if (!ops) {
		fprintf(stderr, "test_transport: no transport named '%s'\n",
			name);
		return 1;
	}
	if (ops->probe(err, sizeof(err))) {
		fprintf(stderr, "test_transport: %s not usable here: %s\n",
			name, err);
		return 77; /* automake: skipped */
	}
	/* FR_TEST_ONLY=PATTERN runs the matching tests alone (a failure
	 * chased in the VM). */
	if (getenv("FR_TEST_ONLY") && *getenv("FR_TEST_ONLY"))
		cmocka_set_test_filter(getenv("FR_TEST_ONLY"));
	return cmocka_run_group_tests_name(name, tests, NULL, NULL);
}
