/* SPDX-License-Identifier: MIT */
/*
 * train_mlp - data-parallel training of a small MLP with libfastreduce.
 *
 *   frrun -n 4 ./examples/train_mlp --data examples/data/digits.csv \
 *         [--compress none|bf16|fp16|int8] [--ef] [--buckets]
 *         [--steps N] [--batch B] [--hidden H] [--lr X] [--momentum X]
 *         [--seed S] [--test N] [--bucket-bytes N] [--csv FILE]
 *         [--recover [--grow]] [--kill-rank R --kill-step S [--kill-us U]]
 *         [--drop-rank R --drop-step S]
 *
 * A 64-H-10 perceptron (ReLU, softmax cross-entropy) learns the 8x8
 * handwritten digits of examples/data/digits.csv.  Every rank starts from
 * the same weights (one fixed seed) and walks the same shuffled order of
 * global minibatches; each step a rank takes its own shard of the
 * minibatch, writes its gradients into one flat f32 arena and All-Reduces
 * the arena with FR_AVG, either in one call (optionally compressed on the
 * wire, with error feedback) or in buckets started layer by layer while
 * the backward pass runs.  Since every rank then applies the same averaged
 * gradient with the same arithmetic, the weights must stay bit-identical:
 * at the end the ranks all-gather a 64-bit FNV-1a hash of their weights
 * and fail if any differs.
 *
 * With --recover a failed step does not end the job: the survivors agree
 * on who failed and on how far each got (fr_comm_agree), shrink the
 * communicator (fr_comm_shrink), roll back the one step some may have
 * applied and others not, and redo it on the survivors (recover() says
 * how).  --kill-rank/--kill-step/--kill-us make that rank die (SIGKILL)
 * U microseconds into step S, from a thread, at whatever the step is
 * doing then; --drop-rank/--drop-step take a rank out cleanly at a step
 * (fr_comm_split), the clean run with the same sequence of ranks that a
 * recovered run must match bit for bit.  With --grow the survivors then
 * re-admit as many newcomers as ranks failed (fr_comm_grow; frrun
 * --respawn starts them, with FR_JOIN=1), rank 0 sends them the state,
 * and the interrupted step is redone with the full number of ranks: the
 * clean run to match is then the one nothing happened to.
 *
 * Output: rank 0 writes "step,loss" (the global minibatch's mean loss,
 * itself All-Reduced) to --csv, and every rank prints one line
 *   final mode=M ranks=N steps=S train_loss=L test_loss=L test_acc=A
 *         hash=H ...
 * that examples/train.sh and tests/mp_example.sh parse.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fastreduce.h>

#ifndef EXAMPLE_DATA
#define EXAMPLE_DATA "examples/data/digits.csv"
#endif

#define NIN 64	/* 8x8 pixels */
#define NOUT 10 /* digits */
#define MAXPIX 16.0f

struct opts {
	const char *data;
	const char *csv;
	int steps;
	int batch;
	int hidden;
	int ntest;
	double lr;
	double momentum;
	uint64_t seed;
	int compress;
	bool ef;
	bool buckets;
	size_t bucket_bytes;
	int tp; /* tensor-parallel group size; 1: data parallel only */
	bool recover;		  /* survive a failed step */
	bool grow;		  /* and re-admit newcomers */
	int kill_rank, kill_step; /* -1: none */
	long kill_us;
	int drop_rank, drop_step; /* -1: none */
};

/* The data set: x[i] has NIN inputs scaled to [0, 1], y[i] its digit. */
struct data {
	int n;
	float *x;
	int *y;
};

/*
 * One flat layout serves the weights, their gradients and the momentum,
 * so that the gradients are one arena (one All-Reduce, one registration)
 * and a layer is a contiguous range of it.  Layer 2 comes last because the
 * backward pass produces it first and the buckets are cut from the arena's
 * end: its bucket can be on the wire while layer 1 is still computed.
 */
struct layout {
	int h;
	size_t w1, b1, w2, b2; /* offsets in floats */
	size_t l1_len;	       /* W1 and b1: [0, l1_len)            */
	size_t l2_len;	       /* W2 and b2: [l1_len, l1_len + l2_len) */
	size_t n;
};

static void layout_init(struct layout *l, int h)
{
	l->h = h;
	l->w1 = 0;
	l->b1 = l->w1 + (size_t)h * NIN;
	l->w2 = l->b1 + (size_t)h;
	l->b2 = l->w2 + (size_t)NOUT * h;
	l->n = l->b2 + NOUT;
	l->l1_len = l->w2;
	l->l2_len = l->n - l->w2;
}

static void die(const char *what, fr_comm_t *comm, int err)
{
	fprintf(stderr, "train_mlp: %s: %s (%s)\n", what, fr_strerror(err),
		comm ? fr_comm_last_error(comm) : fr_comm_last_error(NULL));
	exit(1);
}

/* ---- deterministic randomness (no libc rand: same bits everywhere) ---- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 bits, exact in float. */
static float uniform01(uint64_t *s)
{
	return (float)(splitmix64(s) >> 40) * 0x1p-24f;
}

static void shuffle(int *v, int n, uint64_t *s)
{
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(splitmix64(s) % (uint64_t)(i + 1));
		int t = v[i];

		v[i] = v[j];
		v[j] = t;
	}
}

static uint64_t fnv1a64(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- data -------------------------------------------------------------- */

/* Lines of "label,p0,...,p63" (examples/data/export_digits.py). */
static void load_csv(const char *path, struct data *d)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int cap = 2048, lineno = 0;

	if (!f) {
		fprintf(stderr, "train_mlp: %s: %s (pass --data PATH)\n", path,
			strerror(errno));
		exit(1);
	}
	d->n = 0;
	d->x = malloc(sizeof(float) * NIN * cap);
	d->y = malloc(sizeof(int) * cap);
	while (d->x && d->y && fgets(line, sizeof(line), f)) {
		char *p = line, *end;
		long v;

		lineno++;
		if (line[0] == '\n' || line[0] == '#')
			continue;
		if (d->n == cap) {
			cap *= 2;
			d->x = realloc(d->x, sizeof(float) * NIN * cap);
			d->y = realloc(d->y, sizeof(int) * cap);
			if (!d->x || !d->y)
				break;
		}
		for (int i = 0; i <= NIN; i++) {
			v = strtol(p, &end, 10);
			/* a short, long or out-of-range line is a broken file,
			 * not something to train on silently */
			if (end == p || (i < NIN && *end != ',') ||
			    (i == NIN && *end != '\n' && *end != '\0') ||
			    v < 0 || v > (i == 0 ? NOUT - 1 : (long)MAXPIX)) {
				fprintf(stderr,
					"train_mlp: %s:%d: expected a label 0-9 and %d pixels 0-16\n",
					path, lineno, NIN);
				exit(1);
			}
			if (i == 0)
				d->y[d->n] = (int)v;
			else
				d->x[(size_t)d->n * NIN + i - 1] =
					(float)v / MAXPIX;
			p = end + 1;
		}
		d->n++;
	}
	if (!d->x || !d->y) {
		fprintf(stderr, "train_mlp: out of memory\n");
		exit(1);
	}
	fclose(f);
}

/* ---- the model ----------------------------------------------------------- */

/*
 * He-uniform weights, zero biases, all from one seed: every rank computes
 * the same bits, so no broadcast of the initial model is needed.
 */
static void init_params(const struct layout *l, float *w, uint64_t seed)
{
	uint64_t s = seed;
	float a1 = sqrtf(6.0f / NIN), a2 = sqrtf(6.0f / l->h);

	memset(w, 0, sizeof(float) * l->n);
	for (size_t i = 0; i < (size_t)l->h * NIN; i++)
		w[l->w1 + i] = (2.0f * uniform01(&s) - 1.0f) * a1;
	for (size_t i = 0; i < (size_t)NOUT * l->h; i++)
		w[l->w2 + i] = (2.0f * uniform01(&s) - 1.0f) * a2;
}

/*
 * Forward pass of one sample: hidden activations into hid, softmax
 * probabilities into prob; returns the cross-entropy of label y.
 */
static float forward(const struct layout *l, const float *w, const float *x,
		     int y, float *hid, float *prob)
{
	float mx = -INFINITY, sum = 0.0f;

	for (int j = 0; j < l->h; j++) {
		const float *row = w + l->w1 + (size_t)j * NIN;
		float a = w[l->b1 + j];

		for (int i = 0; i < NIN; i++)
			a += row[i] * x[i];
		hid[j] = a > 0.0f ? a : 0.0f;
	}
	for (int k = 0; k < NOUT; k++) {
		const float *row = w + l->w2 + (size_t)k * l->h;
		float a = w[l->b2 + k];

		for (int j = 0; j < l->h; j++)
			a += row[j] * hid[j];
		prob[k] = a;
		mx = fmaxf(mx, a);
	}
	for (int k = 0; k < NOUT; k++) {
		prob[k] = expf(prob[k] - mx);
		sum += prob[k];
	}
	for (int k = 0; k < NOUT; k++)
		prob[k] /= sum;
	return -logf(fmaxf(prob[y], 1e-30f));
}

/* Scratch for one rank's shard: activations kept for the backward pass. */
struct scratch {
	float *hid;  /* shard x h   */
	float *dout; /* shard x 10: dL/dlogits */
	float *dhid; /* h           */
};

/*
 * Reduces the gradient arena.  How depends on the mode: one All-Reduce
 * (plain or compressed with fr_allreduce_ex) or buckets that start while
 * the backward pass still runs.
 */
struct reducer {
	fr_comm_t *comm;
	const struct layout *l;
	float *grad;
	int compress;
	float *residual; /* error feedback of the one-call path */
	fr_mem_t *mem;
	fr_buckets_t *bk;
	bool tolerate; /* --recover: errors are returned, not fatal */
	int err;       /* the first error of this step */
};

static void reducer_init(struct reducer *r, fr_comm_t *comm,
			 const struct layout *l, float *grad,
			 const struct opts *o)
{
	int err;

	memset(r, 0, sizeof(*r));
	r->tolerate = o->recover;
	r->comm = comm;
	r->l = l;
	r->grad = grad;
	r->compress = o->compress;
	if (o->buckets) {
		fr_buckets_config_t bc;

		fr_buckets_config_init(&bc);
		/* The model is small (19 KB at h=64), so the buckets are
		 * small too, as a large model's would be relative to it: the
		 * first one is exactly layer 2, which backward finishes
		 * first, so its All-Reduce overlaps layer 1's gradients. */
		bc.first_bucket_bytes = sizeof(float) * l->l2_len;
		bc.bucket_bytes = o->bucket_bytes;
		bc.compress = o->compress;
		bc.error_feedback = o->ef;
		err = fr_buckets_create(comm, grad, l->n, FR_F32, FR_AVG, &bc,
					&r->bk);
		if (err)
			die("fr_buckets_create", comm, err);
		return;
	}
	/* Registered once: every step's All-Reduce runs zero-copy. */
	err = fr_mem_register(comm, grad, sizeof(float) * l->n, &r->mem);
	if (err)
		die("fr_mem_register", comm, err);
	if (o->ef && o->compress != FR_COMPRESS_NONE) {
		/* What compression dropped at step t is added back at step
		 * t+1, so the error does not accumulate in the weights. */
		r->residual = calloc(l->n, sizeof(float));
		if (!r->residual)
			die("residual", comm, FR_ENOMEM);
	}
}

/* Backward produced [off, off + len) of the arena. */
static void reducer_ready(struct reducer *r, size_t off, size_t len)
{
	int err;

	if (!r->bk || r->err)
		return;
	err = fr_buckets_ready(r->bk, off, len);
	if (err && r->tolerate)
		r->err = err;
	else if (err)
		die("fr_buckets_ready", r->comm, err);
}

/* End of backward: the averaged gradient is in the arena on return (0);
 * with --recover, the error otherwise. */
static int reducer_finish(struct reducer *r)
{
	fr_coll_opts_t co;
	const char *what;
	int err = r->err;

	r->err = 0;
	if (r->bk) {
		/* after a failed ready, wait only collects what started */
		int e = fr_buckets_wait(r->bk);

		err = err ? err : e;
		what = "fr_buckets_wait";
	} else if (r->compress == FR_COMPRESS_NONE) {
		err = fr_allreduce(r->comm, FR_IN_PLACE, r->grad, r->l->n,
				   FR_F32, FR_AVG);
		what = "fr_allreduce";
	} else {
		fr_coll_opts_init(&co);
		co.compress = r->compress;
		co.residual = r->residual;
		err = fr_allreduce_ex(r->comm, FR_IN_PLACE, r->grad, r->l->n,
				      FR_F32, FR_AVG, &co);
		what = "fr_allreduce_ex";
	}
	if (err && !r->tolerate)
		die(what, r->comm, err);
	return err;
}

static void reducer_destroy(struct reducer *r)
{
	fr_buckets_destroy(r->bk);
	fr_mem_deregister(r->mem);
	free(r->residual);
	memset(r, 0, sizeof(*r));
}

/* ---- surviving a failure (--recover) ---------------------------------- */

/* What a step changes, kept from before the last one applied: the weights,
 * the momentum, error feedback's residual, where the data order stands. */
struct snapshot {
	int step;
	float *w, *vel, *residual;
	int *perm;
	int pos;
	uint64_t s;
};

static int snap_init(struct snapshot *sn, const struct layout *l, int ntrain,
		     const struct reducer *red)
{
	sn->w = malloc(sizeof(float) * l->n);
	sn->vel = malloc(sizeof(float) * l->n);
	sn->perm = malloc(sizeof(int) * (size_t)ntrain);
	sn->residual = red->residual ? malloc(sizeof(float) * l->n) : NULL;
	return sn->w && sn->vel && sn->perm && (!red->residual || sn->residual)
		       ? 0
		       : -1;
}

/* The state at step: the weights and momentum (when given), the data
 * order, the residual (when red has one). */
static void snap_take(struct snapshot *sn, int step, const float *w,
		      const float *vel, const int *perm, int pos, uint64_t s,
		      const struct reducer *red, const struct layout *l,
		      int ntrain)
{
	sn->step = step;
	if (w)
		memcpy(sn->w, w, sizeof(float) * l->n);
	if (vel)
		memcpy(sn->vel, vel, sizeof(float) * l->n);
	if (perm != sn->perm)
		memcpy(sn->perm, perm, sizeof(int) * (size_t)ntrain);
	sn->pos = pos;
	sn->s = s;
	if (red && red->residual && sn->residual)
		memcpy(sn->residual, red->residual, sizeof(float) * l->n);
}

static void snap_residual(struct snapshot *d, const struct snapshot *s,
			  const struct layout *l)
{
	if (d->residual && s->residual)
		memcpy(d->residual, s->residual, sizeof(float) * l->n);
}

static void snap_free(struct snapshot *sn)
{
	free(sn->w);
	free(sn->vel);
	free(sn->perm);
	free(sn->residual);
}

/* --kill-rank: this rank dies kill_us into the step, whatever it does. */
static void *killer(void *arg)
{
	long us = *(long *)arg;
	struct timespec ts;

	usleep((useconds_t)us);
	clock_gettime(CLOCK_REALTIME, &ts);
	printf("KILL at=%.6f\n", ts.tv_sec + ts.tv_nsec * 1e-9);
	fflush(stdout);
	raise(SIGKILL);
	return NULL;
}

/*
 * A step failed (a rank died, most likely).  The survivors
 *   1. agree on how many steps each has applied: one that finished the
 *      step's last All-Reduce before the failure reached it has applied it
 *      and may have failed in the next one, so the counts differ by one at
 *      most.  Each passes bits c and c + 1 (mod 32) of its count c; their
 *      AND keeps both when all agree, and only bit K + 1 when some are at
 *      K and others at K + 1: those at K + 1 roll back;
 *   2. shrink the communicator to themselves (same order), and make the
 *      reducer anew on it;
 * and the caller redoes step K with the survivors' shards.  Returns
 * whether this rank must roll back.
 */
static bool recover(fr_comm_t **comm, struct reducer *red,
		    const struct layout *l, float *grad, const struct opts *o,
		    int applied, int *rounds)
{
	uint32_t lo = 1u << (applied % 32), hi = 1u << ((applied + 1) % 32);
	uint32_t f = lo | hi;
	int failed[16], nf = 0, err, was = fr_comm_size(*comm);
	fr_comm_t *nc = NULL;
	bool back;

	if (++*rounds > 8)
		die("recover: too many failures", *comm, FR_EPEER);
	err = fr_comm_agree(*comm, &f);
	if (err && err != FR_EPEER)
		die("fr_comm_agree", *comm, err);
	if (f != (lo | hi) && f != lo && f != hi)
		die("recover: ranks more than a step apart", *comm, FR_EPROTO);
	back = f == lo;
	fr_comm_failed(*comm, failed, 16, &nf);
	err = fr_comm_shrink(*comm, &nc);
	if (err)
		die("fr_comm_shrink", *comm, err);
	reducer_destroy(red);
	fr_comm_destroy(*comm);
	*comm = nc;
	reducer_init(red, nc, l, grad, o);
	if (fr_comm_rank(nc) == 0) {
		printf("train_mlp: step %d failed: %d rank%s failed (", applied,
		       nf, nf == 1 ? "" : "s");
		for (int i = 0; i < nf && i < 16; i++)
			printf("%s%d", i ? " " : "", failed[i]);
		printf("); going on with %d of %d ranks%s\n", fr_comm_size(nc),
		       was, back ? ", a step rolled back" : "");
		fflush(stdout);
	}
	return back;
}

/*
 * --grow: what a newcomer needs, from rank 0: the step to do next, the
 * weights and momentum, the data order, where it stands and the generator
 * that shuffles it, the recoveries so far.  Every rank calls it.
 */
static int share_state(fr_comm_t *comm, int *step, float *w, float *vel,
		       int *perm, int ntrain, int *pos, uint64_t *s,
		       int *rounds, const struct layout *l)
{
	uint64_t h[4] = {(uint64_t)*step, (uint64_t)*pos, *s,
			 (uint64_t)*rounds};
	int err = fr_broadcast(comm, h, 4, FR_U64, 0);

	if (!err)
		err = fr_broadcast(comm, w, l->n, FR_F32, 0);
	if (!err)
		err = fr_broadcast(comm, vel, l->n, FR_F32, 0);
	if (!err)
		err = fr_broadcast(comm, perm, (size_t)ntrain, FR_I32, 0);
	if (err)
		return err;
	*step = (int)h[0];
	*pos = (int)h[1];
	*s = h[2];
	*rounds = (int)h[3];
	return 0;
}

/*
 * --grow, on the survivors of a recovery: re-admit nnew newcomers
 * (fr_comm_grow), all of them or none (the survivors agree on it: a grow
 * may fail on some and not others), and make the reducer anew on the grown
 * communicator.  Returns whether it grew.
 */
static bool grow_back(fr_comm_t **comm, struct reducer *red,
		      const struct layout *l, float *grad, const struct opts *o,
		      int nnew)
{
	fr_comm_t *gc = NULL;
	int err = fr_comm_grow(*comm, nnew, &gc);
	uint32_t ok = !err;

	if (err)
		fprintf(stderr, "train_mlp: fr_comm_grow: %s: %s\n",
			fr_strerror(err), fr_comm_last_error(*comm));
	if (fr_comm_agree(*comm, &ok) || !ok) {
		fr_comm_destroy(gc);
		if (fr_comm_rank(*comm) == 0)
			printf("train_mlp: no newcomer joined; going on with %d ranks\n",
			       fr_comm_size(*comm));
		return false;
	}
	reducer_destroy(red);
	fr_comm_destroy(*comm);
	*comm = gc;
	reducer_init(red, gc, l, grad, o);
	if (fr_comm_rank(gc) == 0) {
		printf("train_mlp: %d newcomer%s joined; going on with %d ranks\n",
		       nnew, nnew == 1 ? "" : "s", fr_comm_size(gc));
		fflush(stdout);
	}
	return true;
}

/*
 * One step on this rank's shard idx[0..m) of a global minibatch of gb
 * samples: gradients into grad (scaled so that FR_AVG over the ranks gives
 * the mean over the whole minibatch, whatever the shard sizes), the
 * shard's summed loss returned.  Batched layer by layer, so that layer 2's
 * gradient is complete - and on the wire - before layer 1's is computed.
 */
static double train_shard(const struct layout *l, const float *w, float *grad,
			  const struct data *d, const int *idx, int m, int gb,
			  int nranks, struct scratch *sc, struct reducer *red)
{
	float prob[NOUT];
	float scale = (float)nranks / (float)gb;
	double loss = 0.0;
	int h = l->h;

	memset(grad, 0, sizeof(float) * l->n);
	for (int s = 0; s < m; s++) {
		const float *x = d->x + (size_t)idx[s] * NIN;
		int y = d->y[idx[s]];

		loss += forward(l, w, x, y, sc->hid + (size_t)s * h, prob);
		for (int k = 0; k < NOUT; k++)
			sc->dout[s * NOUT + k] =
				(prob[k] - (k == y ? 1.0f : 0.0f)) * scale;
	}
	/* layer 2: dW2 = dout^T hid, db2 = sum dout */
	for (int s = 0; s < m; s++) {
		const float *hid = sc->hid + (size_t)s * h;

		for (int k = 0; k < NOUT; k++) {
			float g = sc->dout[s * NOUT + k];
			float *row = grad + l->w2 + (size_t)k * h;

			for (int j = 0; j < h; j++)
				row[j] += g * hid[j];
			grad[l->b2 + k] += g;
		}
	}
	reducer_ready(red, l->l1_len, l->l2_len);
	/* layer 1: dhid = W2^T dout through the ReLU; dW1 = dhid^T x */
	for (int s = 0; s < m; s++) {
		const float *x = d->x + (size_t)idx[s] * NIN;
		const float *hid = sc->hid + (size_t)s * h;

		for (int j = 0; j < h; j++) {
			float a = 0.0f;

			if (hid[j] > 0.0f)
				for (int k = 0; k < NOUT; k++)
					a += w[l->w2 + (size_t)k * h + j] *
					     sc->dout[s * NOUT + k];
			sc->dhid[j] = a;
		}
		for (int j = 0; j < h; j++) {
			float g = sc->dhid[j];
			float *row = grad + l->w1 + (size_t)j * NIN;

			if (g == 0.0f)
				continue;
			for (int i = 0; i < NIN; i++)
				row[i] += g * x[i];
			grad[l->b1 + j] += g;
		}
	}
	reducer_ready(red, 0, l->l1_len);
	return loss;
}

/*
 * Mean loss and accuracy over idx[0..n), each rank evaluating its own
 * slice and the sums All-Reduced (in f64: exact enough, and the same bits
 * on every rank).
 */
static void evaluate(fr_comm_t *comm, const struct layout *l, const float *w,
		     const struct data *d, const int *idx, int n, float *hid,
		     double *loss, double *acc)
{
	int rank = fr_comm_rank(comm), nranks = fr_comm_size(comm);
	int lo = (int)((long)n * rank / nranks);
	int hi = (int)((long)n * (rank + 1) / nranks);
	double sums[2] = {0.0, 0.0};
	float prob[NOUT];
	int err;

	for (int s = lo; s < hi; s++) {
		int y = d->y[idx[s]], best = 0;

		sums[0] += forward(l, w, d->x + (size_t)idx[s] * NIN, y, hid,
				   prob);
		for (int k = 1; k < NOUT; k++)
			if (prob[k] > prob[best])
				best = k;
		sums[1] += best == y;
	}
	err = fr_allreduce(comm, FR_IN_PLACE, sums, 2, FR_F64, FR_SUM);
	if (err)
		die("fr_allreduce (evaluate)", comm, err);
	*loss = sums[0] / n;
	*acc = sums[1] / n;
}

/* ---- tensor parallel x data parallel (--tp T) ------------------------------
 *
 * The ranks form groups of T consecutive ranks (fr_comm_split by rank / T):
 * inside a group, tensor parallelism in the Megatron style; across groups,
 * data parallelism (split by rank % T: the ranks holding the same slice).
 * Rank t of a group owns hidden units [t h / T, (t + 1) h / T):
 *   - layer 1 is column-parallel: its rows of W1 and b1, so it computes its
 *     own hidden units from the whole input, with no communication;
 *   - layer 2 is row-parallel: its columns of W2, so it computes a partial
 *     sum of the logits, which one All-Reduce (SUM) over the group
 *     completes; b2 is added after, on every rank alike;
 *   - backward needs no communication inside the group: the logits'
 *     gradient is the same on every rank of it, and layer 1's input (the
 *     data) has no gradient;
 *   - the gradients are averaged over the data-parallel group (FR_AVG),
 *     each group on its own shard of the global minibatch.
 * At the end the group assembles the whole model (an All-Reduce of the
 * slices) and every rank compares it with the same training in one process
 * (the plain code above, the whole minibatch each step): equal within
 * float tolerance (sums in another order), and bit-identical on all ranks.
 */
struct tp_ctx {
	fr_comm_t *world, *tp, *dp;
	int T, t, g, ndp;
	int j0, j1; /* our hidden units */
};

/* Keep only what rank t owns (b2: rank 0 of the group). */
static void tp_mask(const struct layout *l, const struct tp_ctx *c, float *w)
{
	for (int j = 0; j < l->h; j++)
		if (j < c->j0 || j >= c->j1) {
			memset(w + l->w1 + (size_t)j * NIN, 0,
			       sizeof(float) * NIN);
			w[l->b1 + j] = 0.0f;
			for (int k = 0; k < NOUT; k++)
				w[l->w2 + (size_t)k * l->h + j] = 0.0f;
		}
	if (c->t)
		memset(w + l->b2, 0, sizeof(float) * NOUT);
}

/* One step on this group's shard idx[0..m) of gb samples: the group's
 * gradients of our slice into grad, the shard's summed loss returned. */
static double tp_step(const struct layout *l, const struct tp_ctx *c,
		      const float *w, float *grad, const struct data *d,
		      const int *idx, int m, int gb, struct scratch *sc,
		      float *z)
{
	float scale = (float)c->ndp / (float)gb;
	double loss = 0.0;
	int h = l->h, err;

	for (int s = 0; s < m; s++) {
		const float *x = d->x + (size_t)idx[s] * NIN;
		float *hid = sc->hid + (size_t)s * h;

		for (int j = c->j0; j < c->j1; j++) {
			const float *row = w + l->w1 + (size_t)j * NIN;
			float a = w[l->b1 + j];

			for (int i = 0; i < NIN; i++)
				a += row[i] * x[i];
			hid[j] = a > 0.0f ? a : 0.0f;
		}
		for (int k = 0; k < NOUT; k++) {
			const float *row = w + l->w2 + (size_t)k * h;
			float a = 0.0f;

			for (int j = c->j0; j < c->j1; j++)
				a += row[j] * hid[j];
			z[s * NOUT + k] = a;
		}
	}
	/* the row-parallel layer's partial logits, summed over the group */
	err = fr_allreduce(c->tp, FR_IN_PLACE, z, (size_t)m * NOUT, FR_F32,
			   FR_SUM);
	if (err)
		die("fr_allreduce (tensor parallel)", c->tp, err);
	memset(grad, 0, sizeof(float) * l->n);
	for (int s = 0; s < m; s++) {
		const float *x = d->x + (size_t)idx[s] * NIN;
		const float *hid = sc->hid + (size_t)s * h;
		float *p = z + s * NOUT, mx = -INFINITY, sum = 0.0f;
		int y = d->y[idx[s]];

		for (int k = 0; k < NOUT; k++) {
			p[k] += w[l->b2 + k];
			mx = fmaxf(mx, p[k]);
		}
		for (int k = 0; k < NOUT; k++) {
			p[k] = expf(p[k] - mx);
			sum += p[k];
		}
		for (int k = 0; k < NOUT; k++)
			p[k] /= sum;
		loss += -logf(fmaxf(p[y], 1e-30f));
		for (int k = 0; k < NOUT; k++) {
			float gk = (p[k] - (k == y ? 1.0f : 0.0f)) * scale;
			float *row = grad + l->w2 + (size_t)k * h;

			for (int j = c->j0; j < c->j1; j++)
				row[j] += gk * hid[j];
			grad[l->b2 + k] += gk;
			p[k] = gk;
		}
		for (int j = c->j0; j < c->j1; j++) {
			float a = 0.0f, *row;

			if (hid[j] <= 0.0f)
				continue;
			for (int k = 0; k < NOUT; k++)
				a += w[l->w2 + (size_t)k * h + j] * p[k];
			row = grad + l->w1 + (size_t)j * NIN;
			for (int i = 0; i < NIN; i++)
				row[i] += a * x[i];
			grad[l->b1 + j] += a;
		}
	}
	return loss;
}

static int train_tp(const struct opts *o, fr_comm_t *world,
		    const struct data *d, const int *order, int *perm,
		    int ntrain)
{
	struct tp_ctx c = {.world = world, .T = o->tp};
	struct layout l;
	struct scratch sc;
	struct reducer none = {0};
	int rank = fr_comm_rank(world), nranks = fr_comm_size(world), pos, err,
	    ok;
	float *w, *vel, *grad, *ref, *rvel, *rgrad, *z;
	double loss, train_loss, train_acc, test_loss, test_acc, diff = 0,
								 big = 0;
	uint64_t s, hash, *hashes;
	bool same = true;

	if (nranks % o->tp || o->hidden % o->tp) {
		if (rank == 0)
			fprintf(stderr,
				"train_mlp: --tp %d must divide the %d ranks and the %d hidden units\n",
				o->tp, nranks, o->hidden);
		return 2;
	}
	c.t = rank % c.T;
	c.g = rank / c.T;
	c.ndp = nranks / c.T;
	if (o->batch < c.ndp) {
		if (rank == 0)
			fprintf(stderr,
				"train_mlp: --batch %d is smaller than the %d data-parallel groups\n",
				o->batch, c.ndp);
		return 2;
	}
	err = fr_comm_split(world, c.g, c.t, &c.tp);
	if (err)
		die("fr_comm_split (tensor parallel)", world, err);
	err = fr_comm_split(world, c.t, c.g, &c.dp);
	if (err)
		die("fr_comm_split (data parallel)", world, err);
	layout_init(&l, o->hidden);
	c.j0 = o->hidden * c.t / c.T;
	c.j1 = o->hidden * (c.t + 1) / c.T;
	w = calloc(l.n, sizeof(float));
	vel = calloc(l.n, sizeof(float));
	grad = calloc(l.n, sizeof(float));
	ref = calloc(l.n, sizeof(float));
	rvel = calloc(l.n, sizeof(float));
	rgrad = calloc(l.n, sizeof(float));
	z = malloc(sizeof(float) * (size_t)o->batch * NOUT);
	sc.hid = malloc(sizeof(float) * (size_t)o->batch * o->hidden);
	sc.dout = malloc(sizeof(float) * (size_t)o->batch * NOUT);
	sc.dhid = malloc(sizeof(float) * o->hidden);
	hashes = calloc((size_t)nranks, sizeof(uint64_t));
	if (!w || !vel || !grad || !ref || !rvel || !rgrad || !z || !sc.hid ||
	    !sc.dout || !sc.dhid || !hashes)
		die("allocation", world, FR_ENOMEM);
	init_params(&l, w, o->seed);
	memcpy(ref, w, sizeof(float) * l.n);
	if (rank == 0)
		printf("train_mlp: %d ranks as %d data-parallel groups of %d tensor-parallel ranks, %d-%d-%d MLP, batch %d, %d steps\n",
		       nranks, c.ndp, c.T, NIN, o->hidden, NOUT, o->batch,
		       o->steps);

	/* the same minibatches as the plain mode, on every rank */
	s = o->seed ^ 0xda7a;
	pos = ntrain;
	for (int step = 0; step < o->steps; step++) {
		int lo = (int)((long)o->batch * c.g / c.ndp);
		int hi = (int)((long)o->batch * (c.g + 1) / c.ndp);

		if (pos + o->batch > ntrain) {
			shuffle(perm, ntrain, &s);
			pos = 0;
		}
		loss = tp_step(&l, &c, w, grad, d, perm + pos + lo, hi - lo,
			       o->batch, &sc, z);
		err = fr_allreduce(c.dp, FR_IN_PLACE, grad, l.n, FR_F32,
				   FR_AVG);
		if (err)
			die("fr_allreduce (data parallel)", c.dp, err);
		err = fr_allreduce(c.dp, FR_IN_PLACE, &loss, 1, FR_F64, FR_SUM);
		if (err)
			die("fr_allreduce (loss)", c.dp, err);
		for (size_t i = 0; i < l.n; i++) {
			vel[i] = (float)o->momentum * vel[i] + grad[i];
			w[i] -= (float)o->lr * vel[i];
		}
		/* the reference: one process, the whole minibatch */
		train_shard(&l, ref, rgrad, d, perm + pos, o->batch, o->batch,
			    1, &sc, &none);
		for (size_t i = 0; i < l.n; i++) {
			rvel[i] = (float)o->momentum * rvel[i] + rgrad[i];
			ref[i] -= (float)o->lr * rvel[i];
		}
		pos += o->batch;
	}
	/* the whole model from the group's slices */
	tp_mask(&l, &c, w);
	err = fr_allreduce(c.tp, FR_IN_PLACE, w, l.n, FR_F32, FR_SUM);
	if (err)
		die("fr_allreduce (assemble)", c.tp, err);
	for (size_t i = 0; i < l.n; i++) {
		diff = fmax(diff, fabs((double)w[i] - ref[i]));
		big = fmax(big, fabs((double)ref[i]));
	}
	/* float sums in another order drift apart slowly: a thousandth of
	 * the largest weight after the run is far beyond what that gives,
	 * and far below what a wrong slice or sum would */
	ok = diff <= 1e-3 * big;
	evaluate(world, &l, w, d, order, ntrain, sc.hid, &train_loss,
		 &train_acc);
	evaluate(world, &l, w, d, order + ntrain, o->ntest, sc.hid, &test_loss,
		 &test_acc);
	hash = fnv1a64(w, sizeof(float) * l.n);
	err = fr_allgather(world, &hash, hashes, 1, FR_U64);
	if (err)
		die("fr_allgather (hashes)", world, err);
	for (int r = 0; r < nranks; r++)
		same &= hashes[r] == hash;
	printf("final mode=tp%dxdp%d ranks=%d steps=%d train_loss=%.8g train_acc=%.4f test_loss=%.8g test_acc=%.4f hash=%016" PRIx64
	       " identical=%s max_diff=%.3g max_weight=%.3g reference=%s\n",
	       c.T, c.ndp, nranks, o->steps, train_loss, train_acc, test_loss,
	       test_acc, hash, same ? "yes" : "NO", diff, big,
	       ok ? "match" : "DIFFERS");
	fr_comm_destroy(c.tp);
	fr_comm_destroy(c.dp);
	free(hashes);
	free(sc.dhid);
	free(sc.dout);
	free(sc.hid);
	free(z);
	free(rgrad);
	free(rvel);
	free(ref);
	free(grad);
	free(vel);
	free(w);
	return same && ok ? 0 : 1;
}

static void usage(int rc)
{
	fprintf(rc ? stderr : stdout,
		"usage: frrun -n N train_mlp [options]\n"
		"  --data PATH           digits CSV (default %s)\n"
		"  --compress none|bf16|fp16|int8   wire format (default none)\n"
		"  --ef                  error feedback for compression\n"
		"  --buckets             bucket API instead of one All-Reduce\n"
		"  --bucket-bytes N      --buckets: size of those after layer 2 (4096)\n"
		"  --steps N             training steps (2000)\n"
		"  --batch B             global minibatch (64)\n"
		"  --hidden H            hidden units (64)\n"
		"  --lr X --momentum X   SGD (0.05, 0.9)\n"
		"  --seed S              initial weights and order (1)\n"
		"  --test N              held-out samples (297)\n"
		"  --csv FILE            rank 0 writes step,loss\n"
		"  --tp T                tensor parallel in groups of T ranks (a\n"
		"                        column- then a row-parallel layer), data\n"
		"                        parallel across the groups; checked against\n"
		"                        the single-process reference\n"
		"  --recover             survive failed ranks: agree, shrink, redo the\n"
		"                        step on the survivors\n"
		"  --grow                with --recover: re-admit newcomers (frrun\n"
		"                        --respawn) in place of the failed ranks\n"
		"  --kill-rank R --kill-step S [--kill-us U]   rank R dies (SIGKILL)\n"
		"                        U us (0) into step S (tests of --recover)\n"
		"  --drop-rank R --drop-step S   rank R leaves cleanly before step S\n"
		"                        (the run a recovered one must match)\n",
		EXAMPLE_DATA);
	exit(rc);
}

static long num_arg(const char *name, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 0);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "train_mlp: %s: expected %ld..%ld, got '%s'\n",
			name, lo, hi, s);
		exit(2);
	}
	return v;
}

static double real_arg(const char *name, const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v >= 0.0) || v > 1e3) {
		fprintf(stderr, "train_mlp: %s: bad value '%s'\n", name, s);
		exit(2);
	}
	return v;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"data", required_argument, NULL, 'd'},
		{"compress", required_argument, NULL, 'c'},
		{"ef", no_argument, NULL, 'E'},
		{"buckets", no_argument, NULL, 'B'},
		{"bucket-bytes", required_argument, NULL, 'K'},
		{"steps", required_argument, NULL, 's'},
		{"batch", required_argument, NULL, 'b'},
		{"hidden", required_argument, NULL, 'H'},
		{"lr", required_argument, NULL, 'l'},
		{"momentum", required_argument, NULL, 'm'},
		{"seed", required_argument, NULL, 'S'},
		{"test", required_argument, NULL, 't'},
		{"csv", required_argument, NULL, 'o'},
		{"tp", required_argument, NULL, 'T'},
		{"recover", no_argument, NULL, 'R'},
		{"grow", no_argument, NULL, 6},
		{"kill-rank", required_argument, NULL, 1},
		{"kill-step", required_argument, NULL, 2},
		{"kill-us", required_argument, NULL, 3},
		{"drop-rank", required_argument, NULL, 4},
		{"drop-step", required_argument, NULL, 5},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	fr_compress_t c;
	int ch;

	*o = (struct opts){
		.data = EXAMPLE_DATA,
		.steps = 2000,
		.batch = 64,
		.hidden = 64,
		.ntest = 297,
		.lr = 0.05,
		.momentum = 0.9,
		.seed = 1,
		.compress = FR_COMPRESS_NONE,
		.bucket_bytes = 4096,
		.tp = 1,
		.kill_rank = -1,
		.kill_step = -1,
		.drop_rank = -1,
		.drop_step = -1,
	};
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 'd':
			o->data = optarg;
			break;
		case 'c':
			if (fr_compress_from_name(optarg, &c)) {
				fprintf(stderr,
					"train_mlp: --compress: unknown '%s'\n",
					optarg);
				exit(2);
			}
			o->compress = c;
			break;
		case 'E':
			o->ef = true;
			break;
		case 'B':
			o->buckets = true;
			break;
		case 'K':
			o->bucket_bytes =
				num_arg("--bucket-bytes", optarg, 4, 1L << 30);
			break;
		case 's':
			o->steps = num_arg("--steps", optarg, 0, 100000000);
			break;
		case 'b':
			o->batch = num_arg("--batch", optarg, 1, 1 << 20);
			break;
		case 'H':
			o->hidden = num_arg("--hidden", optarg, 1, 1 << 16);
			break;
		case 'l':
			o->lr = real_arg("--lr", optarg);
			break;
		case 'm':
			o->momentum = real_arg("--momentum", optarg);
			break;
		case 'S':
			o->seed = num_arg("--seed", optarg, 0, 0x7fffffff);
			break;
		case 't':
			o->ntest = num_arg("--test", optarg, 1, 1 << 20);
			break;
		case 'o':
			o->csv = optarg;
			break;
		case 'T':
			o->tp = num_arg("--tp", optarg, 1, 1 << 16);
			break;
		case 'R':
			o->recover = true;
			break;
		case 1:
			o->kill_rank =
				num_arg("--kill-rank", optarg, 0, 1 << 20);
			break;
		case 2:
			o->kill_step =
				num_arg("--kill-step", optarg, 0, 1 << 30);
			break;
		case 3:
			o->kill_us = num_arg("--kill-us", optarg, 0, 60000000);
			break;
		case 4:
			o->drop_rank =
				num_arg("--drop-rank", optarg, 0, 1 << 20);
			break;
		case 5:
			o->drop_step =
				num_arg("--drop-step", optarg, 0, 1 << 30);
			break;
		case 6:
			o->grow = true;
			break;
		case 'h':
			usage(0);
			break;
		default:
			usage(2);
		}
	}
	if (optind != argc)
		usage(2);
	if (o->tp > 1 && (o->compress != FR_COMPRESS_NONE || o->buckets)) {
		fprintf(stderr,
			"train_mlp: --tp goes without --compress and --buckets\n");
		exit(2);
	}
	if ((o->recover || o->kill_rank >= 0 || o->drop_rank >= 0) &&
	    (o->tp > 1 || (o->buckets && o->ef))) {
		/* the buckets' residual lives in the library: no rolling
		 * back a step of it */
		fprintf(stderr,
			"train_mlp: --recover, --kill-* and --drop-* go without --tp and without --buckets --ef\n");
		exit(2);
	}
	if (o->grow && (!o->recover || o->ef)) {
		/* error feedback's residual is each rank's own: a newcomer
		 * has none to take over */
		fprintf(stderr,
			"train_mlp: --grow goes with --recover, without --ef\n");
		exit(2);
	}
	if ((o->kill_rank >= 0) != (o->kill_step >= 0) ||
	    (o->drop_rank >= 0) != (o->drop_step >= 0)) {
		fprintf(stderr,
			"train_mlp: --kill-rank goes with --kill-step, --drop-rank with --drop-step\n");
		exit(2);
	}
	if (o->ef && o->compress == FR_COMPRESS_NONE) {
		/* nothing is dropped, so there is nothing to feed back */
		fprintf(stderr, "train_mlp: --ef needs --compress\n");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	struct opts o;
	struct data d;
	struct layout l;
	struct scratch sc;
	struct reducer red = {0};
	fr_stats_t st0 = {.size = sizeof(st0)}, st1 = {.size = sizeof(st1)};
	fr_comm_t *comm;
	float *w, *grad, *vel;
	int *order, *perm, *shard;
	int rank, nranks, ntrain, pos, err, ret, job_rank, rounds = 0;
	int job_size, first = 0;
	bool joined;
	struct snapshot start = {0}, last = {0};
	double *losses = NULL;
	pthread_t kt;
	bool killing = false, redone = false;
	float *keep = NULL;
	uint64_t s, hash, *hashes;
	double t0, t1, train_loss, train_acc, test_loss, test_acc;
	char mode[64];
	FILE *csv = NULL;
	bool same = true;

	parse_args(argc, argv, &o);
	/* FR_JOIN=1 (frrun --respawn): this process is a newcomer, and
	 * fr_comm_create_from_env joins the survivors' fr_comm_grow */
	/* as the library reads it: set, not empty and not "0" */
	joined = getenv("FR_JOIN") && *getenv("FR_JOIN") &&
		 strcmp(getenv("FR_JOIN"), "0");
	err = fr_comm_create_from_env(NULL, &comm);
	if (err)
		die("fr_comm_create_from_env", NULL, err);
	rank = job_rank = fr_comm_rank(comm);
	nranks = job_size = fr_comm_size(comm);
	snprintf(mode, sizeof(mode), "%s%s%s", fr_compress_name(o.compress),
		 o.ef ? "+ef" : "", o.buckets ? "+buckets" : "");

	load_csv(o.data, &d);
	if (o.ntest >= d.n) {
		fprintf(stderr,
			"train_mlp: --test %d leaves no training data\n",
			o.ntest);
		return 2;
	}
	ntrain = d.n - o.ntest;
	if (o.batch < nranks || o.batch > ntrain) {
		fprintf(stderr,
			"train_mlp: --batch %d must be between the %d ranks and the %d training samples\n",
			o.batch, nranks, ntrain);
		return 2;
	}

	/* The split is fixed (not --seed): every run tests on the same
	 * held-out digits; order[0..ntrain) trains, the rest tests. */
	order = malloc(sizeof(int) * d.n);
	perm = malloc(sizeof(int) * ntrain);
	layout_init(&l, o.hidden);
	w = calloc(l.n, sizeof(float));
	vel = calloc(l.n, sizeof(float));
	/* page-aligned: the arena is registered and sent as is */
	grad = aligned_alloc(4096, (sizeof(float) * l.n + 4095) & ~4095ul);
	sc.hid = malloc(sizeof(float) * (size_t)o.batch * o.hidden);
	sc.dout = malloc(sizeof(float) * (size_t)o.batch * NOUT);
	sc.dhid = malloc(sizeof(float) * o.hidden);
	hashes = calloc(nranks, sizeof(uint64_t));
	if (!order || !perm || !w || !vel || !grad || !sc.hid || !sc.dout ||
	    !sc.dhid || !hashes)
		die("allocation", comm, FR_ENOMEM);
	for (int i = 0; i < d.n; i++)
		order[i] = i;
	s = 0x5eed;
	shuffle(order, d.n, &s);
	memcpy(perm, order, sizeof(int) * ntrain);

	if (o.tp > 1) {
		ret = train_tp(&o, comm, &d, order, perm, ntrain);
		goto out;
	}
	init_params(&l, w, o.seed);
	reducer_init(&red, comm, &l, grad, &o);
	if (rank == 0 && o.csv) {
		csv = fopen(o.csv, "w");
		if (!csv) {
			fprintf(stderr, "train_mlp: %s: %s\n", o.csv,
				strerror(errno));
			return 1;
		}
		fprintf(csv, "step,loss\n");
	}
	/* the losses are written at the end: a step may be done twice */
	losses = calloc((size_t)o.steps + 1, sizeof(*losses));
	if (!losses || (o.recover && (snap_init(&start, &l, ntrain, &red) ||
				      snap_init(&last, &l, ntrain, &red))))
		die("allocation", comm, FR_ENOMEM);
	if (rank == 0)
		printf("train_mlp: %d ranks, %s, %d-%d-%d MLP (%zu parameters), %d train / %d test digits, batch %d, %d steps\n",
		       nranks, mode, NIN, o.hidden, NOUT, l.n, ntrain, o.ntest,
		       o.batch, o.steps);

	if (rank == 0 && red.bk) {
		size_t off, cnt;

		printf("train_mlp: %d buckets, started in this order:",
		       fr_buckets_count(red.bk));
		for (int i = 0; i < fr_buckets_count(red.bk); i++)
			if (!fr_buckets_range(red.bk, i, &off, &cnt))
				printf(" [%zu, %zu)", off, off + cnt);
		printf(" (layer 2 is [%zu, %zu))\n", l.l1_len, l.n);
	}

	/* Same seed on every rank: the same minibatches in the same order. */
	s = o.seed ^ 0xda7a;
	pos = ntrain;
	if (joined) {
		err = share_state(comm, &first, w, vel, perm, ntrain, &pos, &s,
				  &rounds, &l);
		if (err)
			die("joining (the state from rank 0)", comm, err);
		printf("train_mlp: joined as rank %d of %d at step %d\n", rank,
		       nranks, first);
		redone = true;
	}
	fr_comm_stats(comm, &st0);
	t0 = now_s();
	for (int step = first; step < o.steps; step++) {
		int lo, hi;
		double loss;

		if (step == o.drop_step && o.drop_rank < nranks) {
			fr_comm_t *nc = NULL;

			/* the clean run a recovered one must match: the
			 * others go on without that rank from this step */
			err = fr_comm_split(
				comm,
				job_rank == o.drop_rank ? FR_UNDEFINED : 0,
				rank, &nc);
			if (err)
				die("fr_comm_split (--drop-rank)", comm, err);
			/* error feedback's residual carries on, as it does
			 * through a recovery */
			if (red.residual) {
				keep = malloc(sizeof(float) * l.n);
				if (!keep)
					die("allocation", comm, FR_ENOMEM);
				memcpy(keep, red.residual, sizeof(float) * l.n);
			}
			reducer_destroy(&red);
			fr_comm_destroy(comm);
			comm = nc;
			if (!comm) {
				printf("train_mlp: left at step %d\n", step);
				ret = 0;
				goto dropped;
			}
			rank = fr_comm_rank(comm);
			nranks = fr_comm_size(comm);
			reducer_init(&red, comm, &l, grad, &o);
			if (keep && red.residual)
				memcpy(red.residual, keep, sizeof(float) * l.n);
			free(keep);
			keep = NULL;
		}
		if (job_rank == o.kill_rank && step == o.kill_step &&
		    !killing && !joined) {
			killing =
				!pthread_create(&kt, NULL, killer, &o.kill_us);
			if (!killing)
				die("--kill-rank: pthread_create", comm,
				    FR_ESYS);
		}
		lo = (int)((long)o.batch * rank / nranks);
		hi = (int)((long)o.batch * (rank + 1) / nranks);
		if (o.recover)
			snap_take(&start, step, NULL, NULL, perm, pos, s, &red,
				  &l, ntrain);
		if (pos + o.batch > ntrain) { /* next epoch */
			shuffle(perm, ntrain, &s);
			pos = 0;
		}
		shard = perm + pos + lo;
		pos += o.batch;
		loss = train_shard(&l, w, grad, &d, shard, hi - lo, o.batch,
				   nranks, &sc, &red);
		err = reducer_finish(&red);
		if (!err)
			err = fr_allreduce(comm, FR_IN_PLACE, &loss, 1, FR_F64,
					   FR_SUM);
		if (err && !o.recover)
			die("fr_allreduce (loss)", comm, err);
		if (err) {
			/* start: this step's; last: the one applied before */
			bool back = recover(&comm, &red, &l, grad, &o, step,
					    &rounds);
			struct snapshot *to = back ? &last : &start;

			rank = fr_comm_rank(comm);
			nranks = fr_comm_size(comm);
			if (back) {
				memcpy(w, last.w, sizeof(float) * l.n);
				memcpy(vel, last.vel, sizeof(float) * l.n);
			}
			memcpy(perm, to->perm, sizeof(int) * ntrain);
			pos = to->pos;
			s = to->s;
			if (red.residual && to->residual)
				memcpy(red.residual, to->residual,
				       sizeof(float) * l.n);
			step = to->step; /* redo it */
			if (o.grow && nranks < job_size &&
			    grow_back(&comm, &red, &l, grad, &o,
				      job_size - nranks)) {
				rank = fr_comm_rank(comm);
				nranks = fr_comm_size(comm);
				err = share_state(comm, &step, w, vel, perm,
						  ntrain, &pos, &s, &rounds,
						  &l);
				if (err)
					fprintf(stderr,
						"train_mlp: the state to the newcomers: %s\n",
						fr_strerror(err));
			}
			step--;
			redone = true;
			/* the counters are the new communicator's */
			memset((char *)&st0 + sizeof(st0.size), 0,
			       sizeof(st0) - sizeof(st0.size));
			continue;
		}
		losses[step] = loss / o.batch;
		if (redone) {
			redone = false;
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			printf("RECOVERED step=%d ranks=%d at=%.6f\n", step,
			       nranks, ts.tv_sec + ts.tv_nsec * 1e-9);
			fflush(stdout);
		}
		if (o.recover)
			snap_take(&last, step, w, vel, start.perm, start.pos,
				  start.s, NULL, &l, ntrain),
				snap_residual(&last, &start, &l);
		/* SGD with momentum: the same bits on every rank because
		 * the averaged gradient is */
		for (size_t i = 0; i < l.n; i++) {
			vel[i] = (float)o.momentum * vel[i] + grad[i];
			w[i] -= (float)o.lr * vel[i];
		}
	}
	if (csv)
		for (int i = 0; i < o.steps; i++)
			fprintf(csv, "%d,%.9g\n", i, losses[i]);
	t1 = now_s();
	fr_comm_stats(comm, &st1);
	if (csv && fclose(csv)) {
		fprintf(stderr, "train_mlp: %s: write error\n", o.csv);
		return 1;
	}

	evaluate(comm, &l, w, &d, order, ntrain, sc.hid, &train_loss,
		 &train_acc);
	evaluate(comm, &l, w, &d, order + ntrain, o.ntest, sc.hid, &test_loss,
		 &test_acc);

	hash = fnv1a64(w, sizeof(float) * l.n);
	err = fr_allgather(comm, &hash, hashes, 1, FR_U64);
	if (err)
		die("fr_allgather (hashes)", comm, err);
	for (int r = 0; r < nranks; r++)
		if (hashes[r] != hash) {
			same = false;
			if (rank == 0)
				fprintf(stderr,
					"train_mlp: rank %d's weights differ: %016" PRIx64
					" != %016" PRIx64 "\n",
					r, hashes[r], hash);
		}
	printf("final mode=%s ranks=%d steps=%d train_loss=%.8g train_acc=%.4f test_loss=%.8g test_acc=%.4f hash=%016" PRIx64
	       " identical=%s sent_bytes=%" PRIu64 " wire_bytes=%" PRIu64
	       " time_s=%.2f recoveries=%d\n",
	       mode, nranks, o.steps, train_loss, train_acc, test_loss,
	       test_acc, hash, same ? "yes" : "NO",
	       st1.bytes_sent - st0.bytes_sent, st1.wire_bytes - st0.wire_bytes,
	       t1 - t0, rounds);

	ret = same ? 0 : 1;
dropped:
	if (!comm && csv)
		fclose(csv);
	free(keep);
	snap_free(&start);
	snap_free(&last);
	free(losses);
out:
	reducer_destroy(&red); /* all zeros in --tp mode: nothing to free */
	fr_comm_destroy(comm);
	free(hashes);
	free(sc.dhid);
	free(sc.dout);
	free(sc.hid);
	free(grad);
	free(vel);
	free(w);
	free(perm);
	free(order);
	free(d.x);
	free(d.y);
	return ret;
}
