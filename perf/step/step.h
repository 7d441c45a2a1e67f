/* SPDX-License-Identifier: MIT */
/*
 * step.h - the model of a data-parallel training step behind fr_step(1):
 * a network as a list of per-layer gradients and backward times
 * (models.c), and an event simulation of one step's compute and gradient
 * All-Reduces under the library's cost model (sim.c).
 *
 * Nothing here touches a communicator, so fr_step can predict jobs it does
 * not run and the simulation is the same on every rank.
 */
#ifndef FR_STEP_H
#define FR_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "algo/algo.h"
#include "fastreduce.h"

/* One layer (one or more parameter tensors updated together). */
struct st_layer {
	char name[48];
	uint64_t params_full; /* parameters before --scale */
	size_t params;	      /* gradient elements in the arena (scaled) */
	size_t off;	      /* first element in the arena */
	double macs; /* forward multiply-adds per sample (0: unknown) */
	double ms;   /* backward compute time of this layer */
};

struct st_model {
	char name[64];
	const char *what; /* "ResNet-50 (He et al. 2016), 224x224 images" */
	uint64_t paper;	  /* the parameter count the paper gives, 0 if none */
	struct st_layer
		*layers; /* forward order: layers[0] is the input side */
	int nlayers, cap;
	uint64_t params_full;	 /* sum over the layers */
	size_t params;		 /* the arena's element count (scaled) */
	int batch;		 /* samples per rank the FLOP counts are for */
	double compute_ms;	 /* total backward time (sum of layers' ms) */
	const char *compute_src; /* how the times were found, for the header */
	int oom;		 /* a layer could not be added */
};

/* The presets, by name ("resnet50", "bert-base", "vgg16", "gpt2-small"). */
int st_model_preset(const char *name, struct st_model *m);
/* Each preset's name, NULL past the last. */
const char *st_preset_name(int i);
/* A file of "name params compute_ms" lines ('#' comments); 0 or -1 with
 * the reason in err. */
int st_model_load(const char *path, struct st_model *m, char *err,
		  size_t errlen);
/* Multiply parameter counts by scale (a layer that had some keeps at least
 * one) and lay the gradients out in forward order. */
void st_model_scale(struct st_model *m, double scale);
/* Backward time per layer from FLOPs: 2 x forward (input and weight
 * gradients) = 4 x multiply-adds, batch samples at gflops. */
void st_model_time_flops(struct st_model *m, int batch, double gflops);
/* Rescale the per-layer times to a total of ms (FLOP-proportional for
 * presets, proportional to the given times for files, to the parameters
 * where there is nothing else). */
void st_model_time_total(struct st_model *m, double ms);
/* Backward FLOPs of the whole model for one sample (0 if unknown). */
double st_model_flops(const struct st_model *m);
void st_model_free(struct st_model *m);

/* ---- buckets and the simulation ----------------------------------------- */

struct st_bucket {
	size_t off, count; /* elements of the arena */
	double ready_ms;   /* when backward has produced all of it */
};

/*
 * The library's cut (fr_buckets_create): from the arena's end (forward 0)
 * or start, the first bucket first_bytes, then bucket_bytes each, the last
 * one what is left.  Returns the number of buckets (in start order) and a
 * malloc'ed array, or -1.
 */
int st_cut(const struct st_model *m, size_t bucket_bytes, size_t first_bytes,
	   int forward, struct st_bucket **out);
/* Ready times of the buckets for a backward pass from the last layer. */
void st_ready_times(const struct st_model *m, struct st_bucket *b, int nb);

/*
 * All-Reduce times from fr_sim (simrun.c): the simulator running the
 * library's own schedules for a job size and link, in place of the closed
 * form below.  Each (ranks, alpha, beta, gamma) point is one fr_sim run
 * over all its sizes; the answers are kept for the next asks.
 */
struct st_simpt;
struct st_simtab {
	const char *exe;  /* the fr_sim binary (a path, or found in PATH) */
	const char *args; /* more fr_sim options (--sim-args), or NULL */
	int recording;	  /* note the points asked for, run nothing yet */
	int progress;	  /* a line on stderr per fr_sim run */
	int failed;	  /* a run failed: err says why */
	int runs;	  /* fr_sim runs so far */
	char err[256];
	struct st_simpt *pts;
	int npts, cap;
};

void st_simtab_init(struct st_simtab *t, const char *exe, const char *args);
void st_simtab_free(struct st_simtab *t);
/* fr_sim's time (us) of an f32 All-Reduce of bytes on p ranks over the
 * link of tune, *algo (may be NULL) the algorithm the library chose there;
 * -1 while recording (the point is noted) or if fr_sim failed. */
double st_simtab_us(struct st_simtab *t, const struct fr_tune *tune, int p,
		    size_t bytes, int *algo);
/* Run fr_sim for every point noted and not run yet; 0 or -1 (t->err). */
int st_simtab_run(struct st_simtab *t);

/*
 * The link and the job a prediction is for: the library's cost model
 * parameters (alpha, beta, copy, gamma) and, per compression format, the
 * codec's cost per f32 value on this CPU: encoding (with error feedback
 * where the mode has it) and decoding.
 */
struct st_link {
	struct fr_tune tune;
	/* the parameters the library chooses its algorithm with, when they
	 * are not tune (a job run with the built-in model), or NULL */
	const struct fr_tune *choose;
	int nranks;
	size_t payload_max; /* a mailbox slot's payload (broadcast only) */
	double enc_ns[FR_COMPRESS_COUNT];
	double dec_ns[FR_COMPRESS_COUNT];
	/* f32 All-Reduce times from fr_sim instead of the model, or NULL */
	struct st_simtab *sim;
};

/*
 * Predicted time (us) of one All-Reduce of count f32 elements (n bytes,
 * p ranks) with the algorithm the library would choose (with l->choose,
 * else l->tune); uncompressed, from l->sim where there is one (its
 * algorithm the library's choice under the simulated link), else:
 *   ring, recursive doubling, Rabenseifner: the library's own model
 *               (fr_model_predict_us), with which it chooses; for the
 *               ring T = (2(p-1) + 1) alpha + 2(p-1)/p n beta
 *               + (p-1)/p n gamma.  (fr_step once priced the ring as
 *               pipelined, alpha + 2(p-1) max(alpha, n/p beta): 13 %
 *               closer for a 1.3 MB bucket on 8 ranks at 1 Gbit/s, where
 *               alpha is small, but at 73 us fr_sim finds the sum, 25 MiB
 *               on 8 ranks at 384 Gbit/s taking 1,878 us against 2,047
 *               by the sum and 1,095 pipelined; and pricing the ring
 *               apart from the model that chooses it made the choice
 *               look dearer than the ring it passed over.)
 *   compressed  the compressed ring (src/algo/cring.c), 2(p-1) steps of
 *               one compressed chunk of c = count/p values (w wire bytes,
 *               through the mailbox); a reduce-scatter step encodes,
 *               decodes and adds a chunk, an all-gather step decodes one,
 *               and the reduced chunk is encoded once more; the CPU's work
 *               adds to the wire's, as gamma does in the library's model:
 *                 T = 2(p-1) max(alpha, w (beta + copy))
 *                     + (p-1) c (enc + 2 dec + 4 gamma) + c enc
 * *algo (may be NULL) gets the algorithm (FR_ALGO_RING when compressed).
 */
double st_allreduce_us(const struct st_link *l, int compress, size_t count,
		       int *algo);
/* Wire bytes of count f32 values in a compression format. */
size_t st_wire_bytes(int compress, size_t count);

/* What a mode's step costs, all in milliseconds. */
struct st_result {
	double compute; /* backward alone */
	double comm;	/* the gradient All-Reduce(s) alone */
	double exposed; /* step - compute (>= 0) */
	double overlap; /* 1 - exposed / comm, in [0, 1] */
	double step;	/* one training step's backward + communication */
	double eff;	/* compute / step */
};

/* Fill exposed, overlap and eff from compute, comm and step. */
void st_result_derive(struct st_result *r);
/* All-Reduce of the whole arena once backward is over. */
void st_simulate_after(const struct st_model *m, const struct st_link *l,
		       int compress, struct st_result *r);
/* When a bucket's All-Reduce runs in the simulation, and with what. */
struct st_sched {
	double start_ms, end_ms;
	int algo;
};

/* Buckets: bucket i starts at max(ready_i, end of bucket i-1), lasts
 * st_allreduce_us of its elements; step = max(compute, last end).  sched
 * (nb entries, may be NULL) receives the schedule. */
void st_simulate_buckets(const struct st_model *m, const struct st_bucket *b,
			 int nb, const struct st_link *l, int compress,
			 struct st_result *r, struct st_sched *sched);

#endif /* FR_STEP_H */
