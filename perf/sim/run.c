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
 * Without a CPU model nothing costs time but the network: a rank runs in
 * no time.  With one (sim.h, struct sim_cpu_params), each rank has its
 * own CPU clock, cpu_free[r], which its reductions, sends, receives and
 * copies within the node move on: it posts at that time (due() is asked
 * from there) and finishes at it.  The driver still runs a rank when the
 * global clock reaches an event for it, which cannot change what the
 * rank does: what it sees has landed by then, and it acts no sooner than
 * its CPU is free.  A rank's end is the later of the clock when its
 * request completes and its CPU's; the collective's time is the slowest
 * rank's, as perf/'s benchmarks measure it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "engine.h"
#include "internal.h"
#include "perf_common.h"
#include "reduce.h"
#include "sim.h"

static struct sim *sim_of(struct fake_clock *clk)
{
	return (struct sim *)clk; /* clk is sim's first member */
}

static uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* Nanoseconds of a CPU's work: fixed ns plus len bytes at GBps (0: none). */
static uint64_t cpu_ns(double ns, size_t len, double GBps)
{
	double t = ns + (GBps > 0 ? (double)len / GBps : 0);

	return (uint64_t)ceil(t);
}

/*
 * Rank r's CPU does work of t ns from the later of `from` and its last; on
 * shared cores, in the cores' free time from then on (core_take: the
 * event loop puts work on a core ahead of time, as a write's receiver is
 * busy once its delay line lets the write go; work put later but due
 * earlier runs in the time that leaves free before it, as a kernel's time
 * slices would run it, where a core booked only from the end of its last
 * work left that time idle: 16 ranks on 2 cores ran their delay lines one
 * after another).  After the work the rank spins on its core for spin_ns,
 * waiting for more: nobody else has the core until then.  The library yields
 * the core while it spins (util.h, fr_spin_turn), but the kernel does not give
 * it away for that: 8 bytes between two ranks over TCP took 81 us a call
 * with both pinned to one core against 13 us on two, and 40 us with no
 * spin (FR_SPIN_US=0), so a spinner keeps its core until it sleeps.
 * Except where a stream's bytes (SIM_CHUNK or more) are on their way to
 * the spinner: it will work on them, not sleep, and the kernel shares a
 * core between two ranks with work by time slices, losing nothing (a
 * stream of 32 KiB writes between two ranks pinned to one core ran at
 * 2.6 GB/s, the core's speed).  Then the core is free for others at the
 * end of the spinner's work.
 * `from` may be before now where the work streamed in (recv_take): the
 * rank's CPU was idle since it was last free, and the cores' spans of the
 * last SIM_CORE_KEEP_NS say where they were.
 */
/* Where rank r's pool of cores starts in cores: its
 * node's, or with cores_job the job's one pool */
static size_t core_pool(const struct sim *s, int r)
{
	return (size_t)(s->cpu.cores_job ? 0 : r / s->net.p.ranks_per_node) *
	       (size_t)s->cpu.cores;
}

/* How long a core's spans are kept back from now: no work is put
 * earlier than a stream's span before now (recv_take), far less. */
#define SIM_CORE_KEEP_NS 20000000ull

/* How long rank r finds a core held past the end of `owner`'s span on
 * it: its spin, unless it is the spinner's or a delay line's (above) */
static uint64_t core_hold(const struct sim *s, int owner, int r)
{
	if (owner < 0 || owner == r ||
	    (!s->cpu.spin_holds && s->inflight[owner] >= SIM_CHUNK))
		return 0;
	return (uint64_t)s->cpu.spin_ns;
}

/* A gap shorter than this is not worth a piece of work (core_take). */
#define SIM_PIECE_MIN_NS 1000u

/* When core c is next free for rank r from `at` on, for at least
 * SIM_PIECE_MIN_NS: the earliest time between its spans (a span of
 * another rank's counting its spin after it), and in *lenp for how long
 * (UINT64_MAX: from then on). */
static uint64_t core_gap(const struct sim *s, const struct sim_core *c, int r,
			 uint64_t at, uint64_t *lenp)
{
	uint64_t x = max64(at, c->floor);
	size_t lo = 0, hi = c->n, mid;

	/* spans that start longer than the longest ago end before x: from
	 * the first that does not (by start, a binary search) */
	while (x > c->longest && lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (c->busy[mid].start + c->longest <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < c->n; i++) {
		const struct sim_busy *b = &c->busy[i];
		uint64_t end = b->end + core_hold(s, b->rank, r);

		if (end <= x)
			continue;
		if (b->start >= x + SIM_PIECE_MIN_NS) {
			*lenp = b->start - x;
			return x;
		}
		x = end;
	}
	*lenp = UINT64_MAX;
	return x;
}

/* Span b of core c has its end now: the longest span yet (core_gap's
 * search) counts it, with a spin after it. */
static void core_longest(const struct sim *s, struct sim_core *c,
			 const struct sim_busy *b)
{
	c->longest =
		max64(c->longest, b->end - b->start + (uint64_t)s->cpu.spin_ns);
}

/* Books [start, end) for r on c, in order; spans long past are dropped
 * (their end becomes the core's floor).  Without memory for one more, the
 * core keeps only its floor: the work goes after all of it, as booked. */
static void core_book(struct sim *s, struct sim_core *c, int r, uint64_t start,
		      uint64_t end)
{
	size_t old = 0, i;

	while (old < c->n && c->busy[old].end + SIM_CORE_KEEP_NS < s->clk.now)
		c->floor = max64(c->floor, c->busy[old++].end);
	if (old) {
		c->n -= old;
		memmove(c->busy, c->busy + old, c->n * sizeof(*c->busy));
	}
	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 16;
		struct sim_busy *b = realloc(c->busy, cap * sizeof(*b));

		if (!b) {
			for (i = 0; i < c->n; i++)
				c->floor = max64(c->floor, c->busy[i].end);
			c->floor = max64(c->floor, end);
			c->n = 0;
			return;
		}
		c->busy = b;
		c->cap = cap;
	}
	for (i = c->n; i > 0 && c->busy[i - 1].start > start; i--)
		;
	memmove(c->busy + i + 1, c->busy + i, (c->n - i) * sizeof(*c->busy));
	c->busy[i] = (struct sim_busy){start, end, r};
	c->n++;
	core_longest(s, c, &c->busy[i]);
}

/*
 * A core of rank r's pool for t ns of work from *startp on (above).  The
 * work takes the pool's free time in order: the first gap from *startp
 * on, of whichever core (the one r last worked on, where two are free as
 * soon), as much of it as it needs, then the next, and so on.  Work put
 * later in time than some booked before it runs in the gaps those leave,
 * as a kernel's time slices would run it: what was booked first keeps its
 * time.  Sets *startp and *endp to the first piece's start and the last
 * one's end; returns the last one's core.  r < 0: not a rank's work (a
 * delay line, which sleeps after it: the core's spinner is nobody); pool:
 * the pool's start (core_pool).
 */
static int core_take(struct sim *s, int r, size_t pool, uint64_t t,
		     uint64_t *startp, uint64_t *endp)
{
	struct sim_core *core = s->cores + pool;
	int mine = r >= 0 ? s->rank_core[r] : -1, pick = 0;
	uint64_t at = *startp, left = t, first = UINT64_MAX;

	while (left) {
		uint64_t best = UINT64_MAX, blen = 0, g, len, take;

		for (int i = 0; i < s->cpu.cores; i++) {
			g = core_gap(s, &core[i], r, at, &len);
			if (g < best || (g == best && i == mine)) {
				best = g;
				blen = len;
				pick = i;
			}
		}
		take = FR_MIN(left, blen);
		core_book(s, &core[pick], r, best, best + take);
		if (first == UINT64_MAX)
			first = best;
		left -= take;
		at = best + take;
		mine = pick;
	}
	*startp = first == UINT64_MAX ? at : first;
	*endp = at;
	return pick;
}

static void cores_free(struct sim *s)
{
	for (size_t i = 0; s->cores && i < s->ncores; i++)
		free(s->cores[i].busy);
	free(s->cores);
	s->cores = NULL;
}

static void cpu_take_from(struct sim *s, int r, uint64_t t, uint64_t from)
{
	uint64_t start = max64(s->cpu_free[r], from), end = start + t;

	if (!t) /* a term of 0 costs nothing, not even a core */
		return;
	if (s->cpu.cores)
		s->rank_core[r] =
			core_take(s, r, core_pool(s, r), t, &start, &end);
	s->cpu_free[r] = end;
}

/*
 * The delay line of the node of the write's receiver lets it go (sim.h):
 * from once the line is done with the writes before, on a core of the
 * node's pool, and from when the write is due or, with a cost per byte,
 * from when its first bytes land (*at).  Returns when the write is let
 * go; *at becomes when its receiver can start on it.
 */
static uint64_t dl_take(struct sim *s, const struct sim_event *e, uint64_t *at)
{
	int node = e->to / s->net.p.ranks_per_node;
	bool bytes = s->cpu.dl_GBps > 0;
	bool busy = s->dl_free[node] > (bytes ? *at : s->clk.now);
	double fixed = e->joined		       ? 0
		       : busy && s->cpu.dl_busy_ns > 0 ? s->cpu.dl_busy_ns
						       : s->cpu.dl_ns;
	uint64_t t = cpu_ns(fixed, e->len, s->cpu.dl_GBps);
	uint64_t chunk =
		cpu_ns(fixed, FR_MIN(e->len, SIM_CHUNK), s->cpu.dl_GBps);
	uint64_t start = max64(bytes ? *at : s->clk.now, s->dl_free[node]);
	uint64_t end = start + t;

	if (s->cpu.cores && t)
		core_take(s, -1, core_pool(s, e->to), t, &start, &end);
	s->dl_work += t;
	/* (with no cost per byte, start is from now: end is start + t) */
	end = max64(end, s->clk.now + chunk);
	s->dl_free[node] = end;
	/* per byte, the first chunk once the line is through with it; per
	 * write, the whole stream held back by the line's work */
	*at = bytes ? max64(*at, start + chunk) : *at + (end - s->clk.now);
	return end;
}

static void cpu_take(struct sim *s, int r, uint64_t t)
{
	cpu_take_from(s, r, t, s->clk.now);
}

/*
 * A write from another node taken in by its receiver: recv_ns and its
 * bytes at recv_GBps.  A stream's bytes are taken in as they come (a
 * socket's reader gets each chunk as it lands), so the work may start
 * while the bytes before the last chunk land (from `at`, e->span before
 * the last lands, or the delay line lets the first go); it ends no sooner
 * than the last chunk's share after `last` (now, or when the delay line
 * lets it go).  One that joined a stream (clk_due) comes in the read of
 * the write before it: no recv_ns of its own.
 */
static void recv_take(struct sim *s, const struct sim_event *e, uint64_t at,
		      uint64_t last)
{
	double fixed = e->joined ? 0 : s->cpu.recv_ns;
	uint64_t w = cpu_ns(fixed, e->len, s->cpu.recv_GBps);
	uint64_t tail =
		cpu_ns(fixed, FR_MIN(e->len, SIM_CHUNK), s->cpu.recv_GBps);

	if (!w)
		return; /* nothing to do: not even idle time ended */
	cpu_take_from(s, e->to, w, at);
	if (s->cpu_free[e->to] < last + tail) {
		/* busy until its last chunk is in: on its core too */
		s->cpu_free[e->to] = last + tail;
		if (s->cpu.cores) {
			int r = e->to, mine = s->rank_core[r];
			struct sim_core *c;

			/* (unless work was put after its own there) */
			c = mine >= 0 ? s->cores + core_pool(s, r) + mine
				      : NULL;
			if (c && c->n && c->busy[c->n - 1].rank == r) {
				struct sim_busy *b = &c->busy[c->n - 1];

				b->end = max64(b->end, s->cpu_free[r]);
				core_longest(s, c, b);
			}
		}
	}
}

/* The simulation's one job, for the reduction hook (a process-wide
 * function pointer; the fake's clock is the process's too). */
static struct sim *hook_sim;

/* The kernel every algorithm gets while a collective runs with a CPU
 * model or sizes only: the real one (unless sizes only), and its time. */
static void sim_reduce(void *dst, const void *a, const void *b, size_t n)
{
	struct sim *s = hook_sim;

	if (!(s->flags & SIM_SIZES_ONLY))
		s->real(dst, a, b, n);
	if (s->cpu_on && s->cpu.reduce_GBps > 0)
		cpu_take(s, s->cur,
			 cpu_ns(0, n * s->esize, s->cpu.reduce_GBps));
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
static bool ev_push(struct sim *s, uint64_t due, uint64_t span, bool joined,
		    int rank, int to, size_t len)
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
	if (s->inflight && !sim_net_same_node(&s->net, rank, to))
		s->inflight[to] += len;
	s->ev[i] = (struct sim_event){.due = due,
				      .span = span,
				      .joined = joined,
				      .seq = s->seq++,
				      .rank = rank,
				      .to = to,
				      .len = len};
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

/*
 * A write posted by `from`: when it lands.  With a CPU model it leaves at
 * the sender's CPU time, after the send's work when it goes to another
 * node; a copy within the node is the sender's work until it ends.
 */
static uint64_t clk_due(struct fake_clock *clk, int from, int to, size_t len)
{
	struct sim *s = sim_of(clk);
	uint64_t due, span = 0, t = clk->now;
	bool joined = false;

	if (s->cpu_on && sim_net_same_node(&s->net, from, to)) {
		/* the copy is this CPU's (a core's) work: the network's copy
		 * then runs just when the CPU does it */
		uint64_t copy = sim_net_copy_ns(&s->net, len);

		cpu_take(s, from, copy);
		due = sim_net_due(&s->net, s->cpu_free[from] - copy, from, to,
				  len);
	} else if (s->cpu_on) {
		/* a stream (TCP's): its first chunk leaves once the sender
		 * has made it, and the rest goes while the sender makes it;
		 * the last byte cannot land before the sender is done */
		struct sim_stream *st = &s->streams[(size_t)from * SIM_STREAMS +
						    (size_t)to % SIM_STREAMS];
		double fixed = s->cpu.send_ns;
		uint64_t w, head, leave;

		/* joins the stream to `to` while an earlier write is still
		 * on its way: no call of its own on either side */
		joined = st->to == to + 1 &&
			 st->due > max64(t, s->cpu_free[from]);
		if (joined)
			fixed = 0;
		w = cpu_ns(fixed, len, s->cpu.send_GBps);
		head = cpu_ns(fixed, FR_MIN(len, SIM_CHUNK), s->cpu.send_GBps);
		cpu_take(s, from, w);
		/* (no work at all: it leaves now, as before the model) */
		leave = w ? s->cpu_free[from] - w + head
			  : max64(t, s->cpu_free[from]);
		due = max64(sim_net_due(&s->net, leave, from, to, len),
			    s->cpu_free[from]);
		st->to = to + 1;
		st->due = due;
		/* the bytes before the last chunk land over this long */
		span = FR_MIN(
			due - leave,
			len > SIM_CHUNK
				? (uint64_t)ceil((double)(len - SIM_CHUNK) * 8 /
						 s->net.p.link_gbps)
				: 0);
	} else {
		due = sim_net_due(&s->net, t, from, to, len);
	}
	if (!ev_push(s, due, span, joined, from, to, len))
		s->ev_nomem = true;
	return due;
}

static void clk_ready(struct fake_clock *clk, int rank)
{
	runq_push(sim_of(clk), rank);
}

/*
 * The grid's links, for the model (select.c, "the grid's links"): where
 * FR_TOPO's grid lines up with the fat tree's switches (the first d
 * dimensions' nodes are the nodes under one switch of level d - 1), the
 * grid's dimension d crosses that switch's uplink, whose rate the model
 * is given as grid_beta_ns[d], as a tune file would give it.
 */
static void sim_grid_betas(const struct sim_net_params *p,
			   const struct fr_comm *c, struct fr_tune *t)
{
	double gbps = p->link_gbps;
	long below = 1, group = 1;

	if (p->topo != SIM_FAT_TREE || !c->topo.nlevels)
		return;
	for (int l = 0; l < p->levels && l + 1 < c->topo.ngrid; l++) {
		below *= p->fanout[l];
		group *= c->topo.grid[l];
		gbps = gbps * p->fanout[l] / p->oversub[l];
		if (below != group)
			return;
		t->grid_beta_ns[l + 1] = 8.0 / gbps;
	}
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

	s->cur = r;
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

int sim_open(struct sim *s, const struct sim_net_params *p,
	     const struct sim_cpu_params *cpu, const fr_config_t *cfg,
	     unsigned int flags)
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
	s->cpu_free = calloc((size_t)s->n, sizeof(*s->cpu_free));
	if (cpu) {
		/* the terms by name (not by walking the struct's fields);
		 * the spin alone costs nothing */
		const double v[] = {cpu->reduce_GBps, cpu->send_ns,
				    cpu->send_GBps,   cpu->recv_ns,
				    cpu->recv_GBps,   cpu->wake_ns,
				    cpu->spin_ns,     cpu->dl_ns,
				    cpu->dl_GBps,     cpu->dl_busy_ns};

		s->cpu = *cpu;
		for (size_t i = 0; i < sizeof(v) / sizeof(*v); i++) {
			if (!(v[i] >= 0) || !isfinite(v[i])) {
				rc = FR_EINVAL;
				snprintf(s->err, sizeof(s->err),
					 "CPU costs must be finite and >= 0");
				goto err_alloc;
			}
			s->cpu_on |= v[i] > 0 && &v[i] != &v[6];
		}
		if (cpu->cores < 0 || cpu->cores > 1 << 20) {
			rc = FR_EINVAL;
			snprintf(s->err, sizeof(s->err), "%d cores",
				 cpu->cores);
			goto err_alloc;
		}
		if (s->cpu_on && cpu->cores) {
			size_t nc =
				(size_t)cpu->cores *
				(size_t)(cpu->cores_job
						 ? 1
						 : p->nranks /
							   p->ranks_per_node);

			s->cores = calloc(nc, sizeof(*s->cores));
			s->ncores = nc;
			s->rank_core = malloc((size_t)s->n * sizeof(int));
			s->inflight = calloc((size_t)s->n, sizeof(size_t));
			if (s->rank_core) {
				memset(s->rank_core, 0xff,
				       (size_t)s->n * sizeof(int));
			}
		}
		if (s->cpu_on)
			s->streams = calloc((size_t)s->n * SIM_STREAMS,
					    sizeof(*s->streams));
		if (s->cpu_on && (cpu->dl_ns > 0 || cpu->dl_GBps > 0))
			s->dl_free =
				calloc((size_t)(p->nranks / p->ranks_per_node),
				       sizeof(uint64_t));
	}
	if (!s->comms || !s->runq || !s->queued || !s->cpu_free ||
	    (s->cpu_on && !s->streams) ||
	    (s->cpu_on && (s->cpu.dl_ns > 0 || s->cpu.dl_GBps > 0) &&
	     !s->dl_free) ||
	    (s->cpu_on && s->cpu.cores &&
	     (!s->cores || !s->rank_core || !s->inflight))) {
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
	if (flags & SIM_SIZES_ONLY)
		s->clk.copy_max = SIM_COPY_MAX;
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
	/* the cost model knows the network's latency and bandwidth, the
	 * node's (a write within it: its latency and copy), and the CPUs',
	 * as a tune file of fr_tune's would give them (one message's send,
	 * wire and receive in turn).  What the simulator does not charge
	 * costs the model nothing either: an algorithm's own copies (the
	 * mailbox's in and out), a TCP step's fresh stream (step_ramp), and
	 * without a CPU model the reductions.
	 * msg_us, a message's own work, keeps its built-in value without a
	 * CPU model (a model that took messages for free would send n^2 of
	 * them) */
	for (int r = 0; r < s->n; r++) {
		struct fr_tune t;
		const struct sim_cpu_params *u = &s->cpu;

		fr_tune_get(s->comms[r], &t);
		t.alpha_us = p->link_lat_ns / 1e3;
		t.beta_ns = 8.0 / p->link_gbps;
		t.local_alpha_us = p->shm_lat_ns / 1e3;
		t.local_beta_ns = 8.0 / p->shm_gbps;
		t.copy_ns = 0;
		t.step_ramp = 0;
		for (int d = 0; d < FR_DTYPE_COUNT; d++)
			t.gamma_ns[d] = 0;
		if (s->cpu_on) {
			t.alpha_us += (u->send_ns + u->recv_ns) / 1e3;
			t.beta_ns += (u->send_GBps > 0 ? 1 / u->send_GBps : 0) +
				     (u->recv_GBps > 0 ? 1 / u->recv_GBps : 0);
			if (u->send_ns + u->recv_ns > 0)
				t.msg_us = (u->send_ns + u->recv_ns) / 1e3;
			if (u->reduce_GBps > 0)
				for (int d = 0; d < FR_DTYPE_COUNT; d++)
					t.gamma_ns[d] = 1 / u->reduce_GBps;
		}
		sim_grid_betas(p, s->comms[r], &t);
		snprintf(t.source, sizeof(t.source), "the simulated network%s",
			 s->cpu_on ? " and CPUs" : "");
		fr_tune_set(s->comms[r], &t);
	}
	return 0;

err_job:
	fake_tp_clock(NULL);
err_alloc:
	free(s->streams);
	free(s->inflight);
	free(s->dl_free);
	free(s->rank_core);
	cores_free(s);
	free(s->cpu_free);
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
	free(s->streams);
	free(s->inflight);
	free(s->dl_free);
	free(s->rank_core);
	cores_free(s);
	free(s->cpu_free);
	free(s->queued);
	free(s->runq);
	free(s->comms);
	sim_net_fini(&s->net);
	memset(s, 0, sizeof(*s));
}

/* Start the collective on rank r (sim_collective's buffers). */
static int coll_start(struct sim *s, int r, enum fr_coll coll, void *buf,
		      size_t count, fr_dtype_t dt, fr_op_t op,
		      fr_request_t **req)
{
	uint8_t *own = (uint8_t *)buf + (size_t)r * count * fr_dtype_size(dt);

	switch (coll) {
	case FR_COLL_REDUCE_SCATTER:
		return fr_ireduce_scatter(s->comms[r], buf, own, count, dt, op,
					  req);
	case FR_COLL_ALLGATHER:
		return fr_iallgather(s->comms[r], own, buf, count, dt, req);
	default:
		return fr_iallreduce(s->comms[r], buf, buf, count, dt, op, req);
	}
}

int sim_allreduce(struct sim *s, void **bufs, size_t count, fr_dtype_t dt,
		  fr_op_t op, uint64_t *ns)
{
	return sim_collective(s, FR_COLL_ALLREDUCE, bufs, count, dt, op, ns);
}

int sim_collective(struct sim *s, enum fr_coll coll, void **bufs, size_t count,
		   fr_dtype_t dt, fr_op_t op, uint64_t *ns)
{
	return sim_collective_calls(s, coll, bufs, count, dt, op, 1, NULL, NULL,
				    ns);
}

int sim_collective_calls(struct sim *s, enum fr_coll coll, void **bufs,
			 size_t count, fr_dtype_t dt, fr_op_t op, int calls,
			 void (*refill)(void *arg, int r, void *buf), void *arg,
			 uint64_t *ns)
{
	fr_request_t **req = calloc((size_t)s->n, sizeof(*req));
	/* per rank: calls done, and when the last ended; per call the
	 * slowest rank's time */
	int *done_calls = calloc((size_t)s->n, sizeof(int));
	uint64_t *prev = calloc((size_t)s->n, sizeof(uint64_t));
	int untimed = s->untimed > 0 ? s->untimed : 0;
	uint64_t *slowest = calloc((size_t)(calls > 0 ? calls + untimed : 1),
				   sizeof(uint64_t));
	uint64_t start = s->clk.now;
	int left = s->n, first = 0, rc;
	/* per rank, with s->barrier: in the barrier after its last call */
	uint8_t *in_bar = s->barrier ? calloc((size_t)s->n, 1) : NULL;

	if (!req || !done_calls || !prev || !slowest || calls < 1 ||
	    (s->barrier && !in_bar)) {
		free(in_bar);
		free(slowest);
		free(prev);
		free(done_calls);
		free(req);
		return calls < 1 ? FR_EINVAL : FR_ENOMEM;
	}
	s->ev_nomem = false;
	/* the kernel under the hook: this collective's, timed by the CPU
	 * model or not run at all (sizes only); the algorithms take it
	 * when each request starts */
	fr_reduce_set_hook(NULL);
	if (s->cpu_on || (s->flags & SIM_SIZES_ONLY)) {
		s->real = fr_reduce_kernel(dt, op);
		s->esize = fr_dtype_size(dt);
		if (s->real) {
			hook_sim = s;
			fr_reduce_set_hook(sim_reduce);
		}
	}
	/* it starts once every rank's CPU is done with the one before
	 * (whose time ended with the last of them), on every rank at once */
	for (int r = 0; r < s->n; r++)
		start = max64(start, s->cpu_free[r]);
	/* (a rank's own clock says when it starts: the CPU model's) */
	for (int r = 0; r < s->n; r++) {
		s->cur = r;
		s->cpu_free[r] =
			start + (s->cpu_on ? (uint64_t)r * s->stagger_ns +
						     (r ? s->lead_ns : 0)
					   : 0);
		prev[r] = s->cpu_free[r];
		rc = coll_start(s, r, coll, bufs[r], count, dt, op, &req[r]);
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
			if (in_bar && in_bar[r]) {
				/* out of the barrier: the next call's time
				 * starts now */
				in_bar[r] = 0;
				prev[r] = max64(s->clk.now, s->cpu_free[r]);
			} else {
				uint64_t e = max64(s->clk.now, s->cpu_free[r]);
				int k = done_calls[r]++;

				slowest[k] = max64(slowest[k], e - prev[r]);
				prev[r] = e;
				/* before every timed call but a first from
				 * the common start; the untimed ones (the
				 * tool's warm-up and line-up) run back to
				 * back, as fr_allreduce_perf runs them */
				if (!rc && in_bar && done_calls[r] >= untimed &&
				    done_calls[r] < calls + untimed) {
					s->cur = r;
					rc = fr_ibarrier(s->comms[r], &req[r]);
					if (!rc) {
						in_bar[r] = 1;
						runq_push(s, r);
						continue;
					}
					req[r] = NULL;
					snprintf(s->err, sizeof(s->err),
						 "rank %d: barrier: %s", r,
						 fr_comm_last_error(
							 s->comms[r]));
					first = first ? first : rc;
				}
			}
			if (!rc && done_calls[r] < calls + untimed) {
				/* the next call, at once */
				if (refill)
					refill(arg, r, bufs[r]);
				s->cur = r;
				rc = coll_start(s, r, coll, bufs[r], count, dt,
						op, &req[r]);
				if (!rc) {
					runq_push(s, r);
					continue;
				}
				req[r] = NULL;
			}
			left--;
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
			bool across = !sim_net_same_node(&s->net, e.rank, e.to);
			uint64_t at, last;

			if (s->inflight && across)
				s->inflight[e.to] -= e.len;

			s->events++;
			s->clk.now = e.due;
			/* the receiver takes it in as it lands, woken
			 * first if it slept: when its first bytes land (a
			 * stream's span before now), or past its node's
			 * delay line (sim.h) */
			at = s->clk.now - e.span;
			last = s->clk.now;
			if (s->dl_free && across &&
			    (!e.joined || s->cpu.dl_GBps > 0))
				last = dl_take(s, &e, &at);
			if (s->cpu_on && s->cpu.wake_ns > 0 &&
			    at > s->cpu_free[e.to] &&
			    at - s->cpu_free[e.to] > (uint64_t)s->cpu.spin_ns)
				cpu_take_from(s, e.to,
					      cpu_ns(s->cpu.wake_ns, 0, 0), at);
			if (s->cpu_on && across)
				recv_take(s, &e, at, last);
			/* it acts on the write once its line let it go,
			 * whatever its work on it */
			if (s->dl_free && s->cpu_free[e.to] < last)
				s->cpu_free[e.to] = last;
			runq_push(s, e.rank);
		} while (s->nev && s->ev[0].due == s->clk.now);
	}
	/* stalled or out of memory: the requests left go with the job,
	 * which is good for sim_close only */
	/* the real kernels again, for whatever runs between collectives */
	fr_reduce_set_hook(NULL);
	/* (one call: the slowest rank's time from the common start) */
	qsort(slowest + untimed, (size_t)calls, sizeof(*slowest), pc_cmp_u64);
	*ns = calls % 2 ? slowest[untimed + calls / 2]
			: (slowest[untimed + calls / 2 - 1] +
			   slowest[untimed + calls / 2]) /
				  2;
	free(in_bar);
	free(slowest);
	free(prev);
	free(done_calls);
	free(req);
	return first;
}
