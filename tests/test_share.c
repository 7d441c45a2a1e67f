/* SPDX-License-Identifier: MIT */
/*
 * test_share.c - the shared endpoint (transports/share/fr_share.c) on its
 * own, over the in-process fake transport (fake_tp.c): the cases that a
 * job of communicators reaches only by timing.
 *
 *   - a write for a communicator id this rank has no view of yet (a peer
 *     that finished the split first) waits, unclaimed, and reaches the view
 *     that takes the id, in order, on that view's connection;
 *   - an id closed without a clean goodbye stays taken (quarantine), a
 *     late write for it reaches no view, and the regions it deregistered
 *     stay registered (dereg_mem says FR_EBUSY), so that a late write does
 *     not break the link; memory handed to the endpoint (fr_share_adopt)
 *     is released when it closes, not before;
 *   - a higher rank that needs a link the lower one does not open opens it
 *     itself after the grace period, and the lower one's view, which has no
 *     connection yet, finds the write waiting (pending()) and gets it once
 *     it accepts.
 *
 * Each test opens fake endpoints for two ranks in this process, shares
 * each (fr_share_new, as comm.c does), and drives both from this thread:
 * a fake write leaves when its writer polls, so every loop polls every
 * view.  Deadlines only bound a hang.
 */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_tp.h"
#include "fastreduce.h"
#include "transport.h"

#define N 2
#define DEADLINE_MS 5000
#define ID 5
/* a core immediate: type nibble and payload, no id bits */
#define IMM 0x30012345u

struct rank {
	struct fr_tp *tp;	     /* the real (fake) endpoint */
	const struct fr_tp_ops *ops; /* every view's */
	struct fr_tp *world;	     /* id 0 */
	struct fr_share *s;
	uint8_t buf[4096];
	struct fr_tp_mr *mr;
	struct fr_tp_rkey rkey; /* the other rank's key to buf */
};

static struct rank R[N];
static int released; /* buffers fr_share_adopt's release() was called on */

static void release_count(void *buf, size_t len)
{
	(void)len;
	free(buf);
	released++;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Two fake endpoints, each shared; buf registered through the world view,
 * and each rank holding the other's key. */
static void job_open(void)
{
	uint8_t addrs[N * FR_TP_ADDR_MAX], lens[N], blob[FR_TP_RKEY_MAX];

	fake_tp_install();
	fake_tp_reset();
	memset(R, 0, sizeof(R));
	for (int r = 0; r < N; r++) {
		struct fr_tp_params p = {.size = sizeof(p),
					 .rank = r,
					 .job_nonce = 0x5eed,
					 .timeout_ms = DEADLINE_MS,
					 .sq_depth = 64};
		size_t al = FR_TP_ADDR_MAX;

		assert_int_equal(fake_tp_ops.open(&p, &R[r].tp,
						  addrs + r * FR_TP_ADDR_MAX,
						  &al),
				 0);
		lens[r] = (uint8_t)al;
		assert_int_equal(fr_share_new(&fake_tp_ops, R[r].tp, r, N,
					      &R[r].ops, &R[r].world),
				 0);
		R[r].s = fr_share_of(R[r].world);
		assert_int_equal(R[r].ops->reg_mem(
					 R[r].world, R[r].buf, sizeof(R[r].buf),
					 FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
					 &R[r].mr),
				 0);
	}
	for (int r = 0; r < N; r++) {
		size_t bl = sizeof(blob);

		assert_int_equal(fr_share_set_addrs(R[r].s, addrs, lens), 0);
		assert_int_equal(R[r].ops->pack_rkey(R[r ^ 1].mr, blob, &bl),
				 0);
		assert_int_equal(
			R[r].ops->unpack_rkey(R[r].world, blob, bl, &R[r].rkey),
			0);
	}
}

static void job_close(void)
{
	for (int r = 0; r < N; r++) {
		assert_int_equal(R[r].ops->dereg_mem(R[r].world, R[r].mr), 0);
		fr_share_closing(R[r].world, true);
		R[r].ops->close(R[r].world); /* the last view: the endpoint */
	}
	assert_int_equal(fake_tp_endpoints(), 0);
}

/* A view of both ranks, endpoint ranks in the order given, with id. */
static struct fr_tp *view(int r, int first, int id)
{
	const int members[N] = {first, first ^ 1};
	const struct fr_tp_ops *ops;
	struct fr_tp *v;

	assert_int_equal(fr_share_view(R[r].s, members, N, &ops, &v), 0);
	assert_ptr_equal(ops, R[r].ops);
	if (id >= 0)
		assert_int_equal(fr_share_set_id(v, id), 0);
	return v;
}

static bool id_used(int r, int id)
{
	uint8_t used[FR_SHARE_IDS / 8];

	fr_share_ids_used(R[r].s, used);
	return used[id / 8] & 1u << (id % 8);
}

/* Poll each of the k views once; what comes is appended to got[i] (at most
 * 16 each, counted in n[i]). */
static void pump(struct fr_tp **v, const int *owner, int k,
		 struct fr_tp_cqe got[][16], int *n)
{
	for (int i = 0; i < k; i++) {
		int rc;

		if (!v[i])
			continue;
		rc = R[owner[i]].ops->poll(v[i], got[i] + n[i], 16 - n[i]);
		assert_true(rc >= 0);
		n[i] += rc;
	}
}

/* Drive until connect_done(c) of rank r's view says up (0), polling the
 * other views meanwhile; its result. */
static int until_up(int r, struct fr_tp_conn *c, struct fr_tp **v,
		    const int *owner, int k)
{
	struct fr_tp_cqe got[4][16];
	int n[4] = {0}, rc;
	double end = now_ms() + DEADLINE_MS;

	while ((rc = R[r].ops->connect_done(c)) == FR_EAGAIN &&
	       now_ms() < end) {
		memset(n, 0, sizeof(n));
		pump(v, owner, k, got, n);
		for (int i = 0; i < k; i++)
			assert_int_equal(n[i], 0); /* nothing to deliver */
	}
	return rc;
}

/* Drive until view i of v has a completion (or the deadline). */
static void until_one(struct fr_tp **v, const int *owner, int k, int i,
		      struct fr_tp_cqe got[][16], int *n)
{
	double end = now_ms() + DEADLINE_MS;

	while (!n[i] && now_ms() < end)
		pump(v, owner, k, got, n);
	assert_true(n[i] > 0);
}

/*
 * Rank 0 makes a view with id 5 (members in the order 1, 0: its rank 1 is
 * endpoint rank 0) and writes to rank 1, which has only its world view:
 * the write lands in rank 1's memory, and its completion waits unclaimed -
 * the world view gets nothing.  Then rank 1 makes its view with id 5: it
 * names endpoint rank 0 as pending (by its own rank, 1), accepts, and gets
 * the completion with the id stripped, on its own connection.  Closed
 * cleanly, the id is free again on both.
 */
static void test_unclaimed_then_claimed(void **state)
{
	struct fr_tp *v[3];
	int owner[3] = {0, 1, 1}, n[3] = {0}, peers[4];
	struct fr_tp_cqe got[3][16];
	struct fr_tp_conn *c0, *c1;
	uint8_t src[64];
	struct fr_tp_mr *smr;
	double end;

	(void)state;
	job_open();
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 7 + 1);
	assert_int_equal(R[0].ops->reg_mem(R[0].world, src, sizeof(src),
					   FR_TP_LOCAL_READ, &smr),
			 0);
	v[0] = view(0, 1, ID);
	v[1] = R[1].world;
	v[2] = NULL;
	assert_true(id_used(0, ID));
	assert_false(id_used(1, ID));
	/* view rank 0 is endpoint rank 1; the lower rank connects at once */
	assert_int_equal(R[0].ops->connect(v[0], 0, NULL, 0, &c0), 0);
	assert_int_equal(R[0].ops->conn_peer(c0), 0);
	assert_int_equal(until_up(0, c0, v, owner, 2), 0);
	/* two writes before rank 1 has the id, a third below */
	for (uint32_t k = 0; k < 2; k++)
		assert_int_equal(R[0].ops->write_imm(c0, smr, 0, &R[0].rkey,
						     128, sizeof(src), IMM + k,
						     7),
				 0);
	end = now_ms() + DEADLINE_MS;
	while (n[0] < 2 && now_ms() < end)
		pump(v, owner, 2, got, n);
	assert_int_equal(n[0], 2);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(got[0][k].kind, FR_CQE_SEND);
		assert_int_equal(got[0][k].status, 0);
		assert_true(got[0][k].ctx == 7); /* the id's bits stripped */
		assert_ptr_equal(got[0][k].conn, c0);
	}
	/* landed, and nothing for the world view however long it polls */
	end = now_ms() + 100;
	while (now_ms() < end)
		pump(v, owner, 2, got, n);
	assert_int_equal(n[1], 0);
	assert_memory_equal(R[1].buf + 128, src, sizeof(src));
	/* a view without an id receives nothing either */
	v[2] = view(1, 1, -1);
	pump(v, owner, 3, got, n);
	assert_int_equal(n[2], 0);
	assert_int_equal(R[1].ops->pending(v[2], peers, 4), 0);
	/* taking the id hands it what waited: pending() names rank 1 */
	assert_int_equal(fr_share_set_id(v[2], ID), 0);
	assert_int_equal(R[1].ops->pending(v[2], peers, 4), 1);
	assert_int_equal(peers[0], 1);
	/* a third write, for the id now known, before its connection */
	assert_int_equal(R[0].ops->write_imm(c0, smr, 0, &R[0].rkey, 128,
					     sizeof(src), IMM + 2, 7),
			 0);
	end = now_ms() + DEADLINE_MS;
	while (n[0] < 3 && now_ms() < end)
		pump(v, owner, 3, got, n);
	assert_int_equal(n[0], 3);
	assert_int_equal(n[2], 0); /* not before its connection is up */
	assert_int_equal(R[1].ops->accept(v[2], 1, &c1), 0);
	assert_int_equal(R[1].ops->connect_done(c1), 0);
	assert_int_equal(R[1].ops->pending(v[2], peers, 4), 0);
	pump(v, owner, 3, got, n);
	/* all three, in the order written */
	assert_int_equal(n[2], 3);
	for (uint32_t k = 0; k < 3; k++) {
		assert_int_equal(got[2][k].kind, FR_CQE_RECV);
		assert_int_equal(got[2][k].status, 0);
		assert_true(got[2][k].imm == IMM + k);
		assert_int_equal(got[2][k].len, sizeof(src));
		assert_ptr_equal(got[2][k].conn, c1);
	}
	assert_int_equal(R[1].ops->conn_peer(c1), 1);
	assert_int_equal(n[1], 0);
	/* a clean goodbye frees the id */
	for (int i = 0; i < 3; i += 2) {
		fr_share_closing(v[i], true);
		R[owner[i]].ops->close_conn(i ? c1 : c0);
		R[owner[i]].ops->close(v[i]);
	}
	assert_false(id_used(0, ID));
	assert_false(id_used(1, ID));
	assert_int_equal(R[0].ops->dereg_mem(R[0].world, smr), 0);
	job_close();
}

/*
 * Both ranks have a view with id 5 and a connection; rank 1 closes its
 * view without a clean goodbye, deregistering a region of it on the way.
 * The id stays taken on rank 1 (a new view cannot have it, another id
 * can); rank 0's late write into the old region still succeeds - the
 * region was kept - and comes to nobody; the link lives on.
 */
static void test_quarantine(void **state)
{
	struct fr_tp *v[3];
	int owner[3] = {0, 1, 0}, n[3] = {0}, peers[4];
	struct fr_tp_cqe got[3][16];
	struct fr_tp_conn *c0, *c1, *w0, *w1;
	uint8_t late[4096] = {0}, blob[FR_TP_RKEY_MAX], src[32] = {1, 2, 3};
	struct fr_tp_mr *lmr, *smr;
	struct fr_tp_rkey lkey;
	struct fr_tp *again;
	size_t bl = sizeof(blob);
	double end;

	(void)state;
	job_open();
	v[0] = view(0, 0, ID);
	v[1] = view(1, 0, ID);
	v[2] = R[0].world;
	assert_int_equal(R[0].ops->connect(v[0], 1, NULL, 0, &c0), 0);
	assert_int_equal(R[1].ops->connect(v[1], 0, NULL, 0, &c1), 0);
	assert_int_equal(until_up(0, c0, v, owner, 2), 0);
	assert_int_equal(until_up(1, c1, v, owner, 2), 0);
	assert_int_equal(
		R[1].ops->reg_mem(v[1], late, sizeof(late),
				  FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE, &lmr),
		0);
	assert_int_equal(R[1].ops->pack_rkey(lmr, blob, &bl), 0);
	assert_int_equal(R[0].ops->unpack_rkey(v[0], blob, bl, &lkey), 0);
	assert_int_equal(R[0].ops->reg_mem(R[0].world, src, sizeof(src),
					   FR_TP_LOCAL_READ, &smr),
			 0);
	/* rank 1 leaves without a goodbye */
	fr_share_closing(v[1], false);
	/* kept registered: the caller keeps the memory (late is in scope),
	 * or hands it to the endpoint, which frees it when it closes */
	assert_int_equal(R[1].ops->dereg_mem(v[1], lmr), FR_EBUSY);
	released = 0;
	assert_int_equal(fr_share_adopt(v[1], malloc(64), 64, release_count),
			 0);
	R[1].ops->close_conn(c1);
	R[1].ops->close(v[1]);
	v[1] = R[1].world;
	assert_true(id_used(1, ID));
	again = view(1, 0, -1);
	assert_int_equal(fr_share_set_id(again, ID), FR_EBUSY);
	assert_int_equal(fr_share_set_id(again, ID + 1), 0);
	fr_share_closing(again, true);
	R[1].ops->close(again);
	assert_false(id_used(1, ID + 1));
	/* the late write: kept memory, so no error on either side */
	assert_int_equal(
		R[0].ops->write_imm(c0, smr, 0, &lkey, 0, sizeof(src), IMM, 9),
		0);
	until_one(v, owner, 2, 0, got, n);
	assert_int_equal(got[0][0].kind, FR_CQE_SEND);
	assert_int_equal(got[0][0].status, 0);
	end = now_ms() + 100;
	while (now_ms() < end)
		pump(v, owner, 2, got, n);
	assert_int_equal(n[1], 0);
	assert_memory_equal(late, src, sizeof(src));
	/* the link is alive: the world views still talk over it */
	assert_int_equal(R[0].ops->connect(R[0].world, 1, NULL, 0, &w0), 0);
	assert_int_equal(until_up(0, w0, v, owner, 2), 0);
	assert_int_equal(R[0].ops->write_imm(w0, smr, 0, &R[0].rkey, 0,
					     sizeof(src), IMM, 11),
			 0);
	memset(n, 0, sizeof(n));
	end = now_ms() + DEADLINE_MS;
	while (now_ms() < end && !R[1].ops->pending(v[1], peers, 4))
		pump(v, owner, 2, got, n);
	assert_int_equal(R[1].ops->accept(v[1], 0, &w1), 0);
	assert_int_equal(R[1].ops->connect_done(w1), 0);
	until_one(v, owner, 2, 1, got, n);
	assert_int_equal(got[1][0].kind, FR_CQE_RECV);
	assert_int_equal(got[1][0].status, 0);
	assert_true(got[1][0].imm == IMM);
	assert_ptr_equal(got[1][0].conn, w1);
	fr_share_closing(v[0], true);
	R[0].ops->close_conn(c0);
	R[0].ops->close(v[0]);
	R[0].ops->close_conn(w0);
	R[1].ops->close_conn(w1);
	assert_int_equal(R[0].ops->dereg_mem(R[0].world, smr), 0);
	assert_int_equal(released, 0);
	job_close();
	assert_int_equal(released, 1);
}

/*
 * Rank 1 (the higher) wants the link to rank 0, which does not: it waits
 * the grace period for rank 0 to connect, then connects itself (one
 * connection, from 1 to 0).  Its write reaches rank 0's view, which has
 * no connection to it: pending() names it, and after accept() the
 * completion comes.
 */
static void test_grace_link(void **state)
{
	struct fr_tp *v[2];
	int owner[2] = {0, 1}, n[2] = {0}, peers[4];
	struct fr_tp_cqe got[2][16];
	struct fr_tp_conn *c0, *c1;
	uint8_t src[16] = {42};
	struct fr_tp_mr *smr;
	double t0, end;

	(void)state;
	job_open();
	v[0] = view(0, 0, ID);
	v[1] = view(1, 0, ID);
	assert_int_equal(R[1].ops->reg_mem(R[1].world, src, sizeof(src),
					   FR_TP_LOCAL_READ, &smr),
			 0);
	t0 = now_ms();
	assert_int_equal(R[1].ops->connect(v[1], 0, NULL, 0, &c1), 0);
	assert_int_equal(until_up(1, c1, v, owner, 2), 0);
	/* not before the grace period (a lower bound: no timing race) */
	assert_true(now_ms() - t0 >= 300 - 20);
	assert_int_equal(fake_tp_connects(1, 0), 1);
	assert_int_equal(fake_tp_connects(0, 1), 0);
	assert_int_equal(R[1].ops->write_imm(c1, smr, 0, &R[1].rkey, 64,
					     sizeof(src), IMM, 3),
			 0);
	end = now_ms() + DEADLINE_MS;
	while (now_ms() < end && !R[0].ops->pending(v[0], peers, 4))
		pump(v, owner, 2, got, n);
	assert_int_equal(R[0].ops->pending(v[0], peers, 4), 1);
	assert_int_equal(peers[0], 1);
	assert_int_equal(n[0], 0);
	assert_int_equal(R[0].ops->accept(v[0], 1, &c0), 0);
	assert_int_equal(R[0].ops->connect_done(c0), 0);
	until_one(v, owner, 2, 0, got, n);
	assert_int_equal(got[0][0].kind, FR_CQE_RECV);
	assert_true(got[0][0].imm == IMM);
	assert_ptr_equal(got[0][0].conn, c0);
	assert_int_equal(R[0].buf[64], 42);
	for (int r = 0; r < N; r++) {
		fr_share_closing(v[r], true);
		R[r].ops->close_conn(r ? c1 : c0);
		R[r].ops->close(v[r]);
	}
	assert_int_equal(R[1].ops->dereg_mem(R[1].world, smr), 0);
	job_close();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unclaimed_then_claimed),
		cmocka_unit_test(test_quarantine),
		cmocka_unit_test(test_grace_link),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
