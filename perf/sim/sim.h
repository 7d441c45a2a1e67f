/* SPDX-License-Identifier: MIT */
/*
 * sim.h - the discrete-event simulator of the library's own schedules
 * (issue 22): the library's real communicators, algorithms and messages,
 * every rank of a job in this one process (fr_comm_create_local), over the
 * in-process transport of the tests (tests/fake_tp.c) run in virtual time:
 * each write lands when a model of the network says (net.c), and one
 * thread drives the ranks as the events come (run.c).  perf/sim/README.md
 * says what it models and what not yet.
 *
 * Layer: a tool above the library; it calls the public API, the internal
 * fr_comm_create_local / fr_comm_destroy_local, and the fake transport.
 */
#ifndef FR_SIM_H
#define FR_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fake_tp.h"
#include "fastreduce.h"

/* ---- the network (net.c) -------------------------------------------- */

/*
 * A star: nodes of ranks_per_node consecutive ranks, each node's one
 * full-duplex link (link_gbps each way) to a switch that never blocks.  A
 * write between nodes takes its sender node's link for len / bandwidth,
 * reaches the receiving node's link link_lat_ns later and takes that for
 * as long (cut-through: both links are held in FIFO order, the receiving
 * one from when the first bit can arrive); it lands when its last bit
 * is in.  A write within a node is a copy at shm_gbps by the sender
 * (one at a time per rank), landing shm_lat_ns after it ends.  Every
 * write costs overhead_bytes more than its payload (headers).
 */
struct sim_net_params {
	int nranks;
	int ranks_per_node;
	double link_gbps;
	double link_lat_ns;
	double shm_gbps;
	double shm_lat_ns;
	unsigned int overhead_bytes;
};

struct sim_net {
	struct sim_net_params p;
	int nnodes;
	uint64_t *tx_free, *rx_free; /* per node: when its link is free */
	uint64_t *copy_free;	     /* per rank: when its copies are done */
	uint64_t bytes_between, bytes_within, writes;
};

/* 0, FR_EINVAL (a parameter out of range, with a message in err) or
 * FR_ENOMEM. */
int sim_net_init(struct sim_net *net, const struct sim_net_params *p, char *err,
		 size_t errlen);
void sim_net_fini(struct sim_net *net);
/* Every link idle again (a new experiment), the counters kept. */
void sim_net_reset(struct sim_net *net);
/* When a write of len bytes posted at now from rank `from` to rank `to`
 * lands; the links it uses are taken until then. */
uint64_t sim_net_due(struct sim_net *net, uint64_t now, int from, int to,
		     size_t len);

/* ---- the job and its driver (run.c) ---------------------------------- */

struct sim_event {
	uint64_t due, seq;
	int rank; /* the writer, whose poll lands it */
};

struct sim {
	struct fake_clock clk; /* first: the fake's callbacks find sim */
	unsigned int flags;    /* SIM_* */
	struct sim_net net;
	int n;
	fr_comm_t **comms;
	/* writes in flight, by due time (a binary heap; seq breaks ties, so
	 * a run is repeatable) */
	struct sim_event *ev;
	size_t nev, capev;
	uint64_t seq;
	/* ranks with something to poll, in the order they got it */
	int *runq;
	size_t rq_head, rq_count;
	bool *queued;
	uint64_t events; /* what a run cost, for the report */
	bool ev_nomem;	 /* an event found no memory: the run fails */
	char err[256];
};

/*
 * Sizes only: no reduction computes and of each write only its first
 * SIM_COPY_MAX bytes land (the headers and keys the schedules read), so
 * the ranks' buffers may all be one, untouched past those bytes: what
 * makes large sizes on many ranks fit in memory and time.  The results
 * are then meaningless; the times are the same as with data (a schedule
 * never looks at its data to decide what to send).
 */
#define SIM_SIZES_ONLY 0x1
#define SIM_COPY_MAX 4096

/*
 * A job of p->nranks ranks over the network p, its communicators made from
 * cfg (NULL: defaults) with the transport set to the fake and the peer
 * timeout to a day (a simulation's real time says nothing of its ranks'
 * health); flags: SIM_*.  0, or an error with its message in s->err.
 */
int sim_open(struct sim *s, const struct sim_net_params *p,
	     const fr_config_t *cfg, unsigned int flags);
void sim_close(struct sim *s);

/*
 * One All-Reduce on every rank (bufs[r]: rank r's count elements, in
 * place), driven in virtual time until every rank has finished; *ns: from
 * its start to the slowest rank's end.  0, the first rank's error, or
 * FR_ETIMEDOUT when the ranks stalled with nothing in flight (the
 * schedule waits for a message nobody sends), with s->err saying so;
 * after an error the job is good for sim_close only.  One job at a time
 * (the fake transport's clock is the process's).
 */
int sim_allreduce(struct sim *s, void **bufs, size_t count, fr_dtype_t dt,
		  fr_op_t op, uint64_t *ns);

#endif
