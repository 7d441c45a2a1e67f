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
#include "peer.h" /* enum fr_coll */
#include "reduce.h"

/* ---- the network (net.c) -------------------------------------------- */

/*
 * Nodes of ranks_per_node consecutive ranks, joined by one of three
 * topologies:
 *
 * - SIM_STAR: each node's one full-duplex link (link_gbps each way) to a
 *   switch that never blocks.
 * - SIM_FAT_TREE: the same node links to leaf switches, and levels of
 *   switches above them.  Level l (0: the leaves) groups fanout[l] units
 *   of the level below (nodes for l = 0) and has one full-duplex uplink
 *   of their bandwidth / oversub[l] (1: non-blocking).  A core that never
 *   blocks joins the top level's groups.  A write climbs only as high as
 *   the two nodes' first common group.
 * - SIM_TORUS: the nodes on a grid of ndims dimensions (dims[0] the
 *   fastest-varying: node = x + dims[0] (y + dims[1] z)), each linked to
 *   its two neighbours in every dimension, wrapping around, by a channel
 *   of link_gbps each way.  A write goes dimension by dimension (x first),
 *   each the shorter way round (+ on a tie); a node has no link of its
 *   own besides its channels.
 *
 * Every link is a FIFO.  A write takes each link on its path in turn,
 * cut-through: it can start on a link hop_lat_ns after it started on the
 * one before (link_lat_ns for the star's and fat tree's last link, the
 * node's own), once that link is free, and ends there no sooner than its
 * serialization at that link's rate, nor before it ended on the link
 * before plus that latency.  The link is busy with it for its
 * serialization at the link's own rate: a faster link fed by a slower
 * one (an uplink) carries several writes at once, as their packets would
 * share it.  It lands when it ends on the last link (the
 * torus adds link_lat_ns then, its ends' cost).  So the latency between
 * two nodes is link_lat_ns plus hop_lat_ns for each link between their
 * own (each switch level climbed and descended; each torus hop after
 * the first).
 *
 * A write within a node is a copy at shm_gbps by the sender (one at a
 * time per rank), landing shm_lat_ns after it ends.  Every write costs
 * overhead_bytes more than its payload (headers).
 */
enum sim_topo { SIM_STAR, SIM_FAT_TREE, SIM_TORUS };
#define SIM_MAX_LEVELS 4
#define SIM_MAX_DIMS 3

struct sim_net_params {
	int nranks;
	int ranks_per_node;
	double link_gbps;
	double link_lat_ns;
	double shm_gbps;
	double shm_lat_ns;
	unsigned int overhead_bytes;
	enum sim_topo topo;
	double hop_lat_ns;
	int levels; /* SIM_FAT_TREE */
	int fanout[SIM_MAX_LEVELS];
	double oversub[SIM_MAX_LEVELS];
	int ndims; /* SIM_TORUS */
	int dims[SIM_MAX_DIMS];
};

struct sim_link {
	uint64_t free; /* when it can take the next write */
	double gbps;
};

struct sim_net {
	struct sim_net_params p;
	int nnodes;
	/* the star's and fat tree's: node a's sending link is links[a], its
	 * receiving one links[nnodes + a]; a fat tree's level l group g has
	 * its uplink's two directions at up[l] + 2g (up) and + 1 (down).
	 * The torus's: node a's channel in dimension d, direction dir (0:
	 * +), at links[(a * ndims + d) * 2 + dir]. */
	struct sim_link *links;
	int nlinks;
	int up[SIM_MAX_LEVELS];
	int group[SIM_MAX_LEVELS]; /* nodes in a level's group */
	uint64_t *copy_free;	   /* per rank: when its copies are done */
	uint64_t bytes_between, bytes_within, writes, writes_within;
	uint64_t link_writes; /* a write's links, summed: its hops */
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
/* The time of a copy of len bytes within a node (its headers too). */
uint64_t sim_net_copy_ns(const struct sim_net *net, size_t len);
/* Whether ranks a and b share a node (a write between them is a copy). */
static inline bool sim_net_same_node(const struct sim_net *net, int a, int b)
{
	return a / net->p.ranks_per_node == b / net->p.ranks_per_node;
}
/* "star", "fat tree 16:1,8:2" or "torus 8x8x4": the topology in words */
void sim_net_describe(const struct sim_net_params *p, char *buf, size_t len);

/* ---- the CPU (run.c) ------------------------------------------------- */

/*
 * Each rank's CPU does one thing at a time: cpu_free[r], in virtual time,
 * says when it is next free.  What takes its time:
 *   - a reduction: the bytes it makes at reduce_GBps (gigabytes/s);
 *   - a write to another node: send_ns plus its bytes at send_GBps; one
 *     from another node: recv_ns plus its bytes at recv_GBps.  A write
 *     streams, as over TCP: its first SIM_CHUNK bytes leave once the
 *     sender has made them, the rest while it makes them, and the
 *     receiver takes each chunk in as it lands, so that a large write
 *     costs the slowest of the three (sender, wire, receiver) and not
 *     their sum;
 *   - a write within the node: the copy (the network's, at shm_gbps) is
 *     the sender's own work.
 *   - waking up: wake_ns when a write lands for a rank whose CPU has been
 *     idle for more than spin_ns (it stopped polling and slept).
 *   - an emulated network's delay line (netns-lab's nfq_delay: a process
 *     on each host that holds every packet coming in and lets it go after
 *     the delay): dl_ns of a core's work per write from another node (one
 *     that joined a stream comes with the write before it), and its
 *     bytes at dl_GBps (each packet goes through the line, and so do the
 *     ACKs, whose work is counted with the data's), one write at a time
 *     for each node, before its receiver can take it in.  With dl_ns
 *     alone the line holds the whole write back by its work, from when
 *     it is due; with dl_GBps the line works on a stream's packets as
 *     they land, from its first bytes, and lets the write go no sooner
 *     than its last chunk's work after it is all in; the receiver takes
 *     each chunk in once the line has let it go.  A write that comes
 *     while its line is still at work on those before it costs
 *     dl_busy_ns instead of dl_ns, where given (> 0): the line takes
 *     the packets that queued meanwhile in one batch, each for less than
 *     a lone one's wake-up and read.  On an idle host the
 *     per-write work is part of the latency measured (give the wire that
 *     much less); on a busy one the delay lines wait for cores like the
 *     ranks (a line sleeps between packets: it holds no core after its
 *     work).
 * A rank acts on what has landed once its CPU is free, and what it posts
 * leaves at its CPU's time.  A rate of 0 costs nothing; all zero, the
 * default, is no CPU model at all: a rank runs in no time, and its copies
 * within the node overlap its other work.  Not counted yet: the copies
 * an algorithm makes itself, AVG's division, compression.
 *
 * Cores: 0, a CPU for each rank.  Else the ranks share that many cores,
 * each node's own, or with cores_job the whole job's (all its nodes
 * emulated on one host: network namespaces, loopback).  Work takes the
 * cores' free time from when it can start: the first gap of whichever
 * core, as much as it needs, then the next (a core taken up to a later
 * time lends the time before to work that comes later, as time slices
 * do; what was put there first keeps its time).  A rank spins
 * on its core for spin_ns after its work, waiting for more, as the
 * library polls before it sleeps: the core is nobody else's meanwhile,
 * unless SIM_CHUNK bytes or more from other nodes are on their way to the
 * spinner, which will work on them rather than sleep (run.c,
 * cpu_take_from, says why).  With spin_holds, that exception is off: the
 * spinner holds its core through its spin, whatever is on its way, and
 * works on its own core what lands meanwhile, as under a shaped link,
 * where a stream's chunks come in with gaps that the spinner burns
 * (perf/sim/README.md, "The delay line's work per byte, and a spinner's
 * core").
 */
#define SIM_CHUNK 65536 /* a stream's unit of work: a socket read's */
/*
 * A write to a peer that an earlier one to it is still on its way to
 * joins its stream: it leaves in the same call (the TCP transport sends
 * what is queued in one sendmsg() and reads what has come in one readv()),
 * so neither side pays send_ns or recv_ns for it.  Each rank remembers
 * SIM_STREAMS peers' streams (by peer, modulo): a job of more peers than
 * that at once pays for some calls it would not.
 */
#define SIM_STREAMS 8
struct sim_stream {
	int to;	      /* + 1: 0 is none */
	uint64_t due; /* its last write lands then */
};

struct sim_cpu_params {
	double reduce_GBps;
	double send_ns, send_GBps;
	double recv_ns, recv_GBps;
	double wake_ns, spin_ns;
	int cores;
	bool cores_job;
	bool spin_holds; /* (above) */
	double dl_ns;	/* the delay line's work per write (above) */
	double dl_busy_ns; /* a write that finds its line busy; 0: dl_ns */
	double dl_GBps; /* and the bytes it lets through per ns */
};

/* ---- the job and its driver (run.c) ---------------------------------- */

struct sim_event {
	uint64_t due, seq;
	uint64_t span; /* a stream's: its bytes before the last chunk land
			* over this long before due (CPU model only) */
	bool joined;   /* joined a stream: no call of its own (CPU model) */
	int rank; /* the writer, whose poll lands it */
	int to;	  /* its receiver, whose CPU takes it in */
	size_t len;
};

/* A core's work booked from some time back on (run.c, core_take): its
 * spans (start, end, the rank or -1 for a delay line), by start, and
 * the end of those dropped as too old, before which nothing is put. */
struct sim_busy {
	uint64_t start, end;
	int rank;
};

struct sim_core {
	struct sim_busy *busy;
	size_t n, cap;
	uint64_t floor;
	uint64_t longest; /* the longest span yet, with a spin after it */
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
	/* the CPU model: on when any of cpu's terms costs something */
	struct sim_cpu_params cpu;
	bool cpu_on;
	uint64_t *cpu_free;  /* per rank */
	/* cores: per pool (node or job), cpu.cores each: the work booked
	 * on each, in order (its spinner may hold it longer: run.c,
	 * cpu_take_from) */
	struct sim_core *cores;
	size_t ncores;
	int *rank_core;	   /* the core each rank last worked on, in its pool */
	struct sim_stream *streams; /* SIM_STREAMS per rank (CPU model) */
	size_t *inflight;  /* bytes on their way to each rank (shared cores) */
	uint64_t *dl_free; /* each node's delay line: free from (above) */
	uint64_t dl_work;  /* the delay lines' work so far, for the report */
	int cur;	   /* the rank running now, whose CPU reduces */
	fr_reduce_fn real; /* the collective's kernel, under the hook */
	size_t esize;
	uint64_t events; /* what a run cost, for the report */
	bool ev_nomem;	 /* an event found no memory: the run fails */
	/* while set, every sim_collective_calls (with the CPU model): rank
	 * r starts its first call stagger_ns * r after the common start,
	 * and the first `untimed` calls are left out of its median */
	uint64_t stagger_ns;
	int untimed;
	/* and every rank but 0 starts its first call lead_ns late (the
	 * rendezvous: rank 0 answers every rank at once, and its answers
	 * take a latency to arrive) */
	uint64_t lead_ns;
	/* a barrier (fr_ibarrier) before every timed call, outside the
	 * calls' times, as fr_allreduce_perf --barrier (but a first timed
	 * call from the common start: no untimed calls) */
	bool barrier;
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
 * A job of p->nranks ranks over the network p, with the CPUs cpu (NULL: no
 * CPU model), its communicators made from cfg (NULL: defaults) with the
 * transport set to the fake and the peer timeout to a day (a simulation's
 * real time says nothing of its ranks' health); flags: SIM_*.  0, or an
 * error with its message in s->err.
 *
 * The cost model of every rank is told the network and the CPUs as
 * fr_tune would measure them: alpha the latency between two nodes plus
 * a message's send and receive work, beta the wire's and the CPUs' time
 * per byte, gamma the reduction's (0 without the CPU model's reduce
 * rate), local_alpha_us and local_beta_ns a write within a node
 * (shm_lat_ns, shm_gbps), copy_ns 0 (the algorithms' own copies are not
 * charged, above).
 */
int sim_open(struct sim *s, const struct sim_net_params *p,
	     const struct sim_cpu_params *cpu, const fr_config_t *cfg,
	     unsigned int flags);
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
/*
 * The same for any of FR_COLL_ALLREDUCE, FR_COLL_REDUCE_SCATTER and
 * FR_COLL_ALLGATHER, in place: for the last two bufs[r] holds the n
 * blocks of count elements (rank r's own at r count), the reduce-scatter
 * leaving its result there, the all-gather sending it from there.
 */
int sim_collective(struct sim *s, enum fr_coll coll, void **bufs, size_t count,
		   fr_dtype_t dt, fr_op_t op, uint64_t *ns);

/*
 * The same, `calls` times back to back, as a benchmark loop runs it
 * (fr_allreduce_perf): each rank starts its next call when it is done with
 * the one before, no barrier between (but with s->barrier, below).  *ns
 * is then what fr_allreduce_perf --stat median reports: per call the
 * slowest rank's time (from its end of the call before, or the start),
 * the median over the calls.  Pipelined schedules overlap consecutive
 * calls (the ring's ranks do not wait for the last of the call before),
 * and a rank late into one call makes its partners wait in the next: one
 * call from a common start shows neither.  Before each call after the
 * first, refill(arg, r, bufs[r]) (if not NULL) gives rank r its data
 * again, as a training step writes new gradients.
 *
 * A job's ranks never start together (they are launched one after
 * another): with s->stagger_ns, rank r starts r * stagger_ns late, and
 * the first s->untimed calls (a benchmark's warm-up and its line-up)
 * carry that into the timed ones as the schedule does.  In a symmetric
 * exchange (recursive doubling) two ranks a latency or more apart stay
 * apart: each waits in every other call, and per call the slowest rank
 * takes a round trip where the calls average one way.  With
 * s->lead_ns, every rank but 0 also starts that much late.
 *
 * With s->barrier, each rank enters a barrier before each timed call but
 * a first one from the common start (the untimed calls run back to back,
 * as the tool's warm-up and line-up do), and the call's time starts when
 * it leaves the barrier.  A barrier orders the ranks but does not line
 * them up under delay: two ranks that enter a latency apart leave a
 * latency apart, the other way round.
 */
int sim_collective_calls(struct sim *s, enum fr_coll coll, void **bufs,
			 size_t count, fr_dtype_t dt, fr_op_t op, int calls,
			 void (*refill)(void *arg, int r, void *buf), void *arg,
			 uint64_t *ns);

#endif
