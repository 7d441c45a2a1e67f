/* SPDX-License-Identifier: MIT */
/*
 * test_select.c - the algorithm choice (src/algo/select.c): the cost model's
 * shape, FR_ALGO forcing, agreement inputs, and the tune file parser.
 */
/* clang-format off: cmocka.h needs these first, in this order */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algo.h"
#include "internal.h"

static struct fr_comm comm;

static int setup(void **state)
{
	char err[256];

	(void)state;
	memset(&comm, 0, sizeof(comm));
	comm.nranks = 8;
	comm.peer.mbx_slot_size = 64 + 32768;
	comm.algo.segment_bytes = 512u << 10;
	unsetenv("FR_TUNE_FILE");
	assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)), 0);
	return 0;
}

static const struct fr_algo *choose_memo(enum fr_coll coll, size_t count,
					 fr_dtype_t dt, int forced)
{
	struct fr_request req = {.comm = &comm,
				 .coll = coll,
				 .count = count,
				 .dtype = dt,
				 .forced = forced};

	return fr_algo_select(&comm, &req);
}

/* The tests change the communicator's parameters and layout directly,
 * which a running one never does: each choice is made afresh. */
static const struct fr_algo *choose(enum fr_coll coll, size_t count,
				    fr_dtype_t dt, int forced)
{
	memset(comm.algo.memo, 0, sizeof(comm.algo.memo));
	return choose_memo(coll, count, dt, forced);
}

/*
 * fr_algo_select remembers its last choices: the same request gets the
 * same answer without the model, a new size or type asks it, more sizes
 * than the memo holds push the oldest out, and new parameters
 * (fr_tune_set) make every choice afresh.
 */
static void test_memo(void **state)
{
	struct fr_tune t = comm.algo.tune;
	const struct fr_algo *big;

	(void)state;
	comm.nranks = 4;
	memset(comm.algo.memo, 0, sizeof(comm.algo.memo));
	assert_ptr_equal(choose_memo(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			 &fr_algo_rd);
	big = choose_memo(FR_COLL_ALLREDUCE, 16u << 20, FR_F32, 0);
	assert_ptr_not_equal(big, &fr_algo_rd);
	/* a parameter changed behind the memo's back: the old answer */
	comm.algo.tune.alpha_us = 1000;
	comm.algo.tune.msg_us = 25;
	assert_ptr_equal(choose_memo(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			 &fr_algo_rd);
	/* another type is another question */
	assert_ptr_equal(choose_memo(FR_COLL_ALLREDUCE, 2, FR_I32, 0),
			 &fr_algo_oneshot);
	/* fr_tune_set forgets */
	t.alpha_us = 1000;
	t.msg_us = 25;
	fr_tune_set(&comm, &t);
	assert_ptr_equal(choose_memo(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			 &fr_algo_oneshot);
	/* FR_ALGO_MEMO other sizes push the first one out */
	for (size_t k = 0; k < FR_ALGO_MEMO; k++)
		(void)choose_memo(FR_COLL_ALLREDUCE, 100 + k, FR_F32, 0);
	comm.algo.tune.alpha_us = 1; /* behind its back again */
	comm.algo.tune.msg_us = 2.5;
	assert_ptr_equal(choose_memo(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			 &fr_algo_rd);
}

static void test_names(void **state)
{
	fr_algo_t a;

	(void)state;
	for (int i = 0; i < FR_ALGO_COUNT; i++) {
		assert_int_equal(fr_algo_from_name(fr_algo_name(i), &a), 0);
		assert_int_equal(a, i);
	}
	assert_string_equal(fr_algo_name(-1), "?");
	assert_string_equal(fr_algo_name(FR_ALGO_COUNT), "?");
	assert_int_equal(fr_algo_from_name("recursive_doubling", &a), 0);
	assert_int_equal(a, FR_ALGO_RD);
	assert_int_equal(fr_algo_from_name("Ring", &a), FR_EINVAL);
	assert_int_equal(fr_algo_from_name(NULL, &a), FR_EINVAL);
	assert_int_equal(fr_algo_from_name("ring", NULL), FR_EINVAL);
}

/* A power of two ranks (Rabenseifner's hypercube, no fold). */
static bool pof2(int n)
{
	return n > 0 && !(n & (n - 1));
}

/* Latency-bound sizes get recursive doubling (on a LAN the one-shot's
 * extra messages cost more than the steps they save), bandwidth-bound
 * the ring, or on a power of two ranks Rabenseifner, whose zero-copy
 * steps (xfer.c) move the same bytes in 4 lg p latencies instead of 2p
 * (fr_sim, 64 ranks flat at 100 Gbit/s: 10.62 ms for 10.57 at 64 MiB,
 * 2.69 for 2.89 at 16 MiB; 4 ranks over TCP here: the same at 16 and 64
 * MiB); and the predicted time grows with the size for every algorithm. */
static void test_allreduce_shape(void **state)
{
	static const int ids[] = {FR_ALGO_RING, FR_ALGO_RD,
				  FR_ALGO_RABENSEIFNER, FR_ALGO_ONESHOT};

	(void)state;
	for (int n = 2; n <= 64; n++) {
		comm.nranks = n;
		const struct fr_algo *big =
			choose(FR_COLL_ALLREDUCE, 64u << 20, FR_F32, 0);

		assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
				 &fr_algo_rd);
		assert_true(big == &fr_algo_ring ||
			    (pof2(n) && big == &fr_algo_rabenseifner));
		for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
			int id = ids[i];
			double prev = -1;

			for (size_t b = 8; b <= (1u << 28); b *= 4) {
				double t = fr_algo_predict_us(&comm, id,
							      FR_COLL_ALLREDUCE,
							      b, FR_F32);

				assert_true(t > prev);
				prev = t;
			}
		}
	}
	/* one rank: nothing to predict */
	comm.nranks = 1;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
				       1000, FR_F32) == 0);
}

/*
 * The one-shot's extra messages cost a rank's own work (msg), not the
 * link's latency: over a long link (alpha far above msg) it wins on small
 * buffers from 3 to 8 ranks, where with msg = 2.5 alpha (the built-in
 * parameters) recursive doubling does; on large ones the ring still does
 * (or on a power of two Rabenseifner, as in test_allreduce_shape).
 */
static void test_oneshot_long_link(void **state)
{
	struct fr_tune saved = comm.algo.tune;
	const struct fr_algo *big;

	(void)state;
	comm.nranks = 4;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_rd);
	comm.algo.tune.alpha_us = 1000; /* 1 ms one way */
	comm.algo.tune.msg_us = 25;
	for (int n = 3; n <= 8; n++) {
		comm.nranks = n;
		assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
				 &fr_algo_oneshot);
		assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1024, FR_F32, 0),
				 &fr_algo_oneshot);
		big = choose(FR_COLL_ALLREDUCE, 256u << 20, FR_F32, 0);
		assert_true(big == &fr_algo_ring ||
			    (pof2(n) && big == &fr_algo_rabenseifner));
	}
	/* forced: any size */
	assert_ptr_equal(
		choose(FR_COLL_ALLREDUCE, 256u << 20, FR_F32, FR_ALGO_ONESHOT),
		&fr_algo_oneshot);
	comm.algo.tune = saved;
}

static void layout(int n, int k, bool regular);

/*
 * The mailbox's window: a stream to one peer moves at most its slots per
 * round trip.  On 64 ranks over a fast link that is also long (384
 * Gbit/s, 73 us: a tune file fr_step projects from), 25 MiB by
 * Rabenseifner was window-bound, about 2 (p-1)/p n x 2 alpha / W: fr_sim
 * found it 2.7 times the ring there (29.6 ms against 10.9).  Its steps of
 * 8 payloads or more now go zero copy (xfer.c), past the window: fr_sim
 * finds 2.83 ms (the ring 10.27), the model about that, and it is chosen.
 * Smaller steps, and recursive doubling's, still stream through the
 * window; on a short link, or a slow one, it is no limit; payload 0
 * (unknown) leaves it out.
 */
static void test_mailbox_window(void **state)
{
	struct fr_tune saved = comm.algo.tune;
	size_t n = 25u << 20, pm = 32768;
	double w = 8.0 * pm, rab, bound, want;

	(void)state;
	comm.nranks = 64;
	comm.peer.mbx_slot_size = 64 + pm;
	comm.algo.tune.alpha_us = 73.2;
	comm.algo.tune.beta_ns = 8 / 384.32;
	comm.algo.tune.copy_ns = 0.001;
	comm.algo.tune.gamma_ns[FR_F32] = 0.024;
	/* the simulator's network: no TCP stream to start afresh */
	comm.algo.tune.step_ramp = 0;
	rab = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER,
				 FR_COLL_ALLREDUCE, n, FR_F32);
	bound = 2.0 * 63 / 64 * (double)n * 2 * 73.2 / w;
	assert_true(rab < 0.2 * bound);
	/* 4 lg p latencies (a READY a step), the wire and the reduction:
	 * fr_sim's 2.83 ms, which reduces for free, and 0.62 ms */
	want = 24 * 73.2 + 2.0 * 63 / 64 * (double)n * 8 / 384.32 * 1e-3 +
	       63.0 / 64 * (double)n * 0.024e-3;
	if (fabs(rab - want) > 1e-9 * want)
		fail_msg("rabenseifner at 25 MiB: %.3f us, want %.3f", rab,
			 want);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, n / 4, FR_F32, 0),
			 &fr_algo_rabenseifner);
	/* recursive doubling's steps are windowed: 6 of 1 MiB, each
	 * W at once and 3 W a round trip after the other */
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RD, FR_COLL_ALLREDUCE,
				       1u << 20, FR_F32) >=
		    6.0 * 3 * 2 * 73.2);
	/* a message within the window waits for no credit */
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RD, FR_COLL_ALLREDUCE,
				       w, FR_F32) ==
		    fr_model_predict_us(&comm.algo.tune, 64, 0, FR_ALGO_RD,
					FR_COLL_ALLREDUCE, w, FR_F32));
	/* a short link (2 us: 384 Gbit/s x 4 us is less than W): the
	 * window is no limit, Rabenseifner wins */
	comm.algo.tune.alpha_us = 2;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, n / 4, FR_F32, 0),
			 &fr_algo_rabenseifner);
	/* a slow long one: the wire, not the window */
	comm.algo.tune.alpha_us = 73.2;
	comm.algo.tune.beta_ns = 8.0;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RD, FR_COLL_ALLREDUCE,
				       1u << 20, FR_F32) ==
		    fr_model_predict_us(&comm.algo.tune, 64, 0, FR_ALGO_RD,
					FR_COLL_ALLREDUCE, 1u << 20, FR_F32));
	/* the one-shot folds its peers' streams in rank order, so their
	 * windows add up: 1 MiB on 4 ranks over a 5 ms link (measured on
	 * TCP in namespaces: 163 ms, Rabenseifner 88, the ring 53) is not
	 * the one-shot's; 64 KiB, within the window, still is */
	comm.nranks = 4;
	comm.algo.tune.alpha_us = 5000;
	comm.algo.tune.beta_ns = 8;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_ONESHOT,
				       FR_COLL_ALLREDUCE, 1u << 20, FR_F32) >=
		    3 * ((1u << 20) / w - 1) * 2 * 5000);
	assert_ptr_not_equal(
		choose(FR_COLL_ALLREDUCE, (1u << 20) / 4, FR_F32, 0),
		&fr_algo_oneshot);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (64u << 10) / 4, FR_F32, 0),
			 &fr_algo_oneshot);
	/* on nodes (two of 8 ranks, a 1 ms link): hier's 8 steps above the
	 * node (4 lanes) stream a 1 MiB chunk each through the window;
	 * Rabenseifner's step across the link, n/16 to its peer, goes zero
	 * copy: the wire the node's 8 ranks share and a READY, and the
	 * whole All-Reduce takes less than half the window's round trips
	 * for that step alone */
	layout(16, 8, true);
	comm.algo.tune.alpha_us = 1000;
	comm.algo.tune.beta_ns = 0.08;
	n = 64u << 20;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER,
				       FR_COLL_ALLREDUCE, n, FR_F32) <
		    0.5 * 2 * ((double)n / 16 / w - 1) * 2 * 1000);
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER, FR_COLL_ALLREDUCE,
				       n, FR_F32) >=
		    8 * ((1u << 20) / w - 1) * 2 * 1000);
	comm.algo.tune = saved;
	comm.peer.mbx_slot_size = 64 + 32768;
}

/*
 * The double binary tree's trees (dbtree.c) on 1 to 1,100 ranks: one root
 * and n - 1 edges each, every parent naming its children and every child
 * its parent, ceil(lg n) + 1 levels at most, and no rank inner in both
 * trees (one, where n is odd).
 */
static void test_dbtree_shape(void **state)
{
	(void)state;
	for (int n = 1; n <= 1100; n++) {
		int both = 0, levels = 1;

		while ((1 << (levels - 1)) < n)
			levels++;
		for (int t = 0; t < 2; t++) {
			int roots = 0, edges = 0;

			for (int r = 0; r < n; r++) {
				int p, c[2], nc, pc[2], pn, d = 0, x = r;
				bool named = false;

				fr_dbtree_shape(n, r, t, &p, c, &nc);
				assert_true(nc >= 0 && nc <= 2);
				for (int i = 0; i < nc; i++) {
					int cp, cc[2], cn;

					fr_dbtree_shape(n, c[i], t, &cp, cc,
							&cn);
					assert_int_equal(cp, r);
				}
				if (p < 0) {
					roots++;
				} else {
					edges++;
					fr_dbtree_shape(n, p, t, &x, pc, &pn);
					for (int i = 0; i < pn; i++)
						named |= pc[i] == r;
					assert_true(named);
					x = r;
				}
				while (x >= 0 && d <= levels) {
					fr_dbtree_shape(n, x, t, &x, pc, &pn);
					d++;
				}
				assert_true(d <= levels);
			}
			assert_int_equal(roots, 1);
			assert_int_equal(edges, n - 1);
		}
		for (int r = 0; r < n; r++) {
			int p, c[2], n0, n1;

			fr_dbtree_shape(n, r, 0, &p, c, &n0);
			fr_dbtree_shape(n, r, 1, &p, c, &n1);
			both += n0 && n1;
		}
		assert_int_equal(both, n > 1 ? n % 2 : 0);
	}
}

/*
 * Where the double binary tree was chosen, and is not since Rabenseifner's
 * large steps went zero copy: fr_sim, over 400 Gbit/s links of 5 us with
 * free CPUs (one rank a node):
 *   - on 256 ranks recursive doubling is the best at 64 KiB (50.6 us,
 *     Rabenseifner 82.7, the tree 89.1), and Rabenseifner, whose large
 *     steps go zero copy (xfer.c), from 1 MiB (152, the tree 169) to 16
 *     MiB (823, the tree 2,108, the ring 3,219); at 256 and 512 KiB the
 *     two are within 2 % (the model: 101.1 and 100.9 us at 256 KiB,
 *     predicting within 3 % of fr_sim at every size here);
 *   - on 384 (not a power of two: Rabenseifner's fold and unfold send
 *     the whole vector, now zero copy too) Rabenseifner is, at 4 MiB
 *     (481 us, the tree 852) and 16 MiB (1,505, the tree 2,992; the ring,
 *     auto's choice before, 4,500), and ties at 1 MiB (210, 215).  With
 *     the fold through the mailbox it took 485 and 1,613 us at 1 and 4
 *     MiB, and the tree was the best there.
 * The model chooses as the simulator there.
 */
static void test_dbtree_choice(void **state)
{
	struct fr_tune saved = comm.algo.tune;
	size_t slot = comm.peer.mbx_slot_size;

	(void)state;
	comm.nranks = 256;
	comm.peer.mbx_slot_size = fr_mbx_slot_size(256, 0);
	comm.algo.tune.alpha_us = 5;
	comm.algo.tune.beta_ns = 8 / 400.0;
	comm.algo.tune.copy_ns = 0.001;
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		comm.algo.tune.gamma_ns[d] = 0.001;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (64u << 10) / 4, FR_F32, 0),
			 &fr_algo_rd);
	for (size_t b = 1u << 20; b <= (16u << 20); b *= 4)
		assert_ptr_equal(choose(FR_COLL_ALLREDUCE, b / 4, FR_F32, 0),
				 &fr_algo_rabenseifner);
	comm.nranks = 384;
	comm.peer.mbx_slot_size = fr_mbx_slot_size(384, 0);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (4u << 20) / 4, FR_F32, 0),
			 &fr_algo_rabenseifner);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (16u << 20) / 4, FR_F32, 0),
			 &fr_algo_rabenseifner);
	/* on few ranks it is never the choice: rd, Rabenseifner or the ring
	 * win at every size */
	comm.nranks = 8;
	for (size_t n = 1; n <= (64u << 20); n *= 4)
		assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, n, FR_F32, 0),
				     &fr_algo_dbtree);
	comm.algo.tune = saved;
	comm.peer.mbx_slot_size = slot;
}

static void test_forced_and_others(void **state)
{
	(void)state;
	comm.nranks = 6;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, FR_ALGO_RING),
			 &fr_algo_ring);
	assert_ptr_equal(
		choose(FR_COLL_ALLREDUCE, 1u << 26, FR_F32, FR_ALGO_RD),
		&fr_algo_rd);
	assert_ptr_equal(
		choose(FR_COLL_ALLREDUCE, 1000, FR_F32, FR_ALGO_RABENSEIFNER),
		&fr_algo_rabenseifner);
	/* a forced algorithm the collective does not have: auto's choice */
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, FR_ALGO_PAIRWISE),
			 &fr_algo_rd);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, FR_ALGO_TREE),
			 &fr_algo_dbtree);
	assert_ptr_equal(choose(FR_COLL_REDUCE_SCATTER, 2, FR_F32, FR_ALGO_RD),
			 &fr_algo_bruck_rsag);
	assert_ptr_equal(choose(FR_COLL_ALLGATHER, 1u << 20, FR_U8, 0),
			 &fr_algo_ring);
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 2, FR_F32, FR_ALGO_RING),
			 &fr_algo_bcast_chain);
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 2, FR_F32, FR_ALGO_RD),
			 &fr_algo_bcast_tree);
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 2, FR_F32, 0),
			 &fr_algo_bcast_tree);
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 1u << 28, FR_U8, 0),
			 &fr_algo_bcast_chain);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_U8, FR_ALGO_RING),
			 &fr_algo_dissemination);
}

/*
 * The collectives of the communicators issue: reduce takes the binomial
 * tree for small vectors and the chain for large ones; all-to-all Bruck
 * for small blocks on many ranks, pairwise for large blocks (Bruck
 * forwards each block lg(n)/2 times); all-to-allv only pairwise, the
 * v-collectives only their ring; a forced algorithm they lack is auto's.
 */
static void test_new_collectives(void **state)
{
	(void)state;
	comm.nranks = 16;
	assert_ptr_equal(choose(FR_COLL_REDUCE, 2, FR_F32, 0),
			 &fr_algo_reduce_tree);
	assert_ptr_equal(choose(FR_COLL_REDUCE, 1u << 26, FR_F32, 0),
			 &fr_algo_reduce_chain);
	assert_ptr_equal(choose(FR_COLL_REDUCE, 2, FR_F32, FR_ALGO_RING),
			 &fr_algo_reduce_chain);
	assert_ptr_equal(choose(FR_COLL_REDUCE, 2, FR_F32, FR_ALGO_PAIRWISE),
			 &fr_algo_reduce_tree);
	/* count is per block: 16 blocks */
	assert_ptr_equal(choose(FR_COLL_ALLTOALL, 1, FR_F32, 0),
			 &fr_algo_bruck);
	assert_ptr_equal(choose(FR_COLL_ALLTOALL, 1u << 20, FR_F32, 0),
			 &fr_algo_pairwise);
	assert_ptr_equal(choose(FR_COLL_ALLTOALL, 1, FR_F32, FR_ALGO_PAIRWISE),
			 &fr_algo_pairwise);
	assert_ptr_equal(
		choose(FR_COLL_ALLTOALL, 1u << 20, FR_F32, FR_ALGO_BRUCK),
		&fr_algo_bruck);
	assert_ptr_equal(choose(FR_COLL_ALLTOALLV, 0, FR_F32, FR_ALGO_BRUCK),
			 &fr_algo_pairwise);
	assert_ptr_equal(choose(FR_COLL_ALLGATHERV, 100, FR_F32, FR_ALGO_TREE),
			 &fr_algo_vring);
	assert_ptr_equal(choose(FR_COLL_REDUCE_SCATTERV, 100, FR_F32, 0),
			 &fr_algo_vring);
}

/* Emulate nodes of k consecutive ranks, seen from rank 0. */
static int local_ranks[64], cross_ranks[1024], node_of[1024];
static void layout(int n, int k, bool regular)
{
	comm.nranks = n;
	comm.rank = 0;
	comm.topo.nnodes = (n + k - 1) / k;
	comm.topo.nodes_regular = regular;
	comm.topo.nlocal = k;
	comm.topo.local_index = 0;
	for (int i = 0; i < k; i++)
		local_ranks[i] = i;
	comm.topo.local = local_ranks;
	comm.topo.ncross = regular ? comm.topo.nnodes : 0;
	comm.topo.cross_index = 0;
	for (int i = 0; i < comm.topo.ncross; i++)
		cross_ranks[i] = i * k;
	comm.topo.cross = cross_ranks;
	for (int r = 0; r < n; r++)
		node_of[r] = r / k;
	comm.topo.node_of = node_of;
	comm.algo.hc_local_known = false;
	/* consecutive ranks: the ring leaves our node once (comm.c) */
	comm.topo.ring_crossings = comm.topo.nnodes > 1;
}

/* Two nodes with k > 1 ranks each: large All-Reduces go two-level,
 * tiny ones stay with recursive doubling; on one node, on irregular
 * layouts or with one rank per node hier is never chosen, and forcing it
 * there falls back to the model's choice. */
static void test_hier_choice(void **state)
{
	(void)state;
	for (int k = 2; k <= 4; k++)
		for (int m = 2; m <= 4; m++) {
			layout(k * m, k, true);
			/* two nodes: the link carries 1 vector instead of
			 * 2 (p-1)/p, worth the mailbox copies */
			if (m == 2)
				assert_ptr_equal(choose(FR_COLL_ALLREDUCE,
							16u << 20, FR_F32, 0),
						 &fr_algo_hier);
			assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
					 &fr_algo_rd);
			assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER,
						       FR_COLL_ALLREDUCE,
						       64u << 20, FR_F32) > 0);
			/* not for broadcast */
			assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER,
						       FR_COLL_BROADCAST,
						       1000, FR_F32) < 0);
		}
	layout(5, 2, false);
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 16u << 20, FR_F32, 0),
			     &fr_algo_hier);
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 16u << 20, FR_F32,
				    FR_ALGO_HIER),
			     &fr_algo_hier);
	layout(4, 4, true); /* one node */
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16u << 20, FR_F32,
				FR_ALGO_HIER),
			 &fr_algo_ring);
	layout(4, 1, true); /* one rank per node */
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER, FR_COLL_ALLREDUCE,
				       1000, FR_F32) < 0);
	layout(8, 2, true);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, FR_ALGO_HIER),
			 &fr_algo_hier);
}

/*
 * Rabenseifner on 128 nodes of 8 consecutive ranks: its first 3 steps
 * (pairs 1, 2 and 4 apart) stay on the node, and carry 7/8 of its bytes
 * each way at 2 copies a byte; the other 7 cross the link, which the
 * node's 8 ranks share (8 beta + copy a byte).  The model's time is that
 * closed form, at 2 MiB it is chosen over hier (the simulator's best,
 * perf/sim/README.md), and with the ranks dealt round robin over the
 * nodes (steps 7 to 9 at home, which carry little) it is slower.  The
 * steps that cross the link start their streams afresh (step_ramp of
 * their wire time, TCP's built-in 0.03); those on the node do not.
 */
static void test_rab_node_steps(void **state)
{
	const struct fr_tune *t = &comm.algo.tune;
	double n = 2u << 20, a = t->alpha_us, b = t->beta_ns * 1e-3;
	double c = t->copy_ns * 1e-3, g = t->gamma_ns[FR_F32] * 1e-3;
	/* its steps of 8 payloads (256 KiB) and more go zero copy
	 * (xfer.c): steps 0 to 2, on the node, still 2 copies a byte */
	double want = 20 * a + 2 * n * (1 - 1.0 / 8) * 2 * c +
		      2 * n * (1.0 / 8 - 1.0 / 1024) *
			      (8 * b * (1 + t->step_ramp) + c) +
		      1023.0 / 1024 * n * g;
	double got, rr;

	(void)state;
	layout(1024, 8, true);
	got = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER,
				 FR_COLL_ALLREDUCE, (size_t)n, FR_F32);
	if (fabs(got - want) > 1e-9 * want)
		fail_msg("rabenseifner at 2 MiB: %.6f us, want %.6f", got,
			 want);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n, FR_F32, 0),
			 &fr_algo_rabenseifner);
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER, FR_COLL_ALLREDUCE,
				       (size_t)n, FR_F32) > got);
	for (int r = 0; r < 1024; r++)
		node_of[r] = r % 128;
	comm.algo.hc_local_known = false;
	rr = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER, FR_COLL_ALLREDUCE,
				(size_t)n, FR_F32);
	assert_true(rr > 2 * got);
}

/*
 * The node's own steps (select.c): fr_sim's star of 1,024 ranks, 128
 * nodes of 8, 2 us and 100 Gbit/s between nodes, 0.5 us and 200 Gbit/s
 * within, nothing for copies and reductions (the simulator does not
 * charge them).  The ring's 2 (p-1) steps walk back round it, 1/8 of
 * them across a link: 8 B in 1,409.3 us (simulated 1,407.6; all at alpha
 * 4,094) and at 16 MiB a step of 16 KiB takes the average hop's 1.42 us
 * (simulated 2,917.7 in all).  The model's choice is the simulator's best
 * at each size (perf/sim/README.md): rd, Rabenseifner at 256 KiB and 2
 * MiB (the tree had been chosen at 256 KiB, 1.23 times it), the ring from
 * 16 MiB.  Unset, the local terms leave the model as it was.
 */
static void test_node_local_steps(void **state)
{
	struct fr_tune *t = &comm.algo.tune;
	double p = 1024, plain;
	double hop8 =
		(2 + 8 / p * 0.08e-3) / 8 + (0.5 + 8 / p * 0.04e-3) * 7 / 8;
	double s16 = (16u << 20) / p;
	double hop16 = (2 + s16 * 0.08e-3) / 8 + (0.5 + s16 * 0.04e-3) * 7 / 8;
	static const struct {
		size_t bytes;
		const struct fr_algo *algo;
	} best[] = {
		{8, &fr_algo_rd},
		{512, &fr_algo_rd},
		{4096, &fr_algo_rd},
		{32768, &fr_algo_rabenseifner},
		{256u << 10, &fr_algo_rabenseifner},
		{2u << 20, &fr_algo_rabenseifner},
		{16u << 20, &fr_algo_ring},
		{64u << 20, &fr_algo_ring},
	};

	(void)state;
	layout(1024, 8, true);
	comm.peer.mbx_slot_size = 64 + 3072; /* 32 MiB over 1,024 ranks */
	t->alpha_us = 2;
	t->beta_ns = 0.08;
	t->copy_ns = 0;
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		t->gamma_ns[d] = 0;
	/* unset: every hop at alpha, the node link's bytes on top */
	assert_true(fabs(fr_algo_predict_us(&comm, FR_ALGO_RING,
					    FR_COLL_ALLREDUCE, 8, FR_F32) -
			 (2 * (p - 1) + 1) * 2 -
			 2 * (p - 1) / p * 8 * 0.08e-3) < 1e-6);
	t->local_alpha_us = 0.5;
	t->local_beta_ns = 0.04;
	assert_true(fabs(fr_algo_predict_us(&comm, FR_ALGO_RING,
					    FR_COLL_ALLREDUCE, 8, FR_F32) -
			 (2 + 2 * (p - 1) * hop8)) < 1e-6);
	assert_true(
		fabs(fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
					16u << 20, FR_F32) -
		     (2 + 2 * (p - 1) * hop16)) < 1e-6);
	/* reduce-scatter: p - 1 of the same steps, 16 KiB each */
	assert_true(fabs(fr_algo_predict_us(&comm, FR_ALGO_RING,
					    FR_COLL_REDUCE_SCATTER, 16u << 20,
					    FR_F32) -
			 (2 + (p - 1) * hop16)) < 1e-6);
	for (size_t i = 0; i < sizeof(best) / sizeof(best[0]); i++) {
		const struct fr_algo *a =
			choose(FR_COLL_ALLREDUCE, best[i].bytes / 4, FR_F32, 0);

		if (a != best[i].algo)
			fail_msg("%zu B: %s, want %s", best[i].bytes, a->name,
				 best[i].algo->name);
	}
	/* rd's steps within the node at local_alpha: 7 of its 10 at alpha */
	assert_true(fabs(fr_algo_predict_us(&comm, FR_ALGO_RD,
					    FR_COLL_ALLREDUCE, 8, FR_F32) -
			 (7 * 2 + 3 * 0.5)) < 0.05);
	/* hier's node steps through the mailbox's window, on the node's
	 * latency (known only with local_alpha_us): 2 (k-1) a lane of
	 * n / (k lanes) bytes, past 8 slots of 3 KiB each a round trip.
	 * From 0.5 to 0.25 us: the latency term's 14 x 0.25 and the
	 * window's half */
	{
		double n2 = 2u << 20, lanes = fr_hier_lanes(&comm, 2u << 20, 2),
		       m = n2 / (8 * lanes), w = 8 * 3072.0, h[2];

		assert_true(m > w);
		for (int i = 0; i < 2; i++) {
			t->local_alpha_us = i ? 0.25 : 0.5;
			h[i] = fr_algo_predict_us(&comm, FR_ALGO_HIER,
						  FR_COLL_ALLREDUCE, 2u << 20,
						  FR_F32);
		}
		t->local_alpha_us = 0.5;
		assert_true(fabs(h[0] - h[1] -
				 (14 * 0.25 +
				  14 * lanes * (m / w - 1) * 2 * 0.25)) < 1e-6);
	}
	/* every hop leaves its node (a ring that takes each node's ranks
	 * in turn): one kind of hop, the plain model, as unset */
	comm.topo.ring_crossings = 8;
	plain = fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
				   16u << 20, FR_F32);
	assert_true(plain > 2 * (p - 1) * 2);
	t->local_alpha_us = t->local_beta_ns = 0;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
				       16u << 20, FR_F32) == plain);
}

/* Reduce-scatter and all-gather: two-level where the model says (two
 * nodes, large: the link carries (m-1)/m instead of (p-1)/p of the data),
 * never where it cannot run; forcing it there falls back to the ring. */
/*
 * The grid's links (FR_TOPO=2x2 with tcp.grid_beta_ns.1): 2 racks of 2
 * nodes of 2 ranks, the nodes at 10 Gbit/s, the racks joined at 1
 * (perf/sim/README.md's three-level network).  Knowing one beta, the model
 * chose the ring at 64 MiB, which sends 2 (p-1)/p of the vector through a
 * rack's uplink (simulated 940 ms; hier on the grid 562, Rabenseifner
 * 608).  With the rack link's beta the ring costs at least that much,
 * Rabenseifner's step across the racks 4 ranks x n/8 each way, hier's
 * grid 1 vector, and hier is chosen; an uplink faster than the nodes'
 * links changes nothing, as does no grid.
 */
static void test_grid_links(void **state)
{
	struct fr_tune saved = comm.algo.tune;
	double n = 64u << 20, ring, hier, rab, rd, up = 8e-3;
	const struct fr_algo *unknown;

	(void)state;
	layout(8, 2, true);
	comm.topo.ngrid = 2;
	comm.topo.grid[0] = comm.topo.grid[1] = 2;
	comm.topo.nlevels = 2;
	comm.topo.nlevel[0] = comm.topo.nlevel[1] = 2;
	comm.algo.tune.alpha_us = 20;
	comm.algo.tune.beta_ns = 0.8;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0),
			 &fr_algo_ring);
	/* faster than the node links: nothing changes */
	comm.algo.tune.grid_beta_ns[1] = 0.1;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0),
			 &fr_algo_ring);
	comm.algo.tune.grid_beta_ns[1] = 8;
	ring = fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
				  (size_t)n, FR_F32);
	hier = fr_algo_predict_us(&comm, FR_ALGO_HIER, FR_COLL_ALLREDUCE,
				  (size_t)n, FR_F32);
	rab = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER,
				 FR_COLL_ALLREDUCE, (size_t)n, FR_F32);
	print_message("64 MiB, racks at 1 Gbit/s: ring %.1f ms, hier %.1f ms, rabenseifner %.1f ms\n",
		      ring / 1e3, hier / 1e3, rab / 1e3);
	assert_true(ring >= 2 * 7.0 / 8 * n * up && ring < 1.1 * 2 * 7.0 / 8 * n * up);
	assert_true(rab >= 2 * 4 * n / 8 * up && rab < 1.25 * 2 * 4 * n / 8 * up);
	assert_true(hier >= n * up && hier < 1.1 * n * up);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0),
			 &fr_algo_hier);
	/* reduce-scatter and all-gather, half of it each (one way): the
	 * ring's 7/8 of the data through the uplink, hier's grid 1/2 (the
	 * node level's share, none; the racks' 1/2 of each node's half,
	 * both nodes of a rack through one uplink) */
	for (int c = FR_COLL_REDUCE_SCATTER; c <= FR_COLL_ALLGATHER; c++) {
		ring = fr_algo_predict_us(&comm, FR_ALGO_RING, (enum fr_coll)c,
					  (size_t)n, FR_F32);
		hier = fr_algo_predict_us(&comm, FR_ALGO_HIER, (enum fr_coll)c,
					  (size_t)n, FR_F32);
		assert_true(ring >= 7.0 / 8 * n * up &&
			    ring < 1.1 * 7.0 / 8 * n * up);
		print_message("%s: ring %.1f ms, hier %.1f ms\n",
			      fr_coll_name((enum fr_coll)c), ring / 1e3,
			      hier / 1e3);
		assert_true(hier >= n / 2 * up && hier < 1.2 * n / 2 * up);
		assert_ptr_equal(
			choose((enum fr_coll)c, (size_t)n / 32, FR_F32, 0),
			&fr_algo_hier_rsag);
	}
	/* recursive doubling's step across the racks: 4 ranks x n, a
	 * floor under its link term, not added to it */
	rd = fr_algo_predict_us(&comm, FR_ALGO_RD, FR_COLL_ALLREDUCE, 1u << 20,
				FR_F32);
	assert_true(rd >= 4.0 * (1u << 20) * up &&
		    rd < 1.2 * 4.0 * (1u << 20) * up);
	/* small sizes keep their choice */
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_rd);
	/* one rank per node (no hier): 2 racks of 4 nodes, the floors
	 * still hold, and Rabenseifner, whose last step alone crosses, is
	 * chosen over the ring */
	layout(8, 1, true);
	comm.topo.grid[0] = 4;
	comm.topo.nlevel[0] = 4;
	ring = fr_algo_predict_us(&comm, FR_ALGO_RING, FR_COLL_ALLREDUCE,
				  (size_t)n, FR_F32);
	assert_true(ring >= 2 * 7.0 / 8 * n * up);
	rab = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER, FR_COLL_ALLREDUCE,
				 (size_t)n, FR_F32);
	assert_true(rab >= 2 * 4 * n / 8 * up);
	/* the one-shot: 4 ranks of a rack each send n to the other 4 */
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_ONESHOT,
				       FR_COLL_ALLREDUCE, (size_t)n,
				       FR_F32) >= 4 * 4 * n * up);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0),
			 &fr_algo_rabenseifner);
	/* the rack's rate unknown: no floor, the flat model's choice (the
	 * ring, or on these 8 ranks Rabenseifner, whose large steps go
	 * zero copy: see test_allreduce_shape) */
	comm.algo.tune.grid_beta_ns[1] = 0;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER,
				       FR_COLL_ALLREDUCE, (size_t)n,
				       FR_F32) < 0.5 * rab);
	unknown = choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0);
	assert_true(unknown == &fr_algo_ring ||
		    unknown == &fr_algo_rabenseifner);
	/* no grid: the key is not used */
	comm.algo.tune.grid_beta_ns[1] = 8;
	comm.topo.ngrid = 0;
	comm.topo.nlevels = 0;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, (size_t)n / 4, FR_F32, 0),
			 unknown);
	comm.algo.tune = saved;
}

/*
 * Bruck's reduce-scatter and all-gather: ceil(lg p) steps against the
 * ring's p, the same (p-1)/p of the data, but through the mailboxes.
 * Its alpha term is lg p steps; on 1,024 ranks (8 a node, 100 Gbit/s,
 * 2 us) it is chosen for small blocks and not for large ones, as fr_sim
 * finds them (64 KiB in all: Bruck 53 us, the ring 707; 16 MiB: the ring
 * 1.5 ms, Bruck 12.5, window-bound); on 8 ranks over TCP the ring from 4
 * MiB.  Forced, it runs at any size.
 */
static void test_bruck_rsag_choice(void **state)
{
	struct fr_tune saved = comm.algo.tune;
	size_t slot = comm.peer.mbx_slot_size;

	(void)state;
	layout(1024, 8, true);
	/* the mailbox's slots on 1,024 ranks: 2 KiB, not 32 (comm.c) */
	comm.peer.mbx_slot_size = fr_mbx_slot_size(1024, 0);
	comm.algo.tune.alpha_us = 2;
	comm.algo.tune.beta_ns = 0.08;
	comm.algo.tune.copy_ns = 0.02;
	for (int c = FR_COLL_REDUCE_SCATTER; c <= FR_COLL_ALLGATHER; c++) {
		enum fr_coll coll = (enum fr_coll)c;
		double b = fr_algo_predict_us(&comm, FR_ALGO_BRUCK, coll, 8,
					      FR_F32);

		for (size_t s = 64u << 10; s <= (16u << 20); s *= 16)
			print_message(
				"%s on 1,024 ranks, %zu bytes: bruck %.1f us, ring %.1f us\n",
				fr_coll_name(coll), s,
				fr_algo_predict_us(&comm, FR_ALGO_BRUCK, coll,
						   s, FR_F32),
				fr_algo_predict_us(&comm, FR_ALGO_RING, coll, s,
						   FR_F32));
		/* 10 steps of alpha, whatever else */
		assert_true(b >= 10 * 2 && b < 10 * 2 * 1.5);
		assert_true(fr_algo_predict_us(&comm, FR_ALGO_RING, coll, 8,
					       FR_F32) >= 1024 * 2);
		assert_ptr_equal(
			choose(coll, (64u << 10) / 4 / 1024, FR_F32, 0),
			&fr_algo_bruck_rsag);
		assert_ptr_not_equal(
			choose(coll, (16u << 20) / 4 / 1024, FR_F32, 0),
			&fr_algo_bruck_rsag);
		assert_ptr_equal(choose(coll, 1u << 20, FR_F32, FR_ALGO_BRUCK),
				 &fr_algo_bruck_rsag);
	}
	comm.algo.tune = saved;
	comm.peer.mbx_slot_size = slot;
	layout(8, 1, true);
	for (int c = FR_COLL_REDUCE_SCATTER; c <= FR_COLL_ALLGATHER; c++) {
		assert_ptr_equal(choose((enum fr_coll)c, 64, FR_F32, 0),
				 &fr_algo_bruck_rsag);
		assert_ptr_equal(
			choose((enum fr_coll)c, (4u << 20) / 4 / 8, FR_F32, 0),
			&fr_algo_ring);
	}
	/* the All-Reduce has no Bruck: forcing it chooses as auto */
	assert_ptr_not_equal(
		choose(FR_COLL_ALLREDUCE, 64, FR_F32, FR_ALGO_BRUCK),
		&fr_algo_bruck_rsag);
}

static void test_hier_rsag_choice(void **state)
{
	(void)state;
	for (int k = 2; k <= 4; k++)
		for (int m = 2; m <= 4; m++) {
			size_t n = (size_t)k * m, big = (16u << 20) / n;

			layout(k * m, k, true);
			if (m == 2) {
				/* count is per rank: 16 MiB in all */
				assert_ptr_equal(choose(FR_COLL_REDUCE_SCATTER,
							big / 4, FR_F32, 0),
						 &fr_algo_hier_rsag);
				assert_ptr_equal(choose(FR_COLL_ALLGATHER, big,
							FR_U8, 0),
						 &fr_algo_hier_rsag);
			}
			for (int c = FR_COLL_REDUCE_SCATTER;
			     c <= FR_COLL_ALLGATHER; c++) {
				double prev = -1;

				for (size_t b = 8; b <= (1u << 28); b *= 4) {
					double t = fr_algo_predict_us(
						&comm, FR_ALGO_HIER,
						(enum fr_coll)c, b, FR_F32);

					assert_true(t > prev);
					prev = t;
				}
				/* forced: runs even where the model says no */
				assert_ptr_equal(choose((enum fr_coll)c, 1,
							FR_F32, FR_ALGO_HIER),
						 &fr_algo_hier_rsag);
			}
			/* the hier All-Reduce is another algorithm */
			assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 1u << 22,
						    FR_F32, FR_ALGO_HIER),
					     &fr_algo_hier_rsag);
		}
	/* round robin without the node-by-node ring: every rank's ring hop
	 * crosses the link, hier wins by more */
	layout(4, 2, true);
	comm.topo.ring_crossings = 2;
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_RING,
				       FR_COLL_REDUCE_SCATTER, 1u << 24,
				       FR_F32) >
		    fr_algo_predict_us(&comm, FR_ALGO_HIER,
				       FR_COLL_REDUCE_SCATTER, 1u << 24,
				       FR_F32) *
			    1.5);
	layout(5, 2, false);
	for (int c = FR_COLL_REDUCE_SCATTER; c <= FR_COLL_ALLGATHER; c++) {
		assert_ptr_equal(choose((enum fr_coll)c, 1u << 22, FR_F32,
					FR_ALGO_HIER),
				 &fr_algo_ring);
		assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER,
					       (enum fr_coll)c, 1000,
					       FR_F32) < 0);
	}
	layout(4, 4, true); /* one node */
	assert_ptr_equal(choose(FR_COLL_REDUCE_SCATTER, 1u << 22, FR_F32,
				FR_ALGO_HIER),
			 &fr_algo_ring);
	assert_ptr_equal(choose(FR_COLL_ALLGATHER, 1u << 22, FR_F32, 0),
			 &fr_algo_ring);
	layout(4, 1, true); /* one rank per node */
	assert_ptr_equal(choose(FR_COLL_ALLGATHER, 1u << 22, FR_F32,
				FR_ALGO_HIER),
			 &fr_algo_ring);
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_HIER,
				       FR_COLL_REDUCE_SCATTER, 1000,
				       FR_F32) < 0);
}

static char path[64];

static void write_tune(const char *text)
{
	FILE *f;

	snprintf(path, sizeof(path), "/tmp/fr-test-tune-%d", (int)getpid());
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	setenv("FR_TUNE_FILE", path, 1);
}

/*
 * A step's fresh stream (select.c): on 8 ranks over TCP, one a node,
 * Rabenseifner and the ring put the same bytes on the wire, and the
 * model chose Rabenseifner for its 12 latencies against the ring's 15
 * at every size, where between namespaces at 1 Gbit/s the ring was
 * faster from 256 KiB to 64 MiB (1,017 and 1,035 ms against 991 and 995
 * at 64 MiB).  Each of Rabenseifner's steps now pays step_ramp of its
 * wire time: the ring from about 1 MiB up; without it (shared memory,
 * verbs, a tune file's 0) the choice is as before.  The built-in values
 * by transport, the mixed ones by their network side.
 */
static void test_step_ramp(void **state)
{
	struct fr_tune t;
	char err[256];
	double a, b, g, m = 64u << 20, want, got;

	(void)state;
	layout(8, 1, true);
	assert_true(comm.algo.tune.step_ramp == FR_TCP_STEP_RAMP);
	a = comm.algo.tune.alpha_us;
	b = comm.algo.tune.beta_ns * 1e-3;
	g = comm.algo.tune.gamma_ns[FR_F32] * 1e-3;
	/* 3 steps each way of m/2, m/4, m/8 zero copy: a READY and the
	 * wire each, and the ramp on the wire */
	want = 6 * a + 2 * (3 * a + 7.0 / 8 * m * b * (1 + FR_TCP_STEP_RAMP)) +
	       7.0 / 8 * m * g;
	got = fr_algo_predict_us(&comm, FR_ALGO_RABENSEIFNER, FR_COLL_ALLREDUCE,
				 (size_t)m, FR_F32);
	if (fabs(got - want) > 1e-9 * want)
		fail_msg("rabenseifner at 64 MiB: %.3f us, want %.3f", got,
			 want);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16u << 20, FR_F32, 0),
			 &fr_algo_ring);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1u << 18, FR_F32, 0),
			 &fr_algo_ring);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1u << 16, FR_F32, 0),
			 &fr_algo_rabenseifner);
	comm.algo.tune.step_ramp = 0;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16u << 20, FR_F32, 0),
			 &fr_algo_rabenseifner);
	static const struct {
		const char *tp;
		double want;
	} by[] = {{"tcp", FR_TCP_STEP_RAMP},
		  {"shm+tcp", FR_TCP_STEP_RAMP},
		  {"shm", 0},
		  {"verbs", 0},
		  {"shm+verbs", 0}};
	for (size_t i = 0; i < sizeof(by) / sizeof(by[0]); i++) {
		assert_int_equal(fr_tune_load(&t, by[i].tp, err, sizeof(err)),
				 0);
		assert_true(t.step_ramp == by[i].want);
	}
}

static void test_tune_file(void **state)
{
	char err[256];
	uint32_t h0 = fr_tune_hash(&comm.algo.tune);

	(void)state;
	write_tune("# comment\n\n"
		   "tcp.alpha_us = 12.5\n"
		   "tcp.beta_ns = 8   # 1 Gbit/s\n"
		   "verbs.alpha_us = 99\n" /* another transport: skipped */
		   "tcp.copy_ns = 0.5\n"
		   "tcp.local_alpha_us = 0.75\n"
		   "tcp.local_beta_ns = 0.125\n"
		   "gamma_ns.bf16 = 0.75\n"
		   "tcp.step_ramp = 0.05\n"
		   "tcp.future_key = 3\n"); /* unknown: warned about */
	assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)), 0);
	assert_true(comm.algo.tune.alpha_us == 12.5);
	assert_true(comm.algo.tune.beta_ns == 8);
	assert_true(comm.algo.tune.copy_ns == 0.5);
	assert_true(comm.algo.tune.local_alpha_us == 0.75);
	assert_true(comm.algo.tune.local_beta_ns == 0.125);
	assert_true(comm.algo.tune.step_ramp == 0.05);
	/* each in the hash on its own */
	{
		struct fr_tune x = comm.algo.tune;
		uint32_t hx = fr_tune_hash(&x);

		x.local_alpha_us = 0.5;
		assert_int_not_equal(fr_tune_hash(&x), hx);
		x.local_alpha_us = comm.algo.tune.local_alpha_us;
		x.local_beta_ns = 0.5;
		assert_int_not_equal(fr_tune_hash(&x), hx);
		x.local_beta_ns = comm.algo.tune.local_beta_ns;
		x.step_ramp = 0.04;
		assert_int_not_equal(fr_tune_hash(&x), hx);
	}
	/* no msg_us in the file: 2.5 times its alpha, as built in */
	assert_true(comm.algo.tune.msg_us == 31.25);
	assert_true(comm.algo.tune.gamma_ns[FR_BF16] == 0.75);
	assert_string_equal(comm.algo.tune.source, path);
	assert_int_not_equal(fr_tune_hash(&comm.algo.tune), h0);
	/* at 1 Gbit/s a 64 KiB vector over 8 ranks is no longer rd's */
	comm.nranks = 8;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16384, FR_F32, 0),
			 &fr_algo_rabenseifner);
	write_tune("tcp.alpha_us = 900\ntcp.msg_us = 30\n");
	assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)),
			 0);
	assert_true(comm.algo.tune.msg_us == 30);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			 &fr_algo_oneshot);
	/* the grid's links: dimensions 1 to 3, in the hash; others are
	 * unknown keys (warned about, ignored) */
	{
		uint32_t h1 = fr_tune_hash(&comm.algo.tune);

		write_tune("tcp.alpha_us = 900\ntcp.msg_us = 30\n"
			   "tcp.grid_beta_ns.1 = 8\ntcp.grid_beta_ns.3 = 16\n"
			   "tcp.grid_beta_ns.0 = 5\ntcp.grid_beta_ns.4 = 5\n"
			   "tcp.grid_beta_ns.12 = 5\n");
		assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err,
					      sizeof(err)),
				 0);
		assert_true(comm.algo.tune.grid_beta_ns[0] == 0);
		assert_true(comm.algo.tune.grid_beta_ns[1] == 8);
		assert_true(comm.algo.tune.grid_beta_ns[2] == 0);
		assert_true(comm.algo.tune.grid_beta_ns[3] == 16);
		assert_int_not_equal(fr_tune_hash(&comm.algo.tune), h1);
	}

	static const char *const bad[] = {
		"tcp.alpha_us = -1\n",	  "tcp.alpha_us = x\n",
		"tcp.alpha_us = 1e999\n", "gamma_ns.f33 = 1\n",
		"just words\n",		  "tcp.beta_ns = 1 2\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_tune(bad[i]);
		err[0] = '\0';
		assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)),
				 FR_EINVAL);
		assert_non_null(strstr(err, path));
	}
	setenv("FR_TUNE_FILE", "/nonexistent/fr.tune", 1);
	assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)),
			 FR_EINVAL);
	unlink(path);
	unsetenv("FR_TUNE_FILE");
	/* the defaults again, and the same hash as before */
	assert_int_equal(fr_tune_load(&comm.algo.tune, "tcp", err, sizeof(err)), 0);
	assert_int_equal(fr_tune_hash(&comm.algo.tune), h0);
}

/* More ranks than CPUs on a node: fewer steps pay (select.c,
 * fr_tune_oversub); a tune file's alpha is left alone. */
static void test_oversub(void **state)
{
	char err[256];

	(void)state;
	comm.nranks = 4;
	assert_int_equal(fr_tune_load(&comm.algo.tune, "shm", err, sizeof(err)), 0);
	comm.topo.oversub = 1.0;
	fr_tune_oversub(&comm);
	assert_true(comm.algo.tune.alpha_us == 2.0);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16384, FR_F32, 0),
			 &fr_algo_ring);
	comm.topo.oversub = 2.0; /* 4 ranks on 2 CPUs */
	fr_tune_oversub(&comm);
	assert_true(comm.algo.tune.alpha_us == 22.0);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 16384, FR_F32, 0),
			 &fr_algo_rd);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1 << 20, FR_F32, 0),
			 &fr_algo_ring);

	write_tune("shm.alpha_us = 3\n");
	assert_int_equal(fr_tune_load(&comm.algo.tune, "shm", err, sizeof(err)), 0);
	fr_tune_oversub(&comm);
	assert_true(comm.algo.tune.alpha_us == 3.0);
	unlink(path);
	unsetenv("FR_TUNE_FILE");
}

/* a transport with lines of FR_TP_LINE_MAX bytes, as shm's */
static size_t fake_line_bytes(struct fr_tp *tp)
{
	(void)tp;
	return FR_TP_LINE_MAX;
}

/*
 * Lines (select.c, "lines"): where they carry a call (one node, 2 to
 * FR_LL_RANKS_MAX ranks, an All-Reduce of up to a line less its header, or
 * a barrier) the model prices the one-shot over them, line_us plus the
 * puts' copies and the fold, and takes it where that is the cheapest; a
 * line dearer than recursive doubling's steps (a tune file's) leaves it.
 * Past a line, on more ranks, over several nodes or with FR_LL off, lines
 * are not priced at all.  A forced algorithm is obeyed.
 */
static void test_lines(void **state)
{
	static const struct fr_tp_ops ops = {.size = sizeof(ops),
					     .name = "shm",
					     .line_bytes = fake_line_bytes};
	size_t most = FR_TP_LINE_MAX - FR_LL_HDR;
	struct fr_tune t;
	char err[256];

	(void)state;
	assert_int_equal(fr_tune_load(&comm.algo.tune, "shm", err, sizeof(err)),
			 0);
	assert_true(comm.algo.tune.line_us == FR_LINE_US);
	comm.tp_ops = &ops;
	comm.peer.ll = true;
	comm.topo.nnodes = 1;
	comm.nranks = 4;
	/* the model's own terms */
	t = comm.algo.tune;
	assert_true(fr_model_ll_us(&t, 4, FR_COLL_BARRIER, 0, FR_F32) ==
		    FR_LINE_US);
	assert_true(fabs(fr_model_ll_us(&t, 4, FR_COLL_ALLREDUCE, 64, FR_F32) -
			 (FR_LINE_US + 3 *
					       ((64 + FR_LL_HDR) * t.copy_ns +
						64 * t.gamma_ns[FR_F32]) *
					       1e-3)) < 1e-9);
	assert_true(fr_model_ll_us(&t, 1, FR_COLL_ALLREDUCE, 64, FR_F32) == 0);
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_ONESHOT,
				       FR_COLL_ALLREDUCE, 8, FR_F32) ==
		    fr_model_ll_us(&t, 4, FR_COLL_ALLREDUCE, 8, FR_F32));

	/* built in: lines from 1 element to a line's worth, and barriers */
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1, FR_I8, 0), &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, most / 4, FR_F32, 0),
			 &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_F32, 0), &fr_algo_ll);
	/* past a line: the one-shot through the mailboxes, or rd */
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, most + 1, FR_I8, 0),
			     &fr_algo_ll);
	/* a count of 0 moves nothing: not by lines */
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 0, FR_F32, 0),
			     &fr_algo_ll);
	/* the model, not a rule: a line dearer than rd's two steps */
	comm.algo.tune.line_us = 2 * comm.algo.tune.alpha_us + 1;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_rd);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_F32, 0),
			 &fr_algo_dissemination);
	/* ... and one between them: the copies tip it at larger vectors */
	comm.algo.tune.line_us = 2 * comm.algo.tune.alpha_us - 0.1;
	comm.algo.tune.copy_ns = 1.0;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 1, FR_F32, 0), &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, most / 4, FR_F32, 0),
			 &fr_algo_rd);
	/* forced: obeyed either way */
	assert_ptr_equal(
		choose(FR_COLL_ALLREDUCE, most / 4, FR_F32, FR_ALGO_ONESHOT),
		&fr_algo_ll);
	comm.algo.tune = t;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, FR_ALGO_RD),
			 &fr_algo_rd);
	assert_ptr_equal(
		choose(FR_COLL_BARRIER, 0, FR_F32, FR_ALGO_DISSEMINATION),
		&fr_algo_dissemination);
	/* where lines do not carry it they are not priced */
	comm.nranks = FR_LL_RANKS_MAX + 1;
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			     &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_F32, 0),
			 &fr_algo_dissemination);
	comm.nranks = 4;
	comm.topo.nnodes = 2;
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			     &fr_algo_ll);
	comm.topo.nnodes = 1;
	comm.peer.ll = false; /* FR_LL=0 */
	assert_ptr_not_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0),
			     &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_F32, 0),
			 &fr_algo_dissemination);
	comm.peer.ll = true;
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_ll);

	/* broadcasts and reduces too, with a CPU a rank; with more ranks
	 * than CPUs their trees, which let a rank go once its part is sent
	 * (unless forced); All-Reduces and barriers keep lines there */
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 2, FR_F32, 0), &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_REDUCE, most, FR_U8, 0), &fr_algo_ll);
	assert_ptr_not_equal(choose(FR_COLL_REDUCE, most + 1, FR_U8, 0),
			     &fr_algo_ll);
	assert_true(fr_algo_predict_us(&comm, FR_ALGO_ONESHOT,
				       FR_COLL_BROADCAST, 64, FR_F32) <
		    fr_algo_predict_us(&comm, FR_ALGO_ONESHOT, FR_COLL_REDUCE,
				       64, FR_F32));
	comm.topo.oversub = 1.5;
	assert_ptr_equal(choose(FR_COLL_BROADCAST, 2, FR_F32, 0),
			 &fr_algo_bcast_tree);
	assert_ptr_not_equal(choose(FR_COLL_REDUCE, 2, FR_F32, 0), &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_REDUCE, 2, FR_F32, FR_ALGO_ONESHOT),
			 &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_ll);
	assert_ptr_equal(choose(FR_COLL_BARRIER, 0, FR_F32, 0), &fr_algo_ll);
	comm.topo.oversub = 0;

	/* more ranks than CPUs: a line waits for its peers' turn as a step
	 * does; a tune file's is left alone */
	comm.topo.oversub = 2.0;
	fr_tune_oversub(&comm);
	assert_true(comm.algo.tune.line_us > 20);
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_ll);
	write_tune("shm.line_us = 7.5\nshm.alpha_us = 3\n");
	assert_int_equal(fr_tune_load(&comm.algo.tune, "shm", err, sizeof(err)),
			 0);
	assert_true(comm.algo.tune.line_us == 7.5);
	{
		uint32_t h = fr_tune_hash(&comm.algo.tune);

		comm.algo.tune.line_us = 7.25;
		assert_int_not_equal(fr_tune_hash(&comm.algo.tune), h);
		comm.algo.tune.line_us = 7.5;
	}
	fr_tune_oversub(&comm);
	assert_true(comm.algo.tune.line_us == 7.5);
	/* 7.5 against rd's 2 x 3: rd */
	assert_ptr_equal(choose(FR_COLL_ALLREDUCE, 2, FR_F32, 0), &fr_algo_rd);
	unlink(path);
	unsetenv("FR_TUNE_FILE");
	comm.tp_ops = NULL;
	comm.peer.ll = false;
	comm.topo.nnodes = 0;
	comm.topo.oversub = 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_names, setup),
		cmocka_unit_test_setup(test_allreduce_shape, setup),
		cmocka_unit_test_setup(test_oneshot_long_link, setup),
		cmocka_unit_test_setup(test_mailbox_window, setup),
		cmocka_unit_test_setup(test_memo, setup),
		cmocka_unit_test_setup(test_forced_and_others, setup),
		cmocka_unit_test(test_dbtree_shape),
		cmocka_unit_test_setup(test_dbtree_choice, setup),
		cmocka_unit_test_setup(test_new_collectives, setup),
		cmocka_unit_test_setup(test_hier_choice, setup),
		cmocka_unit_test_setup(test_rab_node_steps, setup),
		cmocka_unit_test_setup(test_node_local_steps, setup),
		cmocka_unit_test_setup(test_grid_links, setup),
		cmocka_unit_test_setup(test_hier_rsag_choice, setup),
		cmocka_unit_test_setup(test_bruck_rsag_choice, setup),
		cmocka_unit_test_setup(test_step_ramp, setup),
		cmocka_unit_test_setup(test_tune_file, setup),
		cmocka_unit_test_setup(test_oversub, setup),
		cmocka_unit_test_setup(test_lines, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
