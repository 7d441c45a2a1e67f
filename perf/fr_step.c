/* SPDX-License-Identifier: MIT */
/*
 * fr_step - step-time analysis of data-parallel training on a real job.
 *
 * A model is a list of per-layer gradient sizes and backward times (a
 * preset: ResNet-50, BERT-base, VGG-16, GPT-2 small; or a --model file).
 * Every rank runs training steps on the communicator: backward visits the
 * layers from the last to the first, emulating each layer's compute
 * (sleeping for its time, as a rank whose accelerator computes while the
 * CPU is free; or --compute spin, a busy CPU), and the gradients are
 * All-Reduced in one of four ways:
 *   after            one fr_allreduce of the whole arena once backward is
 *                    over;
 *   overlap          gradient buckets (fr_buckets_*): each layer's range is
 *                    marked ready as backward produces it, and a bucket's
 *                    All-Reduce runs while backward goes on;
 *   overlap_bf16     the same with bf16 on the wire;
 *   overlap_int8_ef  the same with int8 on the wire and error feedback.
 * For each mode it measures the backward alone (compute), the All-Reduce(s)
 * alone (comm) and the step, and derives the exposed communication (step -
 * compute), the overlap fraction (1 - exposed / comm) and the scaling
 * efficiency (compute / step).  Every figure is the median over steps of
 * the slowest rank's time, so every rank agrees on it.
 *
 * The same step is predicted by an event simulation (step/sim.c) under the
 * library's cost model, whose parameters the tool calibrates on the job
 * itself (alpha, beta, gamma; per compression format, the codec's cost),
 * and the prediction is printed next to the measurement with its error.
 * The calibrated model then predicts other job sizes and link speeds: a
 * table, --csv rows and --plot PNGs (gnuplot).
 *
 * It links the library's internals, like fr_tune, to force an algorithm
 * while calibrating and to read and set the communicator's cost model.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "compress.h"
#include "fastreduce.h"
#include "internal.h"
#include "peer.h"
#include "perf_common.h"
#include "perf_kernel.h"
#include "reduce.h"
#include "step/step.h"

extern char **environ;

enum { M_AFTER, M_OVERLAP, M_BF16, M_INT8, M_COUNT };

static const struct mode {
	const char *name, *alias, *what;
	int buckets, compress, ef;
} modes[M_COUNT] = {
	[M_AFTER] = {"after", "after_backward", "all-reduce after backward", 0,
		     FR_COMPRESS_NONE, 0},
	[M_OVERLAP] = {"overlap", "overlap_f32", "bucketed overlap", 1,
		       FR_COMPRESS_NONE, 0},
	[M_BF16] = {"overlap_bf16", "bf16", "overlap + bf16 on the wire", 1,
		    FR_COMPRESS_BF16, 0},
	[M_INT8] = {"overlap_int8_ef", "int8",
		    "overlap + int8 with error feedback", 1, FR_COMPRESS_INT8,
		    1},
};

#define MAX_RATES 16
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MAX_RANKS 32

/* Long options without a short letter. */
enum {
	OPT_TFLOPS = 256,
	OPT_CALIBRATE,
	OPT_COMPUTE,
	OPT_NO_FIT,
	OPT_LINE,
	OPT_ALPHA,
	OPT_RATES,
	OPT_RANKS,
	OPT_CSV,
	OPT_PLOT,
	OPT_SAVE,
	OPT_MAXERR,
	OPT_PREDICT,
	OPT_PROGRESS,
	OPT_FIRST,
	OPT_SIM,
	OPT_SIM_ARGS,
};

struct opts {
	const char *model; /* a preset's name or a file */
	double scale, compute_ms, tflops;
	bool calibrate, spin, fit, list, predict_only, verbose;
	long batch; /* 0: the preset's */
	size_t bucket_bytes, first_bytes;
	long steps, warmup;
	double line_gbit, alpha_us, max_error;
	double rates[MAX_RATES];
	int nrates;
	int ranks[MAX_RANKS];
	int nranks;
	const char *csv, *plot, *save;
	const char *sim, *sim_args; /* fr_sim for the projections */
	unsigned modes;	     /* 1 << M_* */
	bool buckets_scaled; /* default sizes x scale */
	int progress;	     /* fr_progress_t */
};

/* One mode's figures: measured at this job size, and predicted for it. */
struct outcome {
	bool ran;
	const char *skipped; /* why a selected mode did not run */
	struct st_result meas, pred;
};

struct job {
	const struct opts *o;
	fr_comm_t *comm;
	int rank, n;
	struct st_model *m;
	struct st_bucket *bk;
	int nb;
	float *arena; /* the gradients */
	struct st_link link;
	struct fr_tune choose; /* the communicator's, which picks algorithms */
	double eta;	       /* goodput / line rate, for other link speeds */
	struct st_simtab *sim; /* --sim: the projections' f32 times */
	struct outcome out[M_COUNT];
};

/* ---- helpers ------------------------------------------------------------- */

static void check(struct job *j, int rc, const char *what)
{
	if (!rc)
		return;
	fprintf(stderr, "fr_step: rank %d: %s: %s (%s)\n", j->rank, what,
		fr_strerror(rc), fr_comm_last_error(j->comm));
	exit(1);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Element-wise maximum over the ranks: a step is as slow as its slowest
 * rank, and every rank ends with the same numbers. */
static void agree_max(struct job *j, double *v, size_t n)
{
	check(j, fr_allreduce(j->comm, FR_IN_PLACE, v, n, FR_F64, FR_MAX),
	      "fr_allreduce(FR_MAX)");
}

static void sleep_until(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
			      .tv_nsec = (long)(ns % 1000000000u)};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
	       EINTR)
		;
}

/* ---- the step --------------------------------------------------------------
 */

/*
 * Backward: the layers from the last to the first, each one's compute, then
 * its gradient range marked ready (b != NULL).  Sleeping runs to deadlines
 * counted from the start of backward: an accelerator keeps computing while
 * the CPU is inside the library, and timer slack does not add up over a
 * hundred layers.  Spinning burns each layer's time on this CPU after the
 * previous one's marking, as CPU training would.
 */
static void backward(struct job *j, fr_buckets_t *b)
{
	uint64_t due = pc_now_ns();

	for (int l = j->m->nlayers - 1; l >= 0; l--) {
		const struct st_layer *y = &j->m->layers[l];
		uint64_t ns = (uint64_t)llround(y->ms * 1e6);

		if (j->o->spin) {
			uint64_t end = pc_now_ns() + ns;

			while (pc_now_ns() < end)
				;
		} else {
			due += ns;
			sleep_until(due);
		}
		if (b && y->params)
			check(j, fr_buckets_ready(b, y->off, y->params),
			      "fr_buckets_ready");
	}
}

/*
 * Everything timed is a phase, and the phases run in rounds: every round
 * runs each phase once (calibration points, the backward alone, and per
 * mode the communication alone and the step), so that all of them see the
 * same machine.  A host shared with other jobs, or eight ranks on two
 * cores, changes speed over a run; measured one after the other, the
 * calibration and the steps it predicts would not see the same host.
 */
enum phase_kind {
	PH_COMPUTE, /* backward alone */
	PH_COMM,    /* the All-Reduce(s) alone: everything ready at once */
	PH_STEP,    /* backward, marking buckets, then the rest */
	PH_ENCODE,  /* the codec, ns per value */
	PH_DECODE,
};

#define MAX_PHASES 24

struct phase {
	enum phase_kind kind;
	int mode;	 /* M_*, or -1 */
	fr_buckets_t *b; /* NULL: one fr_allreduce of count elements */
	size_t count;
	int algo;      /* forced (calibration), else FR_ALGO_AUTO */
	double weight; /* calibration: All-Reduces of this size a step has */
	char what[48];
	double *v; /* one value per round */
	double med;
};

/* The codec's buffers (PH_ENCODE / PH_DECODE): 1 Mi values, as the
 * compressed ring encodes them chunk by chunk. */
#define CODEC_VALUES (1u << 20)

struct codec {
	float *src, *dst, *res; /* res: error feedback */
	void *wire;
};

static double run_phase(struct job *j, struct phase *ph, struct codec *cd)
{
	int fmt = ph->mode >= 0 ? modes[ph->mode].compress : 0;
	uint64_t t0;
	int saved;

	if (ph->kind == PH_ENCODE || ph->kind == PH_DECODE) {
		t0 = pc_now_ns();
		if (ph->kind == PH_ENCODE)
			fr_codec_encode(fmt, cd[ph->mode].wire,
					cd[ph->mode].src, CODEC_VALUES,
					cd[ph->mode].res, NULL);
		else
			fr_codec_decode(fmt, cd[ph->mode].dst,
					cd[ph->mode].wire, CODEC_VALUES);
		return (double)(pc_now_ns() - t0) / CODEC_VALUES;
	}
	/* a barrier starts every step together, as the previous step's
	 * All-Reduce would */
	check(j, fr_barrier(j->comm), "fr_barrier");
	saved = fr_algo_force(j->comm, ph->algo);
	t0 = pc_now_ns();
	if (ph->kind != PH_COMM)
		backward(j, ph->kind == PH_STEP ? ph->b : NULL);
	if (ph->kind == PH_COMPUTE) {
	} else if (ph->b) {
		if (ph->kind == PH_COMM)
			check(j, fr_buckets_ready(ph->b, 0, ph->count),
			      "fr_buckets_ready");
		check(j, fr_buckets_wait(ph->b), "fr_buckets_wait");
	} else {
		check(j,
		      fr_allreduce(j->comm, FR_IN_PLACE, j->arena, ph->count,
				   FR_F32, FR_AVG),
		      "fr_allreduce");
	}
	fr_algo_force(j->comm, saved);
	return (double)(pc_now_ns() - t0) * 1e-6;
}

/*
 * Warm-up rounds, then one value per phase per round; each value becomes
 * the slowest rank's (a step is as slow as its last rank), and each
 * phase's figure is the median over rounds.
 */
static void run_rounds(struct job *j, struct phase *ph, int nph,
		       struct codec *cd)
{
	long steps = j->o->steps;
	double *all = calloc((size_t)nph * (size_t)steps, sizeof(double));

	if (!all)
		check(j, FR_ENOMEM, "timings");
	for (long r = -j->o->warmup; r < steps; r++)
		for (int i = 0; i < nph; i++) {
			double t = run_phase(j, &ph[i], cd);

			if (r >= 0)
				all[(size_t)i * (size_t)steps + (size_t)r] = t;
		}
	agree_max(j, all, (size_t)nph * (size_t)steps);
	for (int i = 0; i < nph; i++) {
		double *v = all + (size_t)i * (size_t)steps;

		ph[i].med = median(v, (int)steps);
		if (j->o->verbose && !j->rank)
			printf("# timing %-26s %10zu x %-3ld median %9.3f, min %9.3f, max %9.3f %s\n",
			       ph[i].what, ph[i].count, steps, ph[i].med, v[0],
			       v[steps - 1],
			       ph[i].kind >= PH_ENCODE ? "ns/value" : "ms");
	}
	free(all);
}

/* ---- calibration ----------------------------------------------------------
 */

/* This CPU's rate (GFLOP/s) for a plain single-core GEMM: what --calibrate
 * derives the layers' times from. */
static double gemm_gflops(void)
{
	enum { N = 192 };
	float *a = malloc(sizeof(float) * N * N),
	      *b = malloc(sizeof(float) * N * N),
	      *c = malloc(sizeof(float) * N * N);
	double best = 1e30, sink = 0;

	if (!a || !b || !c) {
		free(a);
		free(b);
		free(c);
		return 0;
	}
	for (int i = 0; i < N * N; i++) {
		a[i] = (float)(i % 13) * 0.25f;
		b[i] = (float)(i % 7) * 0.5f;
	}
	for (int r = 0; r < 7; r++) {
		uint64_t t0 = pc_now_ns();

		memset(c, 0, sizeof(float) * N * N);
		for (int i = 0; i < N; i++)
			for (int k = 0; k < N; k++) {
				float aik = a[i * N + k];

				for (int x = 0; x < N; x++)
					c[i * N + x] += aik * b[k * N + x];
			}
		best = fmin(best, (double)(pc_now_ns() - t0));
		sink += c[r];
	}
	free(a);
	free(b);
	free(c);
	/* keep the products alive without printing them */
	return 2.0 * N * N * N / best + (sink < 0 ? 1e-9 : 0);
}

static int lg(int n)
{
	int l = 0;

	while ((2 << l) <= n)
		l++;
	return l;
}

/*
 * The calibration points: recursive doubling on 8 bytes (alpha, as
 * fr_tune) and the ring at the sizes the step All-Reduces (the first
 * bucket, the largest bucket, the whole arena).  Returns the number of
 * phases added.
 */
static int calibration_phases(struct job *j, struct phase *ph)
{
	size_t sizes[3] = {j->bk[0].count, 0, j->m->params};
	double w[3] = {0, 0, (j->o->modes & (1u << M_AFTER)) ? 1 : 0};
	int n = 0;

	ph[n++] = (struct phase){.kind = PH_COMM,
				 .mode = -1,
				 .count = 2,
				 .algo = FR_ALGO_RD,
				 .what = "calibration: rd"};
	for (int i = 0; i < j->nb; i++)
		if (j->bk[i].count > sizes[1])
			sizes[1] = j->bk[i].count;
	/* the weights: buckets of the first bucket's and of the largest
	 * size (the last one, a remainder, counts with the largest), and the
	 * arena of "after" */
	for (int i = 0; i < j->nb; i++)
		w[i && j->bk[i].count != sizes[0]]++;
	for (int i = 0; i < 3; i++) {
		int same = -1;

		for (int k = 0; k < n; k++)
			if (ph[k].algo == FR_ALGO_RING &&
			    ph[k].count == sizes[i])
				same = k;
		if (same >= 0 || !w[i]) {
			if (same >= 0)
				ph[same].weight += w[i];
			continue;
		}
		ph[n++] = (struct phase){.kind = PH_COMM,
					 .mode = -1,
					 .count = sizes[i],
					 .algo = FR_ALGO_RING,
					 .weight = w[i],
					 .what = "calibration: ring"};
	}
	return n;
}

/*
 * The link from the calibration phases: alpha = T_rd / (lg p + 2f), the
 * latency of a message step, as fr_tune measures it; beta from the ring's
 * times as a pipeline, alpha + 2(p-1)/p n beta + gamma's term: the beta
 * with which that gives the sum of the ring's times, each size counted as
 * many times as the step All-Reduces it, so that the sizes that make up the
 * step's time decide, and one slow size weighs by its share of the bytes
 * only.  Sizes whose steps are latency-bound say nothing about beta and
 * are left out (a few rounds settle which those are).  Not the library's
 * ring model, (2(p-1) + 1) alpha + ..., with which the step is predicted
 * (st_allreduce_us): where ranks share cores, rd's alpha is inflated (431
 * us on 8 ranks sharing 2 CPUs at 1 Gbit/s), and the ring's 2(p-1) steps
 * of it, taken off its times, left a beta below the line's (7.1 ns/B at 1
 * Gbit/s) and VGG-16's "after" predicted 28 % short; the pipeline's beta
 * is the line's.
 */
static void fit_link(struct job *j, const struct phase *ph, int nph)
{
	struct fr_tune *tn = &j->link.tune;
	double p = j->n, al = tn->alpha_us, b = tn->beta_ns * 1e-3;
	int L = lg(j->n), f = (1 << L) != j->n;

	for (int i = 0; i < nph; i++)
		if (ph[i].mode < 0 && ph[i].algo == FR_ALGO_RD)
			al = ph[i].med * 1e3 / (L + 2 * f);
	for (int round = 0; round < 4; round++) {
		double num = 0, den = 0;

		for (int i = 0; i < nph; i++) {
			double n = 4.0 * (double)ph[i].count, x, y;

			if (ph[i].mode >= 0 || ph[i].algo != FR_ALGO_RING)
				continue;
			/* latency-bound steps (at the last beta; at first
			 * every size counts) */
			if (round && n / p * b < al)
				continue;
			x = 2 * (p - 1) / p * n;
			y = ph[i].med * 1e3 - al -
			    (p - 1) / p * n * tn->gamma_ns[FR_F32] * 1e-3;
			num += ph[i].weight * y;
			den += ph[i].weight * x;
		}
		if (den > 0)
			b = fmax(num / den, 1e-6);
	}
	tn->alpha_us = al;
	tn->beta_ns = b * 1e3;
	snprintf(tn->source, sizeof(tn->source),
		 "calibrated by fr_step on %d ranks", j->n);
}

/* The library's cut must be the simulation's; a difference (another
 * library version) is reported and the library's cut is used. */
static void check_cut(struct job *j, fr_buckets_t *b)
{
	int nb = fr_buckets_count(b), same = nb == j->nb;
	struct st_bucket *bk;

	for (int i = 0; same && i < nb; i++) {
		size_t off, count;

		check(j, fr_buckets_range(b, i, &off, &count),
		      "fr_buckets_range");
		same = off == j->bk[i].off && count == j->bk[i].count;
	}
	if (same)
		return;
	bk = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*bk));
	if (nb < 0 || !bk)
		check(j, nb < 0 ? nb : FR_ENOMEM, "fr_buckets_count");
	for (int i = 0; i < nb; i++)
		check(j, fr_buckets_range(b, i, &bk[i].off, &bk[i].count),
		      "fr_buckets_range");
	if (!j->rank)
		fprintf(stderr,
			"fr_step: the library cut %d buckets, the simulation %d: using the library's\n",
			nb, j->nb);
	free(j->bk);
	j->bk = bk;
	j->nb = nb;
	st_ready_times(j->m, j->bk, j->nb);
}

/* ---- the modes ---------------------------------------------------------- */

/*
 * Set up a mode (its buckets, or the arena registered for one All-Reduce;
 * the codec's buffers) and add its phases.  Returns the number added.
 */
static int mode_phases(struct job *j, int mi, struct phase *ph,
		       struct codec *cd, fr_buckets_t **bk, fr_mem_t **mem)
{
	const struct mode *md = &modes[mi];
	fr_buckets_t *b = NULL;
	int n = 0, rc;

	if (md->buckets) {
		fr_buckets_config_t cfg;

		fr_buckets_config_init(&cfg);
		cfg.bucket_bytes = j->o->bucket_bytes;
		cfg.first_bucket_bytes = j->o->first_bytes;
		cfg.compress = md->compress;
		cfg.error_feedback = md->ef;
		rc = fr_buckets_create(j->comm, j->arena, j->m->params, FR_F32,
				       FR_AVG, &cfg, &b);
		if (rc == FR_ENOTSUP) {
			j->out[mi].skipped =
				"buckets not supported by this library";
			return 0;
		}
		check(j, rc, "fr_buckets_create");
		check_cut(j, b);
		*bk = b;
	} else if (!*mem) {
		/* registered once, as a training loop would */
		check(j,
		      fr_mem_register(j->comm, j->arena,
				      j->m->params * sizeof(float), mem),
		      "fr_mem_register");
	}
	if (md->compress != FR_COMPRESS_NONE) {
		struct codec *c = &cd[mi];

		c->src = malloc(CODEC_VALUES * sizeof(float));
		c->dst = malloc(CODEC_VALUES * sizeof(float));
		c->res = md->ef ? calloc(CODEC_VALUES, sizeof(float)) : NULL;
		c->wire = malloc(fr_compress_bytes(md->compress, CODEC_VALUES));
		if (!c->src || !c->dst || !c->wire || (md->ef && !c->res))
			check(j, FR_ENOMEM, "codec buffers");
		for (size_t i = 0; i < CODEC_VALUES; i++)
			c->src[i] = j->arena[i % j->m->params];
		ph[n] = (struct phase){
			.kind = PH_ENCODE, .mode = mi, .count = CODEC_VALUES};
		snprintf(ph[n++].what, sizeof(ph->what), "%s: encode",
			 md->name);
		ph[n] = (struct phase){
			.kind = PH_DECODE, .mode = mi, .count = CODEC_VALUES};
		snprintf(ph[n++].what, sizeof(ph->what), "%s: decode",
			 md->name);
	}
	for (int k = PH_COMM; k <= PH_STEP; k++) {
		ph[n] = (struct phase){.kind = (enum phase_kind)k,
				       .mode = mi,
				       .b = b,
				       .count = j->m->params};
		snprintf(ph[n++].what, sizeof(ph->what), "%s: %s", md->name,
			 k == PH_COMM ? "comm" : "step");
	}
	return n;
}

/* The same step predicted under link l. */
static void predict(const struct job *j, int mi, const struct st_link *l,
		    struct st_result *r)
{
	const struct mode *md = &modes[mi];

	if (md->buckets)
		st_simulate_buckets(j->m, j->bk, j->nb, l, md->compress, r,
				    NULL);
	else
		st_simulate_after(j->m, l, md->compress, r);
}

/*
 * Measure every selected mode and predict it: set up, run the rounds, fit
 * the link, fill j->out.
 */
static void measure_all(struct job *j)
{
	struct phase ph[MAX_PHASES];
	struct codec cd[M_COUNT] = {0};
	fr_buckets_t *bk[M_COUNT] = {0};
	fr_mem_t *mem = NULL;
	double g[1] = {pc_kernel_ns(FR_F32)};
	int nph = 0;

	/* the kernel is timed alone, in cache, as fr_tune does */
	agree_max(j, g, 1);
	if (j->o->fit && g[0] > 0)
		j->link.tune.gamma_ns[FR_F32] = g[0];
	if (j->o->fit)
		nph += calibration_phases(j, ph + nph);
	ph[nph++] = (struct phase){
		.kind = PH_COMPUTE, .mode = -1, .what = "compute"};
	for (int mi = 0; mi < M_COUNT; mi++)
		if (j->o->modes & (1u << mi))
			nph += mode_phases(j, mi, ph + nph, cd, &bk[mi], &mem);
	run_rounds(j, ph, nph, cd);
	if (j->o->fit)
		fit_link(j, ph, nph);
	for (int i = 0; i < nph; i++) {
		int mi = ph[i].mode;
		struct outcome *out = mi >= 0 ? &j->out[mi] : NULL;

		if (ph[i].kind == PH_COMPUTE) {
			for (int k = 0; k < M_COUNT; k++)
				j->out[k].meas.compute = ph[i].med;
		} else if (out && ph[i].kind == PH_COMM) {
			out->meas.comm = ph[i].med;
		} else if (out && ph[i].kind == PH_STEP) {
			out->meas.step = ph[i].med;
			out->ran = true;
		} else if (out && ph[i].kind == PH_ENCODE) {
			j->link.enc_ns[modes[mi].compress] = ph[i].med;
		} else if (out && ph[i].kind == PH_DECODE) {
			j->link.dec_ns[modes[mi].compress] = ph[i].med;
		}
	}
	for (int mi = 0; mi < M_COUNT; mi++) {
		if (j->out[mi].ran) {
			st_result_derive(&j->out[mi].meas);
			predict(j, mi, &j->link, &j->out[mi].pred);
		}
		if (bk[mi])
			check(j, fr_buckets_destroy(bk[mi]),
			      "fr_buckets_destroy");
		free(cd[mi].src);
		free(cd[mi].dst);
		free(cd[mi].res);
		free(cd[mi].wire);
	}
	if (mem)
		check(j, fr_mem_deregister(mem), "fr_mem_deregister");
}

/* ---- output ------------------------------------------------------------- */

static const char *human(double bytes, char *buf, size_t len)
{
	if (bytes >= 1e9)
		snprintf(buf, len, "%.2f GB", bytes / 1e9);
	else if (bytes >= 1e6)
		snprintf(buf, len, "%.2f MB", bytes / 1e6);
	else
		snprintf(buf, len, "%.1f kB", bytes / 1e3);
	return buf;
}

static void print_header(const struct job *j, const char *transport)
{
	const struct st_model *m = j->m;
	const struct fr_tune *t = &j->link.tune;
	char b1[32], b2[32], b3[32];

	printf("# fr_step: %s - %s\n", m->name, m->what);
	printf("# parameters %llu", (unsigned long long)m->params_full);
	if (m->paper)
		printf(" (paper: %.1fM)", (double)m->paper / 1e6);
	if (j->o->scale != 1)
		printf(" x scale %g = %zu", j->o->scale, m->params);
	printf(" in %d layers: %s of f32 gradients\n", m->nlayers,
	       human(4.0 * (double)m->params, b1, sizeof(b1)));
	printf("# backward %.1f ms per step (%s), emulated by %s\n",
	       m->compute_ms, m->compute_src,
	       j->o->spin ? "spinning on the CPU" : "sleeping");
	if (j->comm)
		printf("# job: %d ranks over %s, progress %s\n", j->n,
		       transport,
		       j->o->progress == FR_PROGRESS_THREAD ? "thread"
							    : "caller");
	else
		printf("# no job: predictions only, from %s\n", t->source);
	printf("# buckets: %s, first %s%s, from the arena's end: %d buckets\n",
	       pc_format_size(j->o->bucket_bytes, b2, sizeof(b2)),
	       pc_format_size(j->o->first_bytes, b3, sizeof(b3)),
	       j->o->buckets_scaled ? " (the defaults x scale)" : "", j->nb);
	printf("# link model (%s): alpha %.1f us, beta %.3f ns/B (%.3f GB/s), copy %.3f ns/B, gamma.f32 %.3f ns/B\n",
	       t->source, t->alpha_us, t->beta_ns, 1 / t->beta_ns, t->copy_ns,
	       t->gamma_ns[FR_F32]);
	printf("# codec per f32 value, encode/decode: bf16 %.2f/%.2f ns, int8+ef %.2f/%.2f ns; other links at %.0f %% of line rate\n",
	       j->link.enc_ns[FR_COMPRESS_BF16],
	       j->link.dec_ns[FR_COMPRESS_BF16],
	       j->link.enc_ns[FR_COMPRESS_INT8],
	       j->link.dec_ns[FR_COMPRESS_INT8], 100 * j->eta);
}

/* The buckets, and where the simulation puts their All-Reduces in each
 * bucketed mode (start-end ms, algorithm) on the link calibrated here. */
static void print_buckets(const struct job *j)
{
	/* no schedule without a link (--list) */
	struct st_sched *sc =
		j->link.nranks >= 2 ? calloc((size_t)j->nb, sizeof(*sc)) : NULL;
	struct st_result r;

	printf("#\n# bucket     offset      count       MB  ready_ms");
	for (int mi = 0; sc && mi < M_COUNT; mi++)
		if (modes[mi].buckets && (j->o->modes & (1u << mi)))
			printf("  %22s", modes[mi].name);
	printf("\n");
	for (int i = 0; i < j->nb; i++) {
		printf("  %6d %10zu %10zu %8.2f %9.2f", i, j->bk[i].off,
		       j->bk[i].count, 4e-6 * (double)j->bk[i].count,
		       j->bk[i].ready_ms);
		for (int mi = 0; sc && mi < M_COUNT; mi++) {
			char cell[64];

			if (!modes[mi].buckets || !(j->o->modes & (1u << mi)))
				continue;
			st_simulate_buckets(j->m, j->bk, j->nb, &j->link,
					    modes[mi].compress, &r, sc);
			snprintf(cell, sizeof(cell), "%.1f-%.1f %s",
				 sc[i].start_ms, sc[i].end_ms,
				 fr_algo_name(sc[i].algo));
			printf("  %22s", cell);
		}
		printf("\n");
	}
	free(sc);
}

static void print_row(const char *mode, const char *src,
		      const struct st_result *r)
{
	printf("  %-16s %-10s %10.2f %10.2f %10.2f %8.3f %10.2f %10.3f", mode,
	       src, r->compute, r->comm, r->exposed, r->overlap, r->step,
	       r->eff);
}

static double err_pct(double pred, double meas)
{
	return meas > 0 ? 100 * (pred - meas) / meas : 0;
}

/* Measured against predicted per mode; returns the largest |step error|. */
static double print_check(const struct job *j)
{
	double worst = 0;

	printf("#\n# %-16s %-10s %10s %10s %10s %8s %10s %10s %9s %9s\n",
	       "mode", "source", "compute_ms", "comm_ms", "exposed_ms",
	       "overlap", "step_ms", "efficiency", "step_err", "comm_err");
	for (int mi = 0; mi < M_COUNT; mi++) {
		const struct outcome *o = &j->out[mi];
		double e;

		if (!(j->o->modes & (1u << mi)))
			continue;
		if (!o->ran) {
			printf("  %-16s skipped: %s\n", modes[mi].name,
			       o->skipped ? o->skipped : "?");
			continue;
		}
		print_row(modes[mi].name, "measured", &o->meas);
		printf("\n");
		print_row(modes[mi].name, "predicted", &o->pred);
		e = err_pct(o->pred.step, o->meas.step);
		printf(" %+8.1f%% %+8.1f%%\n", e,
		       err_pct(o->pred.comm, o->meas.comm));
		worst = fmax(worst, fabs(e));
	}
	printf("# predicted vs measured step time: largest error %.1f %%\n",
	       worst);
	return worst;
}

/* The link of a projection: rate 0 is the one calibrated here. */
static void link_at(const struct job *j, int n, double rate, struct st_link *l)
{
	size_t eager = 0;

	*l = j->link;
	l->nranks = n;
	/* the mailbox a job of n ranks gets: its slots shrink with n, which
	 * the model's window term reads (select.c) */
	if (!j->comm || n != j->n) {
		if (pc_parse_size(getenv("FR_EAGER_BYTES"), &eager))
			eager = 0;
		l->payload_max = fr_mbx_slot_size(n, eager) - FR_MSG_HDR;
	}
	/* a job on another link would be tuned for it: its own model
	 * chooses the algorithms there */
	if (rate > 0) {
		l->tune.beta_ns = 8 / rate / j->eta;
		l->choose = NULL;
	}
	if (j->o->alpha_us >= 0)
		l->tune.alpha_us = j->o->alpha_us;
	l->sim = j->sim;
}

/* The projection of mode mi for the k-th job size and the r-th link
 * (-1: the one calibrated here), as the table, the CSV, the plots and
 * --sim's prefetch all go over them. */
static void project(const struct job *j, int mi, int r, int k,
		    struct st_result *res)
{
	struct st_link l;

	link_at(j, j->o->ranks[k], r < 0 ? 0 : j->o->rates[r], &l);
	predict(j, mi, &l, res);
}

/* The tune file's name without its directories: plots and tables name
 * the file, not where it lay on the machine that drew them. */
static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s && s[1] ? s + 1 : path;
}

/*
 * --sim: note every (ranks, link, size) the projections ask for, then run
 * fr_sim once per (ranks, link) over all its sizes, so that the table, the
 * CSV and the plots then read the same answers.  0, or -1 with the reason
 * printed.
 */
static int sim_prefetch(const struct job *j)
{
	const struct opts *o = j->o;

	if (!j->sim)
		return 0;
	j->sim->recording = 1;
	for (int mi = 0; mi < M_COUNT; mi++) {
		if (!(o->modes & (1u << mi)) ||
		    modes[mi].compress != FR_COMPRESS_NONE)
			continue;
		for (int r = -1; r < o->nrates; r++)
			for (int k = 0; k < o->nranks; k++) {
				struct st_result res;

				project(j, mi, r, k, &res);
			}
	}
	j->sim->recording = 0;
	j->sim->progress = 1;
	if (st_simtab_run(j->sim)) {
		fprintf(stderr, "fr_step: --sim: %s\n", j->sim->err);
		return -1;
	}
	return 0;
}

static void print_projection(const struct job *j)
{
	const struct opts *o = j->o;
	char label[32];

	printf("#\n# projection: step_ms (efficiency) for other job sizes and links; alpha %.1f us%s\n",
	       o->alpha_us >= 0 ? o->alpha_us : j->link.tune.alpha_us,
	       o->alpha_us >= 0 ? " (--alpha-us)" : "");
	if (j->sim)
		printf("# f32 All-Reduce times simulated: %s%s%s, the library's schedules and choice (%d runs); compressed modes by the closed form\n",
		       o->sim, o->sim_args ? " " : "",
		       o->sim_args ? o->sim_args : "", j->sim->runs);
	for (int mi = 0; mi < M_COUNT; mi++) {
		if (!(o->modes & (1u << mi)))
			continue;
		printf("# %s\n# %-10s", modes[mi].name, "link\\ranks");
		for (int k = 0; k < o->nranks; k++)
			printf(" %14d", o->ranks[k]);
		printf("\n");
		for (int r = -1; r < o->nrates; r++) {
			double rate = r < 0 ? 0 : o->rates[r];

			if (rate > 0)
				snprintf(label, sizeof(label), "%gG", rate);
			else
				snprintf(label, sizeof(label), "here");
			printf("  %-10s", label);
			for (int k = 0; k < o->nranks; k++) {
				struct st_result res;

				project(j, mi, r, k, &res);
				printf(" %8.1f (%2.0f%%)", res.step,
				       100 * res.eff);
			}
			printf("\n");
		}
	}
}

static void csv_row(FILE *f, const struct job *j, int mi, const char *kind,
		    const char *link, int n, const struct st_result *r,
		    const char *err)
{
	fprintf(f, "%s,%s,%s,%s,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%s\n",
		j->m->name, modes[mi].name, kind, link, n, r->compute, r->comm,
		r->exposed, r->overlap, r->step, r->eff, err);
}

static int write_csv(const struct job *j, const char *path)
{
	const struct opts *o = j->o;
	FILE *f = fopen(path, "w");
	char link[32], err[32];

	if (!f) {
		fprintf(stderr, "fr_step: %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(f,
		"model,mode,kind,link_gbit,nranks,compute_ms,comm_ms,exposed_ms,overlap,step_ms,efficiency,step_err_pct\n");
	for (int mi = 0; mi < M_COUNT; mi++) {
		const struct outcome *out = &j->out[mi];

		if (!(o->modes & (1u << mi)))
			continue;
		if (out->ran) {
			csv_row(f, j, mi, "measured", "here", j->n, &out->meas,
				"");
			snprintf(err, sizeof(err), "%.2f",
				 err_pct(out->pred.step, out->meas.step));
			csv_row(f, j, mi, "predicted", "here", j->n, &out->pred,
				err);
		}
		for (int r = -1; r < o->nrates; r++) {
			double rate = r < 0 ? 0 : o->rates[r];

			if (rate > 0)
				snprintf(link, sizeof(link), "%g", rate);
			else
				snprintf(link, sizeof(link), "here");
			for (int k = 0; k < o->nranks; k++) {
				struct st_result res;

				project(j, mi, r, k, &res);
				csv_row(f, j, mi, "projected", link,
					o->ranks[k], &res, "");
			}
		}
	}
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, "fr_step: writing %s failed\n", path);
		return -1;
	}
	return 0;
}

/*
 * One PNG per mode, two panels (step time and scaling efficiency against
 * the number of ranks, one line per link speed, the measured point
 * marked), from a self-contained gnuplot script with the data inline: the
 * script is kept, so a plot can be restyled without rerunning the job.
 */
static int write_plots(const struct job *j, const char *dir)
{
	const struct opts *o = j->o;
	char gp[4096], src[320];
	FILE *f;
	pid_t pid;
	int st, rc;
	char *argv[3];

	if (mkdir(dir, 0777) && errno != EEXIST) {
		fprintf(stderr, "fr_step: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	snprintf(gp, sizeof(gp), "%s/%s.gp", dir, j->m->name);
	f = fopen(gp, "w");
	if (!f) {
		fprintf(stderr, "fr_step: %s: %s\n", gp, strerror(errno));
		return -1;
	}
	fprintf(f, "# written by fr_step(1); run: gnuplot %s\n", gp);
	fprintf(f,
		"set terminal pngcairo noenhanced size 1200,480 font \",10\"\n");
	for (int mi = 0; mi < M_COUNT; mi++) {
		if (!(o->modes & (1u << mi)))
			continue;
		for (int r = -1; r < o->nrates; r++) {
			fprintf(f, "$m%dr%d << EOD\n", mi, r + 1);
			for (int k = 0; k < o->nranks; k++) {
				struct st_result res;

				project(j, mi, r, k, &res);
				fprintf(f, "%d %.4f %.4f\n", o->ranks[k],
					res.step, res.eff);
			}
			fprintf(f, "EOD\n");
		}
		fprintf(f, "$m%dmeas << EOD\n", mi);
		if (j->out[mi].ran)
			fprintf(f, "%d %.4f %.4f\n", j->n, j->out[mi].meas.step,
				j->out[mi].meas.eff);
		fprintf(f, "EOD\n");
		fprintf(f, "set output \"%s/%s_%s.png\"\n", dir, j->m->name,
			modes[mi].name);
		if (j->comm)
			snprintf(src, sizeof(src),
				 "model calibrated on %d ranks over %s", j->n,
				 fr_comm_transport(j->comm));
		else
			snprintf(src, sizeof(src), "tune file %s",
				 base_name(j->link.tune.source));
		snprintf(src + strlen(src), sizeof(src) - strlen(src),
			 ", alpha %.3g us%s",
			 o->alpha_us >= 0 ? o->alpha_us : j->link.tune.alpha_us,
			 o->alpha_us >= 0 ? " (--alpha-us)" : "");
		if (j->sim && modes[mi].compress == FR_COMPRESS_NONE)
			snprintf(src + strlen(src), sizeof(src) - strlen(src),
				 "; times simulated (fr_sim)");
		else
			snprintf(src + strlen(src), sizeof(src) - strlen(src),
				 "; times from the closed form");
		fprintf(f,
			"set multiplot layout 1,2 title \"%s, %s: %zu params, backward %.1f ms; %s\"\n",
			j->m->name, modes[mi].what, j->m->params,
			j->m->compute_ms, src);
		fprintf(f, "set logscale x 2\nset xlabel \"ranks\"\nset grid\n"
			   "set key top left\nset logscale y\n"
			   "set ylabel \"step time (ms)\"\nset yrange [*:*]\n");
		for (int pass = 0; pass < 2; pass++) {
			fprintf(f, "plot ");
			for (int r = -1; r < o->nrates; r++) {
				if (r >= 0)
					fprintf(f, ", ");
				if (r < 0)
					fprintf(f,
						"$m%dr0 using 1:%d with linespoints title \"%s\"",
						mi, 2 + pass,
						j->comm ? "this network"
							: "the tune file's link");
				else
					fprintf(f,
						"$m%dr%d using 1:%d with linespoints title \"%g Gbit/s\"",
						mi, r + 1, 2 + pass,
						o->rates[r]);
			}
			if (j->out[mi].ran)
				fprintf(f,
					", $m%dmeas using 1:%d with points pt 7 ps 2 lc rgb \"black\" title \"measured here\"",
					mi, 2 + pass);
			fprintf(f, "\n");
			if (!pass)
				fprintf(f,
					"unset logscale y\nset yrange [0:1.05]\n"
					"set key bottom left\n"
					"set ylabel \"scaling efficiency (compute / step)\"\n");
		}
		fprintf(f, "unset multiplot\n");
	}
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, "fr_step: writing %s failed\n", gp);
		return -1;
	}
	argv[0] = "gnuplot";
	argv[1] = gp;
	argv[2] = NULL;
	rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
	if (rc) {
		printf("# gnuplot not found (%s): wrote %s only; apt-get install -y gnuplot-nox\n",
		       strerror(rc), gp);
		return 0;
	}
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "fr_step: gnuplot %s failed\n", gp);
		return -1;
	}
	printf("# plots: %s/%s_<mode>.png (script %s)\n", dir, j->m->name, gp);
	return 0;
}

/* rank 0: the calibrated parameters as a tune file, which the library
 * reads too (it skips the step.* keys) and --predict-only reads back. */
static int save_tune(const struct job *j, const char *path)
{
	const struct fr_tune *t = &j->link.tune;
	const char *tp = fr_comm_transport(j->comm);
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "fr_step: %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(f,
		"# fastreduce tune file written by fr_step(1): %d ranks over %s\n",
		j->n, tp);
	fprintf(f, "%s.alpha_us = %.3f\n%s.beta_ns = %.4f\n%s.copy_ns = %.4f\n",
		tp, t->alpha_us, tp, t->beta_ns, tp, t->copy_ns);
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		fprintf(f, "gamma_ns.%s = %.4f\n", fr_dtype_name((fr_dtype_t)d),
			t->gamma_ns[d]);
	for (int c = FR_COMPRESS_BF16; c < FR_COMPRESS_COUNT; c++)
		if (j->link.enc_ns[c] > 0)
			fprintf(f,
				"step.encode_ns.%s = %.4f\nstep.decode_ns.%s = %.4f\n",
				fr_compress_name(c), j->link.enc_ns[c],
				fr_compress_name(c), j->link.dec_ns[c]);
	fprintf(f, "step.goodput = %.4f\n", j->eta);
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, "fr_step: writing %s failed\n", path);
		return -1;
	}
	return 0;
}

/* --predict-only: the step.* keys of FR_TUNE_FILE (the library's own keys
 * went through fr_tune_load). */
static void load_step_keys(struct job *j)
{
	const char *path = getenv("FR_TUNE_FILE");
	char line[256], key[128];
	double v;
	FILE *f;

	if (!path || !*path || !(f = fopen(path, "r")))
		return;
	while (fgets(line, sizeof(line), f)) {
		fr_compress_t c;

		if (sscanf(line, " %127[^= \t] = %lf", key, &v) != 2 || v < 0)
			continue;
		if (!strncmp(key, "step.encode_ns.", 15) &&
		    !fr_compress_from_name(key + 15, &c))
			j->link.enc_ns[c] = v;
		else if (!strncmp(key, "step.decode_ns.", 15) &&
			 !fr_compress_from_name(key + 15, &c))
			j->link.dec_ns[c] = v;
		else if (!strcmp(key, "step.goodput") && v > 0 && v <= 1)
			j->eta = v;
	}
	fclose(f);
}

/* ---- options ------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: fr_step [OPTIONS]\n"
		"Step-time analysis of data-parallel training: run steps on the\n"
		"communicator (under frrun, mpirun, srun, torchrun), compare them with\n"
		"the cost model's prediction, predict other job sizes and links.\n"
		"\n"
		"  -m, --model NAME|FILE    resnet50 (default), bert-base, vgg16, gpt2-small,\n"
		"                           or a file of \"name params compute_ms\" lines\n"
		"  -s, --scale F            multiply parameter counts by F (default 1)\n"
		"  -c, --compute-ms MS      total backward time per step, split over the\n"
		"                           layers by FLOPs (file: by its times)\n"
		"      --tflops R           else backward FLOPs at R TFLOP/s (default 50)\n"
		"      --calibrate          else at this CPU's measured GEMM rate\n"
		"  -B, --batch N            samples per rank for FLOPs (default: preset's)\n"
		"      --compute sleep|spin emulate compute by sleeping (default) or a\n"
		"                           busy CPU loop\n"
		"  -M, --modes LIST         after,overlap,bf16,int8 or all (default)\n"
		"  -b, --bucket-bytes SIZE  bucket size (default 25M)\n"
		"      --first-bucket-bytes SIZE  first bucket (default 1M)\n"
		"      --progress thread|caller  who advances buckets (default thread)\n"
		"  -n, --steps N            timed steps per measurement (default 10)\n"
		"  -w, --warmup N           untimed steps first (default 3)\n"
		"      --no-fit             keep the communicator's cost model (FR_TUNE_FILE\n"
		"                           or built-in) instead of calibrating alpha/beta\n"
		"      --line-gbit R        line rate of this network: other links then run\n"
		"                           at the goodput fraction measured here (else 95 %%)\n"
		"      --alpha-us A         latency for the projections (default: measured)\n"
		"      --rates LIST         link speeds in Gbit/s (default 10,25,100,200,400)\n"
		"      --ranks LIST         job sizes (default 2,4,...,1024)\n"
		"      --csv FILE           measured, predicted and projected rows as CSV\n"
		"      --plot DIR           PNGs per mode (gnuplot) and their script\n"
		"      --save-tune FILE     write the calibrated parameters (a tune file)\n"
		"      --max-error PCT      exit 3 if a predicted step is off by more\n"
		"      --sim FR_SIM         projections: f32 All-Reduce times from the\n"
		"                           simulator (perf/sim), not the closed form\n"
		"      --sim-args \"OPTS\"    more fr_sim options (e.g. \"-k 8 --topo ...\")\n"
		"      --predict-only       no job: project from FR_TUNE_FILE (or the\n"
		"                           built-in model)\n"
		"  -l, --list               print the model's layers and buckets, exit\n"
		"  -v, --verbose            print the buckets too\n"
		"  -h, --help               this text\n");
}

static int bad(const char *what, const char *arg)
{
	fprintf(stderr,
		"fr_step: invalid %s '%s'\n"
		"Try 'fr_step --help' for more information.\n",
		what, arg);
	return 2;
}

static int parse_double(const char *s, double min, double max, double *out)
{
	char *end;
	double v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !(v >= min) || v > max)
		return -1;
	*out = v;
	return 0;
}

/* "a,b,c" of numbers in [min, max]; 0 or -1. */
static int parse_list(const char *s, double min, double max, double *v, int cap,
		      int *n)
{
	char buf[256], *save = NULL, *tok;

	if (!s || strlen(s) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (*n == cap || parse_double(tok, min, max, &v[*n]))
			return -1;
		(*n)++;
	}
	return *n ? 0 : -1;
}

static int parse_modes(const char *s, unsigned *mask)
{
	char buf[128], *save = NULL, *tok;

	if (!strcmp(s, "all")) {
		*mask = (1u << M_COUNT) - 1;
		return 0;
	}
	if (strlen(s) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", s);
	*mask = 0;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		int mi;

		for (mi = 0; mi < M_COUNT; mi++)
			if (!strcmp(tok, modes[mi].name) ||
			    !strcmp(tok, modes[mi].alias))
				break;
		if (mi == M_COUNT)
			return -1;
		*mask |= 1u << mi;
	}
	return *mask ? 0 : -1;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{"model", required_argument, NULL, 'm'},
		{"scale", required_argument, NULL, 's'},
		{"compute-ms", required_argument, NULL, 'c'},
		{"tflops", required_argument, NULL, OPT_TFLOPS},
		{"calibrate", no_argument, NULL, OPT_CALIBRATE},
		{"batch", required_argument, NULL, 'B'},
		{"compute", required_argument, NULL, OPT_COMPUTE},
		{"modes", required_argument, NULL, 'M'},
		{"bucket-bytes", required_argument, NULL, 'b'},
		{"first-bucket-bytes", required_argument, NULL, OPT_FIRST},
		{"progress", required_argument, NULL, OPT_PROGRESS},
		{"steps", required_argument, NULL, 'n'},
		{"warmup", required_argument, NULL, 'w'},
		{"no-fit", no_argument, NULL, OPT_NO_FIT},
		{"line-gbit", required_argument, NULL, OPT_LINE},
		{"alpha-us", required_argument, NULL, OPT_ALPHA},
		{"rates", required_argument, NULL, OPT_RATES},
		{"ranks", required_argument, NULL, OPT_RANKS},
		{"csv", required_argument, NULL, OPT_CSV},
		{"plot", required_argument, NULL, OPT_PLOT},
		{"save-tune", required_argument, NULL, OPT_SAVE},
		{"max-error", required_argument, NULL, OPT_MAXERR},
		{"predict-only", no_argument, NULL, OPT_PREDICT},
		{"sim", required_argument, NULL, OPT_SIM},
		{"sim-args", required_argument, NULL, OPT_SIM_ARGS},
		{"list", no_argument, NULL, 'l'},
		{"verbose", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	double v[MAX_RANKS];
	bool bucket_given = false, first_given = false;
	int ch, n;

	memset(o, 0, sizeof(*o));
	o->model = "resnet50";
	o->scale = 1;
	o->compute_ms = -1;
	o->tflops = 50;
	/* the library's defaults, and its variables, unless -b says */
	if (pc_parse_size(getenv("FR_BUCKET_BYTES"), &o->bucket_bytes) ||
	    o->bucket_bytes < 4)
		o->bucket_bytes = 25u << 20;
	else
		bucket_given = true;
	if (pc_parse_size(getenv("FR_FIRST_BUCKET_BYTES"), &o->first_bytes) ||
	    o->first_bytes < 4)
		o->first_bytes = 1u << 20;
	else
		first_given = true;
	o->steps = 10;
	o->warmup = 3;
	o->fit = true;
	o->alpha_us = -1;
	o->max_error = -1;
	o->modes = (1u << M_COUNT) - 1;
	o->progress = FR_PROGRESS_THREAD;
	o->nrates = 5;
	memcpy(o->rates, (double[]){10, 25, 100, 200, 400}, 5 * sizeof(double));
	for (o->nranks = 0; o->nranks < 10; o->nranks++)
		o->ranks[o->nranks] = 2 << o->nranks;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":m:s:c:B:M:b:n:w:lvh", lopts,
				 NULL)) != -1) {
		long l;

		switch (ch) {
		case 'm':
			o->model = optarg;
			break;
		case 's':
			if (parse_double(optarg, 1e-9, 1, &o->scale) ||
			    o->scale <= 0)
				return bad("scale (0 < F <= 1)", optarg);
			break;
		case 'c':
			if (parse_double(optarg, 0, 1e7, &o->compute_ms))
				return bad("compute time (ms)", optarg);
			break;
		case OPT_TFLOPS:
			if (parse_double(optarg, 1e-6, 1e6, &o->tflops))
				return bad("TFLOP/s", optarg);
			break;
		case OPT_CALIBRATE:
			o->calibrate = true;
			break;
		case 'B':
			if (pc_parse_long(optarg, 1, 1 << 20, &o->batch))
				return bad("batch", optarg);
			break;
		case OPT_COMPUTE:
			if (strcmp(optarg, "sleep") && strcmp(optarg, "spin"))
				return bad("compute emulation (sleep|spin)",
					   optarg);
			o->spin = !strcmp(optarg, "spin");
			break;
		case 'M':
			if (parse_modes(optarg, &o->modes))
				return bad("mode list", optarg);
			break;
		case 'b':
			if (pc_parse_size(optarg, &o->bucket_bytes) ||
			    o->bucket_bytes < 4)
				return bad("bucket size", optarg);
			bucket_given = true;
			break;
		case OPT_FIRST:
			if (pc_parse_size(optarg, &o->first_bytes) ||
			    o->first_bytes < 4)
				return bad("first bucket size", optarg);
			first_given = true;
			break;
		case OPT_PROGRESS:
			if (strcmp(optarg, "thread") &&
			    strcmp(optarg, "caller"))
				return bad("progress (thread|caller)", optarg);
			o->progress = !strcmp(optarg, "thread")
					      ? FR_PROGRESS_THREAD
					      : FR_PROGRESS_CALLER;
			break;
		case 'n':
			if (pc_parse_long(optarg, 1, 100000, &o->steps))
				return bad("step count", optarg);
			break;
		case 'w':
			if (pc_parse_long(optarg, 0, 100000, &o->warmup))
				return bad("warm-up count", optarg);
			break;
		case OPT_NO_FIT:
			o->fit = false;
			break;
		case OPT_LINE:
			if (parse_double(optarg, 1e-6, 1e6, &o->line_gbit))
				return bad("line rate (Gbit/s)", optarg);
			break;
		case OPT_ALPHA:
			if (parse_double(optarg, 0, 1e7, &o->alpha_us))
				return bad("alpha (us)", optarg);
			break;
		case OPT_RATES:
			if (parse_list(optarg, 1e-6, 1e6, o->rates, MAX_RATES,
				       &o->nrates))
				return bad("rate list (Gbit/s)", optarg);
			break;
		case OPT_RANKS:
			if (parse_list(optarg, 2, 1 << 20, v, MAX_RANKS, &n))
				return bad("rank list", optarg);
			for (o->nranks = 0; o->nranks < n; o->nranks++) {
				l = (long)v[o->nranks];
				if (l != v[o->nranks])
					return bad("rank list", optarg);
				o->ranks[o->nranks] = (int)l;
			}
			break;
		case OPT_CSV:
			o->csv = optarg;
			break;
		case OPT_PLOT:
			o->plot = optarg;
			break;
		case OPT_SAVE:
			o->save = optarg;
			break;
		case OPT_MAXERR:
			if (parse_double(optarg, 0, 1e6, &o->max_error))
				return bad("error bound (%)", optarg);
			break;
		case OPT_PREDICT:
			o->predict_only = true;
			break;
		case OPT_SIM:
			o->sim = optarg;
			break;
		case OPT_SIM_ARGS:
			o->sim_args = optarg;
			break;
		case 'l':
			o->list = true;
			break;
		case 'v':
			o->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			return bad("option (missing argument)",
				   argv[optind - 1]);
		default:
			return bad("option", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return bad("argument", argv[optind]);
	/* a scaled model keeps the full model's buckets (their number and
	 * where backward fills them) unless sizes were given */
	o->buckets_scaled = o->scale != 1 && (!bucket_given || !first_given);
	if (!bucket_given)
		o->bucket_bytes = ST_MAX(
			(size_t)llround((double)o->bucket_bytes * o->scale), 4);
	if (!first_given)
		o->first_bytes = ST_MAX(
			(size_t)llround((double)o->first_bytes * o->scale), 4);
	return 0;
}

/* ---- main --------------------------------------------------------------- */

/* Can the files of --csv and --save-tune be written, the --plot directory
 * be made?  (Opened for appending: nothing is truncated yet.) */
static bool outputs_writable(const struct opts *o)
{
	const char *files[2] = {o->csv, o->save};

	for (int i = 0; i < 2; i++) {
		FILE *f;

		if (!files[i])
			continue;
		f = fopen(files[i], "a");
		if (!f) {
			fprintf(stderr, "fr_step: %s: %s\n", files[i],
				strerror(errno));
			return false;
		}
		fclose(f);
	}
	if (o->plot && ((mkdir(o->plot, 0777) && errno != EEXIST) ||
			access(o->plot, W_OK))) {
		fprintf(stderr, "fr_step: %s: %s\n", o->plot, strerror(errno));
		return false;
	}
	return true;
}

/* The model with its parameter counts and compute times settled; gflops
 * is the CPU rate for --calibrate. */
static int build_model(const struct opts *o, struct st_model *m, double gflops)
{
	char err[512];
	static char src[96];

	if (!st_model_preset(o->model, m)) {
		/* presets: times from FLOPs, or the total split by FLOPs */
		if (o->compute_ms >= 0) {
			st_model_time_total(m, o->compute_ms);
			snprintf(src, sizeof(src),
				 "--compute-ms, split by FLOPs");
		} else if (gflops > 0) {
			st_model_time_flops(
				m, o->batch ? (int)o->batch : m->batch, gflops);
			snprintf(src, sizeof(src),
				 "batch %d at this CPU's %.2f GFLOP/s",
				 m->batch, gflops);
		} else {
			st_model_time_flops(m,
					    o->batch ? (int)o->batch : m->batch,
					    o->tflops * 1e3);
			snprintf(src, sizeof(src), "batch %d at %g TFLOP/s",
				 m->batch, o->tflops);
		}
	} else if (strchr(o->model, '/') || strchr(o->model, '.') ||
		   !access(o->model, R_OK)) {
		if (st_model_load(o->model, m, err, sizeof(err))) {
			fprintf(stderr, "fr_step: %s\n", err);
			return -1;
		}
		if (o->calibrate) {
			fprintf(stderr,
				"fr_step: --calibrate needs FLOPs: a preset, not a --model file\n");
			st_model_free(m);
			return -1;
		}
		snprintf(src, sizeof(src), "from %s", o->model);
		if (o->compute_ms >= 0) {
			st_model_time_total(m, o->compute_ms);
			snprintf(src, sizeof(src),
				 "--compute-ms, split as in %s", o->model);
		}
	} else {
		fprintf(stderr,
			"fr_step: no preset or file '%s' (presets:", o->model);
		for (int i = 0; st_preset_name(i); i++)
			fprintf(stderr, " %s", st_preset_name(i));
		fprintf(stderr, ")\n");
		return -1;
	}
	m->compute_src = src;
	st_model_scale(m, o->scale);
	return 0;
}

static void print_layers(const struct st_model *m)
{
	double done = 0;

	printf("#\n# %-4s %-28s %12s %12s %12s %10s %10s\n", "idx", "layer",
	       "params", "scaled", "offset", "bwd_gflop", "bwd_ms");
	for (int l = 0; l < m->nlayers; l++) {
		const struct st_layer *y = &m->layers[l];

		printf("  %-4d %-28s %12llu %12zu %12zu %10.3f %10.3f\n", l,
		       y->name, (unsigned long long)y->params_full, y->params,
		       y->off, 4e-9 * y->macs * m->batch, y->ms);
		done += y->ms;
	}
	printf("# total %llu parameters, %.1f GFLOP backward per sample, %.2f ms\n",
	       (unsigned long long)m->params_full, st_model_flops(m) * 1e-9,
	       done);
}

int main(int argc, char **argv)
{
	struct opts o;
	struct st_model m;
	struct job j = {.o = &o, .m = &m, .eta = 0.95};
	struct st_simtab simtab;
	fr_config_t cfg;
	double gflops = 0, worst;
	int rc = parse_opts(argc, argv, &o), status = 1;

	if (rc)
		return rc;
	st_simtab_init(&simtab, o.sim, o.sim_args);
	if (o.sim)
		j.sim = &simtab;
	/* sleeps to the deadlines of small layers: keep timer slack low */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	if (o.list || o.predict_only) {
		if (build_model(&o, &m, 0))
			return 1;
		j.nb = st_cut(&m, o.bucket_bytes, o.first_bytes, 0, &j.bk);
		if (j.nb < 0)
			goto out_model;
		st_ready_times(&m, j.bk, j.nb);
		if (o.list) {
			printf("# %s - %s\n", m.name, m.what);
			print_layers(&m);
			print_buckets(&j);
			status = 0;
			goto out_buckets;
		}
		/* a communicator's cost model without a communicator */
		{
			const char *tp = getenv("FR_TRANSPORT");
			char err[256];

			tp = tp && !strcmp(tp, "verbs") ? "verbs" : "tcp";
			rc = fr_tune_load(&j.link.tune, tp, err, sizeof(err));
			if (rc) {
				fprintf(stderr, "fr_step: %s\n", err);
				goto out_buckets;
			}
		}
		load_step_keys(&j);
		j.n = 0;
		print_header(&j, NULL);
		if (o.verbose)
			print_buckets(&j);
		if (sim_prefetch(&j))
			goto out_buckets;
		print_projection(&j);
		status = 0;
		if (o.csv && write_csv(&j, o.csv))
			status = 1;
		if (o.plot && write_plots(&j, o.plot))
			status = 1;
		goto out_buckets;
	}

	fr_config_init(&cfg);
	cfg.progress = o.progress;
	rc = fr_comm_create_from_env(&cfg, &j.comm);
	if (rc) {
		fprintf(stderr, "fr_step: %s: %s\n", fr_strerror(rc),
			fr_comm_last_error(NULL));
		return 1;
	}
	j.rank = fr_comm_rank(j.comm);
	j.n = fr_comm_size(j.comm);
	if (j.n < 2) {
		fprintf(stderr,
			"fr_step: needs at least 2 ranks (or --predict-only)\n");
		goto out_comm;
	}
	/* rank 0 checks its output paths before anything is measured, and
	 * every rank learns whether it could, so that none measures for
	 * nothing */
	{
		int32_t ok = j.rank || outputs_writable(&o);

		check(&j, fr_broadcast(j.comm, &ok, 1, FR_I32, 0),
		      "fr_broadcast");
		if (!ok)
			goto out_comm;
	}
	if (o.calibrate) {
		/* rank 0 alone, so that the rate is one core's and not a
		 * share of a CPU that every rank is measuring at once */
		if (!j.rank)
			gflops = gemm_gflops();
		check(&j, fr_broadcast(j.comm, &gflops, 1, FR_F64, 0),
		      "fr_broadcast");
	}
	if (build_model(&o, &m, gflops))
		goto out_comm;
	j.nb = st_cut(&m, o.bucket_bytes, o.first_bytes, 0, &j.bk);
	if (j.nb < 0)
		goto out_model;
	st_ready_times(&m, j.bk, j.nb);
	j.arena = aligned_alloc(64, (m.params * sizeof(float) + 63) & ~63ul);
	if (!j.arena) {
		fprintf(stderr, "fr_step: out of memory\n");
		goto out_buckets;
	}
	/* gradients of the size of real ones, different on every rank */
	for (size_t i = 0; i < m.params; i++)
		j.arena[i] =
			(float)((i * 2654435761u + (size_t)j.rank) % 1000) *
				1e-4f -
			0.05f;
	/* the library chooses its algorithms with its own model (built-in
	 * or FR_TUNE_FILE) during the run; the prediction does the same */
	fr_tune_get(j.comm, &j.choose);
	fr_tune_get(j.comm, &j.link.tune);
	j.link.choose = &j.choose;
	j.link.nranks = j.n;
	j.link.payload_max = fr_msg_payload_max(j.comm);
	measure_all(&j);
	if (o.line_gbit > 0)
		j.eta = fmin(8 / o.line_gbit / j.link.tune.beta_ns, 1);

	status = 0;
	if (!j.rank) {
		print_header(&j, fr_comm_transport(j.comm));
		if (o.verbose)
			print_buckets(&j);
		worst = print_check(&j);
		if (o.save && save_tune(&j, o.save))
			status = 1;
		if (o.max_error >= 0 && worst > o.max_error) {
			printf("# FAIL: a predicted step is off by more than %g %%\n",
			       o.max_error);
			status = 3;
		}
		fflush(stdout);
	}
	/* every rank leaves with rank 0's verdict on the job; the
	 * projections come after, on rank 0 alone: with --sim they run the
	 * simulator for minutes, longer than the others would wait in a
	 * collective (FR_TIMEOUT_MS) */
	{
		int32_t s = status;

		check(&j, fr_broadcast(j.comm, &s, 1, FR_I32, 0),
		      "fr_broadcast");
		status = s;
	}
	if (!j.rank) {
		int rc0 = 0;

		if (sim_prefetch(&j)) {
			rc0 = 1;
		} else {
			print_projection(&j);
			if (o.csv && write_csv(&j, o.csv))
				rc0 = 1;
			if (o.plot && write_plots(&j, o.plot))
				rc0 = 1;
		}
		if (rc0 && !status)
			status = rc0;
		fflush(stdout);
	}
	free(j.arena);
out_buckets:
	free(j.bk);
out_model:
	st_model_free(&m);
	st_simtab_free(&simtab);
out_comm:
	fr_comm_destroy(j.comm);
	return status;
}
