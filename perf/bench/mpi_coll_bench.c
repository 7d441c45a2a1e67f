/* SPDX-License-Identifier: MIT */
/*
 * mpi_coll_bench - time one MPI collective over a list of message sizes,
 * for side-by-side comparison with fr_allreduce_perf (perf/bench/compare.sh).
 *
 * Not part of the autotools build: compare.sh compiles it into its work
 * directory at run time, once with each MPI's own wrapper (mpicc for Open
 * MPI, mpicc.mpich for MPICH).
 *
 *   mpirun -np N mpi_coll_bench [-c COLL]
 *                               [-n iters] [-w warmup] [--csv] SIZE...
 *
 * COLL: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall,
 * sendrecv or pingpong.
 *
 * SIZE is in bytes (K/M/G suffixes = powers of 1024).  The data are f32 and
 * the reduction is a sum, as fr_allreduce_perf's defaults.  Sizes follow
 * nccl-tests: SIZE is the whole vector, i.e.
 *   allreduce       count = SIZE/4 elements in and out on every rank
 *   reduce_scatter  MPI_Reduce_scatter_block, SIZE/4 in, SIZE/4/n out
 *   allgather       SIZE/4/n in, SIZE/4 out
 *   broadcast       SIZE/4 elements from rank 0
 *   reduce          SIZE/4 elements in, the sum on rank 0
 *   alltoall        SIZE/4/n elements to and from every rank (SIZE/4 in
 *                   and out on every rank)
 *   sendrecv        SIZE/4 elements to the next rank, from the previous
 *                   (MPI_Sendrecv)
 *   pingpong        SIZE/4 elements from rank 0 to rank 1 and back
 *                   (MPI_Send, MPI_Recv): the time is the round trip
 * Sizes are rounded down to a whole number of elements (of n elements for
 * reduce_scatter, allgather and alltoall); a size that rounds to 0 is
 * skipped.
 *
 * Timing.  Per size: -w untimed calls, an MPI_Barrier, then -n calls back to
 * back (no barrier in between), each rank taking a timestamp after every
 * call.  After the timed loop (nothing is exchanged inside it) one
 * MPI_Reduce with MPI_MAX to rank 0 of every rank's per-call durations and
 * of its average gives, per call, the slowest rank's time (what a training
 * step waits for), and the slowest rank's average:
 *   mean    each rank's (t_end - t_start) / iters, then the maximum over the
 *           ranks: what fr_allreduce_perf reports by default (time_us);
 *   median, p99, min
 *           over the calls of the per-call slowest rank's time: what
 *           fr_allreduce_perf reports in its median, p99 and min columns,
 *           computed the same way (median of an even number: the mean of the
 *           two middle ones; p99: the nearest rank, the ceil(0.99 n)-th
 *           smallest, i.e. the largest below 100 calls).  compare.sh compares
 *           these.
 * algbw = SIZE / time, busbw = algbw * factor with nccl-tests' factors:
 * allreduce 2(n-1)/n, reduce_scatter, allgather and alltoall (n-1)/n,
 * broadcast, reduce and sendrecv 1, pingpong 2 (the one-way rate).
 * Bandwidths are in GB/s (10^9 B/s).
 *
 * After the timed calls one more call runs on known inputs (element i of rank
 * r is ((r+i) mod 7) - 3, exact in f32 for any realistic n) and the result is
 * checked; "wrong" is the number of wrong elements summed over the ranks.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll {
	C_ALLREDUCE,
	C_REDUCE_SCATTER,
	C_ALLGATHER,
	C_BROADCAST,
	C_REDUCE,
	C_ALLTOALL,
	C_SENDRECV,
	C_PINGPONG,
	C_COUNT
};
static const char *coll_names[] = {"allreduce", "reduce_scatter", "allgather",
				   "broadcast", "reduce",	  "alltoall",
				   "sendrecv",	"pingpong"};

static int rank, nranks;

static void die(const char *msg)
{
	if (rank == 0)
		fprintf(stderr, "mpi_coll_bench: %s\n", msg);
	MPI_Abort(MPI_COMM_WORLD, 2);
	exit(2);
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (end == s)
		return -1;
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end)
		return -1;
	*out = (size_t)v;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static float pat(int r, size_t i)
{
	return (float)((int)((r + i) % 7) - 3);
}

/* One call of the collective; count = elements of the whole vector. */
static void run_coll(enum coll c, const float *sbuf, float *rbuf, size_t count)
{
	int n = nranks;

	switch (c) {
	case C_ALLREDUCE:
		MPI_Allreduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM,
			      MPI_COMM_WORLD);
		break;
	case C_REDUCE_SCATTER:
		MPI_Reduce_scatter_block(sbuf, rbuf, (int)(count / n),
					 MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		break;
	case C_ALLGATHER:
		MPI_Allgather(sbuf, (int)(count / n), MPI_FLOAT, rbuf,
			      (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD);
		break;
	case C_BROADCAST:
		MPI_Bcast(rbuf, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
		break;
	case C_REDUCE:
		MPI_Reduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, 0,
			   MPI_COMM_WORLD);
		break;
	case C_ALLTOALL:
		MPI_Alltoall(sbuf, (int)(count / n), MPI_FLOAT, rbuf,
			     (int)(count / n), MPI_FLOAT, MPI_COMM_WORLD);
		break;
	case C_PINGPONG:
		/* rank 0 to rank 1 and back: a round trip */
		if (rank == 0) {
			MPI_Send(sbuf, (int)count, MPI_FLOAT, 1, 0,
				 MPI_COMM_WORLD);
			MPI_Recv(rbuf, (int)count, MPI_FLOAT, 1, 0,
				 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(rbuf, (int)count, MPI_FLOAT, 0, 0,
				 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(sbuf, (int)count, MPI_FLOAT, 0, 0,
				 MPI_COMM_WORLD);
		}
		break;
	case C_SENDRECV:
		/* as nccl-tests' sendrecv_perf: to the next, from the previous
		 */
		MPI_Sendrecv(sbuf, (int)count, MPI_FLOAT, (rank + 1) % n, 0,
			     rbuf, (int)count, MPI_FLOAT, (rank + n - 1) % n, 0,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		break;
	default:
		break;
	}
}

/* Fill inputs, run once, count wrong elements on this rank. */
static long long check(enum coll c, float *sbuf, float *rbuf, size_t count)
{
	size_t per = count / nranks, i, lo = 0, nout = count;
	long long wrong = 0;

	switch (c) {
	case C_ALLREDUCE:
	case C_REDUCE_SCATTER:
	case C_REDUCE:
	case C_ALLTOALL:
	case C_SENDRECV:
	case C_PINGPONG:
		for (i = 0; i < count; i++)
			sbuf[i] = pat(rank, i);
		break;
	case C_ALLGATHER:
		for (i = 0; i < per; i++)
			sbuf[i] = pat(rank, i);
		break;
	case C_BROADCAST:
		for (i = 0; i < count; i++)
			rbuf[i] = rank == 0 ? pat(0, i) : -99.0f;
		break;
	default:
		break;
	}
	if (c != C_BROADCAST)
		memset(rbuf, 0xff, count * sizeof(float));
	run_coll(c, sbuf, rbuf, count);
	if (c == C_REDUCE_SCATTER) {
		lo = (size_t)rank * per;
		nout = per;
	}
	if ((c == C_REDUCE && rank != 0) || (c == C_PINGPONG && rank > 1))
		nout = 0; /* no result here */
	for (i = 0; i < nout; i++) {
		size_t gi = lo + i; /* index in the whole vector */
		float want = 0;

		switch (c) {
		case C_ALLREDUCE:
		case C_REDUCE_SCATTER:
		case C_REDUCE:
			for (int r = 0; r < nranks; r++)
				want += pat(r, gi);
			break;
		case C_SENDRECV:
			want = pat((rank + nranks - 1) % nranks, gi);
			break;
		case C_PINGPONG:
			want = pat(1 - rank, gi);
			break;
		case C_ALLTOALL:
			/* block b: rank b's block for us */
			want = pat((int)(gi / per),
				   (size_t)rank * per + gi % per);
			break;
		case C_ALLGATHER:
			want = pat((int)(gi / per), gi % per);
			break;
		case C_BROADCAST:
			want = pat(0, gi);
			break;
		default:
			break;
		}
		if (rbuf[i] != want)
			wrong++;
	}
	return wrong;
}

int main(int argc, char **argv)
{
	enum coll c = C_ALLREDUCE;
	long iters = 20, warmup = 5;
	int csv = 0, nsizes = 0;
	size_t *sizes, maxb = 0;
	float *sbuf, *rbuf;
	double *t, *d;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	sizes = calloc((size_t)argc, sizeof(*sizes));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-c") && i + 1 < argc) {
			int k;

			i++;
			for (k = 0; k < C_COUNT; k++)
				if (!strcmp(argv[i], coll_names[k]))
					break;
			if (k == C_COUNT)
				die("-c: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, sendrecv or pingpong");
			c = (enum coll)k;
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			iters = atol(argv[++i]);
		} else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
			warmup = atol(argv[++i]);
		} else if (!strcmp(argv[i], "--csv")) {
			csv = 1;
		} else if (!parse_size(argv[i], &sizes[nsizes])) {
			if (sizes[nsizes] > maxb)
				maxb = sizes[nsizes];
			nsizes++;
		} else {
			die("usage: mpi_coll_bench [-c COLL] [-n iters] [-w warmup] [--csv] SIZE...");
		}
	}
	if (iters < 1 || warmup < 0 || !nsizes)
		die("need iters >= 1, warmup >= 0 and at least one size");
	sbuf = malloc(maxb + 64);
	rbuf = malloc(maxb + 64);
	/* per-call durations and, at [iters], the mean */
	t = malloc(((size_t)iters + 1) * sizeof(*t));
	d = malloc(((size_t)iters + 1) * sizeof(*d));
	if (!sbuf || !rbuf || !t || !d)
		die("out of memory");
	memset(sbuf, 0, maxb + 64); /* fault the pages in */
	memset(rbuf, 0, maxb + 64);

	if (rank == 0) {
		if (csv) {
			printf("size,count,coll,nranks,iters,time_us,time_mean_us,time_median_us,time_p99_us,time_min_us,algbw_GBps,busbw_GBps,busbw_median_GBps,wrong\n");
		} else {
			char lib[MPI_MAX_LIBRARY_VERSION_STRING];
			int len;

			MPI_Get_library_version(lib, &len);
			lib[strcspn(lib, "\n")] = 0;
			printf("# mpi_coll_bench: %s, nranks %d, f32 sum, iters %ld, warmup %ld\n",
			       coll_names[c], nranks, iters, warmup);
			printf("# %s\n", lib);
			printf("# mean: the slowest rank's average; median, p99, min: over the calls, of the slowest rank's time per call\n");
			printf("#%11s %13s %10s %10s %10s %10s %8s %8s %8s %7s\n",
			       "size", "count", "mean", "median", "p99", "min",
			       "algbw", "busbw", "busbw", "#wrong");
			printf("#%11s %13s %10s %10s %10s %10s %8s %8s %8s\n",
			       "(B)", "(elements)", "(us)", "(us)", "(us)",
			       "(us)", "(GB/s)", "(GB/s)", "(median)");
		}
		fflush(stdout);
	}
	for (int s = 0; s < nsizes; s++) {
		size_t count = sizes[s] / sizeof(float), bytes;
		double n = nranks, factor, t0, mean, med, p99, tmin, algbw;
		long long wrong, wsum;
		long k99 = (long)ceil(0.99 * (double)iters);

		if (c == C_REDUCE_SCATTER || c == C_ALLGATHER ||
		    c == C_ALLTOALL)
			count -= count % (size_t)nranks;
		if (!count)
			continue;
		if (count > 0x7fffffff)
			die("size too large for an int count");
		bytes = count * sizeof(float);
		switch (c) {
		case C_ALLREDUCE: factor = 2 * (n - 1) / n; break;
		case C_BROADCAST:
		case C_REDUCE:
		case C_SENDRECV:
			factor = 1;
			break;
		case C_PINGPONG:
			factor = 2; /* the message crosses twice per call */
			break;
		default: factor = (n - 1) / n; break;
		}
		for (long i = 0; i < warmup; i++)
			run_coll(c, sbuf, rbuf, count);
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (long i = 0; i < iters; i++) {
			run_coll(c, sbuf, rbuf, count);
			t[i] = MPI_Wtime();
		}
		mean = (t[iters - 1] - t0) / (double)iters;
		for (long i = iters - 1; i > 0; i--)
			t[i] -= t[i - 1];
		t[0] -= t0;
		t[iters] = mean;
		/* per call the slowest rank, and the slowest rank's mean */
		MPI_Reduce(t, d, (int)iters + 1, MPI_DOUBLE, MPI_MAX, 0,
			   MPI_COMM_WORLD);
		mean = d[iters];
		qsort(d, (size_t)iters, sizeof(*d), cmp_double);
		med = iters % 2 ? d[iters / 2]
				: (d[iters / 2 - 1] + d[iters / 2]) / 2;
		p99 = d[(k99 < 1 ? 1 : k99) - 1];
		tmin = d[0];
		wrong = check(c, sbuf, rbuf, count);
		MPI_Reduce(&wrong, &wsum, 1, MPI_LONG_LONG, MPI_SUM, 0,
			   MPI_COMM_WORLD);
		if (rank)
			continue;
		mean *= 1e6;
		med *= 1e6;
		p99 *= 1e6;
		tmin *= 1e6;
		algbw = (double)bytes / (mean * 1e3);
		if (csv)
			printf("%zu,%zu,%s,%d,%ld,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f,%lld\n",
			       bytes, count, coll_names[c], nranks, iters, mean,
			       mean, med, p99, tmin, algbw, algbw * factor,
			       (double)bytes / (med * 1e3) * factor, wsum);
		else
			printf(" %11zu %13zu %10.2f %10.2f %10.2f %10.2f %8.3f %8.3f %8.3f %7lld\n",
			       bytes, count, mean, med, p99, tmin, algbw,
			       algbw * factor,
			       (double)bytes / (med * 1e3) * factor, wsum);
		fflush(stdout);
	}
	free(sbuf);
	free(rbuf);
	free(t);
	free(d);
	free(sizes);
	MPI_Finalize();
	return 0;
}
