/* SPDX-License-Identifier: MIT */
/*
 * run.c - the simulator's job and its driver: events in virtual time.
 *
 * The fake transport (with a clock, tests/fake_tp.h) asks due() for every
 * write when it is posted: the network model answers, and the write goes
 * on a heap of events by that time.  ready() names a rank that has
 * something to poll (a completion, an incoming connection); it joins the
 * run queue.  The driver:
 *
 *   start the collective on every rank; every rank on the run queue
 *   repeat
 *     run each queued rank, in queue order, while its engine finds work
 *       (also once its request is done: it still serves the others);
 *       what it posts goes on the heap, what it completes queues ranks
 *       again
 *     every rank done: stop
 *     heap empty: the schedule stalled (nothing in flight, nobody with
 *       work): an error, never a hang
 *     take the earliest event(s): the clock moves to their time, their
 *       writers are queued (their poll lands the write, which queues the
 *       receiver)
 *
 * Nothing costs time but the network: a rank runs in no time (a CPU model
 * comes later, perf/sim/README.md).  A rank's end is the clock when its
 * request completes; the collective's time is the slowest rank's, as
 * perf/'s benchmarks measure it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "engine.h"
#include "internal.h"
#include "reduce.h"
#include "sim.h"

static struct sim *sim_of(struct fake_clock *clk)
{
	return (struct sim *)clk; /* clk is sim's first member */
}

static void runq_push(struct sim *s, int rank)
{
	if (rank < 0 || rank >= s->n || s->queued[rank])
		return;
	s->queued[rank] = true;
	s->runq[(s->rq_head + s->rq_count++) % (size_t)s->n] = rank;
}

static int runq_pop(struct sim *s)
{
	int r = s->runq[s->rq_head];

	s->rq_head = (s->rq_head + 1) % (size_t)s->n;
	s->rq_count--;
	s->queued[r] = false;
	return r;
}

static bool ev_less(const struct sim_event *a, const struct sim_event *b)
{
	return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

/* false without memory (the run then fails) */
static bool ev_push(struct sim *s, uint64_t due, int rank)
{
	size_t i;

	if (s->nev == s->capev) {
		size_t cap = s->capev ? 2 * s->capev : 1024;
		struct sim_event *e = realloc(s->ev, cap * sizeof(*e));

		if (!e)
			return false;
		s->ev = e;
		s->capev = cap;
	}
	i = s->nev++;
	s->ev[i] =
		(struct sim_event){.due = due, .seq = s->seq++, .rank = rank};
	while (i && ev_less(&s->ev[i], &s->ev[(i - 1) / 2])) {
		struct sim_event t = s->ev[i];

		s->ev[i] = s->ev[(i - 1) / 2];
		s->ev[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
	return true;
}

static struct sim_event ev_pop(struct sim *s)
{
	struct sim_event top = s->ev[0];
	size_t i = 0;

	s->ev[0] = s->ev[--s->nev];
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		struct sim_event t;

		if (l < s->nev && ev_less(&s->ev[l], &s->ev[m]))
			m = l;
		if (r < s->nev && ev_less(&s->ev[r], &s->ev[m]))
			m = r;
		if (m == i)
			break;
		t = s->ev[i];
		s->ev[i] = s->ev[m];
		s->ev[m] = t;
		i = m;
	}
	return top;
}

static uint64_t clk_due(struct fake_clock *clk, int from, int to, size_t len)
{
	struct sim *s = sim_of(clk);
	uint64_t due = sim_net_due(&s->net, clk->now, from, to, len);

	if (!ev_push(s, due, from))
		s->ev_nomem = true;
	return due;
}

static void clk_ready(struct fake_clock *clk, int rank)
{
	runq_push(sim_of(clk), rank);
}

/*
 * Run rank r while its engine finds work: a schedule may have more to post
 * than one round posts (a window of segments), with nothing in flight to
 * say so later.  Bounded, so that one rank cannot starve the others; one
 * that still had work goes to the back of the queue.
 */
static void run_rank(struct sim *s, int r)
{
	struct fr_comm *c = s->comms[r];
	bool work = true;

	fr_lock(c);
	for (int i = 0; work && i < 64; i++) {
		work = false;
		if (fr_progress_internal(c, &work))
			work = false; /* failed: its requests say so */
	}
	fr_unlock(c);
	if (work)
		runq_push(s, r);
}

/* the kernel of SIM_SIZES_ONLY: nothing computed */
static void reduce_nothing(void *dst, const void *a, const void *b, size_t n)
{
	(void)dst;
	(void)a;
	(void)b;
	(void)n;
}

int sim_open(struct sim *s, const struct sim_net_params *p,
	     const fr_config_t *cfg, unsigned int flags)
{
	fr_config_t c;
	int rc;

	memset(s, 0, sizeof(*s));
	rc = sim_net_init(&s->net, p, s->err, sizeof(s->err));
	if (rc)
		return rc;
	s->n = p->nranks;
	s->flags = flags;
	s->comms = calloc((size_t)s->n, sizeof(*s->comms));
	s->runq = calloc((size_t)s->n, sizeof(*s->runq));
	s->queued = calloc((size_t)s->n, sizeof(*s->queued));
	if (!s->comms || !s->runq || !s->queued) {
		rc = FR_ENOMEM;
		snprintf(s->err, sizeof(s->err), "out of memory for %d ranks",
			 s->n);
		goto err_alloc;
	}
	if (cfg) {
		c = *cfg;
	} else {
		fr_config_init(&c);
	}
	c.transport = "fake";
	c.timeout_ms = 86400000;
	c.progress = FR_PROGRESS_CALLER;
	s->clk.due = clk_due;
	s->clk.ready = clk_ready;
	if (flags & SIM_SIZES_ONLY) {
		s->clk.copy_max = SIM_COPY_MAX;
		fr_reduce_set_hook(reduce_nothing);
	}
	fake_tp_install();
	fake_tp_clock(&s->clk);
	{
		/* the node of each rank: consecutive ranks, as the network */
		uint64_t *ids = calloc((size_t)s->n, sizeof(*ids));

		if (!ids) {
			rc = FR_ENOMEM;
			snprintf(s->err, sizeof(s->err), "out of memory");
			goto err_job;
		}
		for (int r = 0; r < s->n; r++)
			ids[r] = 1 + (uint64_t)(r / p->ranks_per_node);
		rc = fr_comm_create_local(&c, s->n, ids, s->comms);
		free(ids);
	}
	if (rc) {
		snprintf(s->err, sizeof(s->err), "%s",
			 fr_comm_last_error(NULL));
		goto err_job;
	}
	/* the cost model knows the network's latency and bandwidth, as a
	 * tune file of fr_tune's would give them; its CPU terms keep their
	 * built-in values (the simulation has no CPU cost yet, but a model
	 * that took messages for free would send n^2 of them) */
	for (int r = 0; r < s->n; r++) {
		struct fr_tune t;

		fr_tune_get(s->comms[r], &t);
		t.alpha_us = p->link_lat_ns / 1e3;
		t.beta_ns = 8.0 / p->link_gbps;
		snprintf(t.source, sizeof(t.source), "the simulated network");
		fr_tune_set(s->comms[r], &t);
	}
	return 0;

err_job:
	fr_reduce_set_hook(NULL);
	fake_tp_clock(NULL);
err_alloc:
	free(s->queued);
	free(s->runq);
	free(s->comms);
	sim_net_fini(&s->net);
	return rc;
}

void sim_close(struct sim *s)
{
	/* the goodbyes wait at most the peer timeout, which sim_open set
	 * to a day: a rank that cannot say goodbye (one frozen) must not
	 * hold this up for that long */
	for (int r = 0; r < s->n; r++)
		s->comms[r]->peer.timeout_ms = 10000;
	/* the goodbyes land in virtual time too: without the clock they
	 * land at once, which is all a goodbye needs */
	fake_tp_clock(NULL);
	fr_reduce_set_hook(NULL);
	fr_comm_destroy_local(s->n, s->comms);
	free(s->ev);
	free(s->queued);
	free(s->runq);
	free(s->comms);
	sim_net_fini(&s->net);
	memset(s, 0, sizeof(*s));
}

int sim_allreduce(struct sim *s, void **bufs, size_t count, fr_dtype_t dt,
		  fr_op_t op, uint64_t *ns)
{
	fr_request_t **req = calloc((size_t)s->n, sizeof(*req));
	uint64_t start = s->clk.now, end = start;
	int left = s->n, first = 0, rc;

	if (!req)
		return FR_ENOMEM;
	s->ev_nomem = false;
	for (int r = 0; r < s->n; r++) {
		rc = fr_iallreduce(s->comms[r], bufs[r], bufs[r], count, dt, op,
				   &req[r]);
		if (rc) {
			snprintf(s->err, sizeof(s->err), "rank %d: %s", r,
				 fr_comm_last_error(s->comms[r]));
			/* the others run to their end or their error */
			req[r] = NULL;
			left--;
			if (!first)
				first = rc;
		}
		runq_push(s, r);
	}
	while (left) {
		while (s->rq_count) {
			int r = runq_pop(s), done = 0;

			run_rank(s, r);
			/* fr_test only once it is done: on a request still
			 * running it would also run the waiter's checks,
			 * whose PINGs go by real time (an idle second) and
			 * would put writes in virtual time that depend on
			 * how fast this machine is */
			if (!req[r] ||
			    ((struct fr_request *)req[r])->state != FR_REQ_DONE)
				continue;
			rc = fr_test(&req[r], &done);
			if (!done)
				continue;
			left--;
			end = s->clk.now > end ? s->clk.now : end;
			if (rc && !first) {
				first = rc;
				snprintf(s->err, sizeof(s->err), "rank %d: %s",
					 r, fr_comm_last_error(s->comms[r]));
			}
		}
		if (!left)
			break;
		if (s->ev_nomem) {
			first = FR_ENOMEM;
			snprintf(s->err, sizeof(s->err),
				 "out of memory for the events");
			break;
		}
		if (!s->nev) {
			first = FR_ETIMEDOUT;
			snprintf(
				s->err, sizeof(s->err),
				"stalled at %.3f us: %d ranks wait with nothing in flight",
				(double)(s->clk.now - start) / 1e3, left);
			break;
		}
		/* every event of the earliest time */
		do {
			struct sim_event e = ev_pop(s);

			s->events++;
			s->clk.now = e.due;
			runq_push(s, e.rank);
		} while (s->nev && s->ev[0].due == s->clk.now);
	}
	/* stalled or out of memory: the requests left go with the job,
	 * which is good for sim_close only */
	*ns = end - start;
	free(req);
	return first;
}
