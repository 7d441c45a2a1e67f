/* SPDX-License-Identifier: MIT */
/*
 * sim.c - one training step as a schedule of events: backward produces
 * the layers' gradients from the last layer to the first, buckets become
 * ready when their last gradient is produced, and their All-Reduces run
 * one after another (collectives on a communicator run in the order they
 * were started), each lasting what the cost model says for its bytes.
 *
 * The simulation knows nothing about the host it runs on: the job size
 * and the link are parameters (struct st_link), so the schedule measured
 * by fr_step and any other job size or link speed go through the same
 * code.
 */
#include <math.h>
#include <stdlib.h>

#include "step.h"

int st_cut(const struct st_model *m, size_t bucket_bytes, size_t first_bytes,
	   int forward, struct st_bucket **out)
{
	size_t first = first_bytes / sizeof(float),
	       each = bucket_bytes / sizeof(float), left = m->params, cap;
	struct st_bucket *b;
	int nb = 0;

	first = first ? first : 1;
	each = each ? each : 1;
	cap = left <= first ? 1 : 2 + (left - first) / each;
	if (cap > 1u << 24)
		return -1;
	b = calloc(cap, sizeof(*b));
	if (!b)
		return -1;
	while (left) {
		size_t c = nb ? each : first;

		if (c > left)
			c = left;

		b[nb].off = forward ? m->params - left : left - c;
		b[nb].count = c;
		nb++;
		left -= c;
	}
	*out = b;
	return nb;
}

void st_ready_times(const struct st_model *m, struct st_bucket *b, int nb)
{
	for (int i = 0; i < nb; i++) {
		double done = 0; /* backward time when layer l is finished */

		b[i].ready_ms = 0;
		for (int l = m->nlayers - 1; l >= 0; l--) {
			const struct st_layer *y = &m->layers[l];

			done += y->ms;
			if (y->params && y->off < b[i].off + b[i].count &&
			    b[i].off < y->off + y->params)
				b[i].ready_ms = done;
		}
	}
}

size_t st_wire_bytes(int compress, size_t count)
{
	return fr_compress_bytes(compress, count);
}

double st_allreduce_us(const struct st_link *l, int compress, size_t count,
		       int *algo)
{
	const struct fr_tune *t = &l->tune;
	double p = l->nranks, best = -1, c, w;
	int pick = FR_ALGO_RING;

	if (l->nranks <= 1 || !count) {
		if (algo)
			*algo = pick;
		return 0;
	}
	if (compress == FR_COMPRESS_NONE && l->sim) {
		double us = st_simtab_us(l->sim, t, l->nranks,
					 count * sizeof(float), algo);

		/* while the points are only noted (or fr_sim failed, which
		 * the caller learns from l->sim->failed) the model answers */
		if (us >= 0)
			return us;
	}
	if (compress == FR_COMPRESS_NONE) {
		/* the library's choice: the cheapest under its model, the
		 * first in id order on a tie (fr_algo_select) */
		static const int ids[] = {FR_ALGO_RING, FR_ALGO_RD,
					  FR_ALGO_RABENSEIFNER};
		const struct fr_tune *ch = l->choose ? l->choose : t;

		for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
			double us = fr_model_predict_us(
				ch, l->nranks, l->payload_max, ids[i],
				FR_COLL_ALLREDUCE, count * sizeof(float),
				FR_F32);

			if (us >= 0 && (best < 0 || us < best)) {
				best = us;
				pick = ids[i];
			}
		}
		if (algo)
			*algo = pick;
		return fr_model_predict_us(t, l->nranks, l->payload_max, pick,
					   FR_COLL_ALLREDUCE,
					   count * sizeof(float), FR_F32);
	}
	/* one compressed chunk per step (an int8 chunk carries its own block
	 * scales) */
	c = (double)((count + (size_t)l->nranks - 1) / (size_t)l->nranks);
	w = (double)st_wire_bytes(compress, (size_t)c);
	if (algo)
		*algo = FR_ALGO_RING;
	return 2 * (p - 1) *
		       fmax(t->alpha_us, w * (t->beta_ns + t->copy_ns) * 1e-3) +
	       (p - 1) * c *
		       (l->enc_ns[compress] + 2 * l->dec_ns[compress] +
			4 * t->gamma_ns[FR_F32]) *
		       1e-3 +
	       c * l->enc_ns[compress] * 1e-3;
}

void st_result_derive(struct st_result *r)
{
	r->exposed = fmax(r->step - r->compute, 0);
	r->overlap =
		r->comm > 0 ? fmin(fmax(1 - r->exposed / r->comm, 0), 1) : 1;
	r->eff = r->step > 0 ? r->compute / r->step : 1;
}

void st_simulate_after(const struct st_model *m, const struct st_link *l,
		       int compress, struct st_result *r)
{
	r->compute = m->compute_ms;
	r->comm = st_allreduce_us(l, compress, m->params, NULL) * 1e-3;
	r->step = r->compute + r->comm;
	st_result_derive(r);
}

void st_simulate_buckets(const struct st_model *m, const struct st_bucket *b,
			 int nb, const struct st_link *l, int compress,
			 struct st_result *r, struct st_sched *sched)
{
	double end = 0;

	r->compute = m->compute_ms;
	r->comm = 0;
	for (int i = 0; i < nb; i++) {
		int algo;
		double us = st_allreduce_us(l, compress, b[i].count, &algo);
		double start = fmax(end, b[i].ready_ms);

		end = start + us * 1e-3;
		r->comm += us * 1e-3;
		if (sched)
			sched[i] = (struct st_sched){start, end, algo};
	}
	r->step = fmax(r->compute, end);
	st_result_derive(r);
}
