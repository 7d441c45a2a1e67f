/* SPDX-License-Identifier: MIT */
/*
 * share.h - the shared endpoint's own declarations: its links, views and
 * connections (fr_share.c says what each is for), and what its files call
 * of each other.  They call downward only:
 *
 *   fr_share.c    the design; the view's operations (the interface of
 *                 transport.h that each communicator sees) and the
 *                 endpoint's (fr_share_new, fr_share_view, ids), which call
 *   share_link.c  the real endpoint under its lock: the links to each rank
 *                 (connecting, failing), the completions' routing to the
 *                 views' queues, and what waits for a view or connection
 *
 * Both sit on the transport interface (transport.h) and nothing else of
 * the library but its utilities and logging.
 */
#ifndef FR_SHARE_H
#define FR_SHARE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define SHR_BATCH 64
/* how long the higher rank of a link waits for the lower to connect */
#define SHR_GRACE_MS 300
/* completions kept for ids with no view yet, at most */
#define SHR_UNCLAIMED_MAX 65536

enum { ID_FREE, ID_LIVE, ID_QUARANTINE };

struct shr_link {
	struct fr_tp_conn *out, *in; /* we opened / it opened */
	bool out_up, in_up;
	struct fr_tp_conn *send; /* the first up: our writes take it */
	int err;		 /* dead: the error */
	uint64_t want_ms;	 /* a view first asked for it (0: none) */
	bool busy;		 /* a handshake in progress (in s->busy) */
};

struct shr_held {
	struct shr_held *next;
	int id, wpeer;
	struct fr_tp_cqe cqe;
};

struct shr_view;

/* Memory a region kept registered lives in, released at the close. */
struct shr_kept {
	struct shr_kept *next;
	void *buf;
	size_t len;
	void (*release)(void *buf, size_t len);
};

struct shr_conn {
	struct shr_view *v;
	int peer, wpeer;
	int user_out; /* writes from the caller's memory not completed */
	bool up;      /* connect_done() said so: completions flow from then */
	bool err_out; /* a dead link's error completion reached the caller */
};

struct shr_view {
	struct fr_share *s;
	int id; /* -1 until set */
	int n;
	int *members;		 /* [n]: endpoint rank of each rank */
	int *crank;		 /* [s->nranks]: our rank of it, or -1 */
	struct shr_conn **conns; /* [n] */
	struct fr_tp_cqe *q;	 /* completions for it, a ring */
	unsigned qcap, qhead, qlen;
	struct shr_held *held, *held_tail; /* from peers not yet connected */
	atomic_int nheld; /* entries of held: pending() reads it unlocked */
	atomic_bool woken;
	bool closing, quarantine;
	/* the endpoint's first view (fr_share_new), the only one with lines,
	 * ever: a later view that takes id 0 after it closed would find its
	 * numbers in the connections' lines */
	bool lines;
	struct shr_view *next; /* s->views */
};

struct fr_share {
	const struct fr_tp_ops *ops;
	struct fr_tp *tp;
	int rank, nranks;
	struct fr_tp_ops view_ops; /* the real one's name and options */
	/* [nranks]: zeroed pages that an entry takes once written; a rank
	 * of a large job links to few of the others (links_len bytes) */
	struct shr_link *links;
	size_t links_len;
	/* the ranks' addresses, packed: rank w's are addrs[addr_off[w] ..
	 * addr_off[w + 1]) (a large job's would be 128 bytes a rank each
	 * in every rank otherwise) */
	uint8_t *addrs;
	uint32_t *addr_off;
	int *busy, nbusy; /* links with a handshake in progress */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_int nviews;
	bool in_wait; /* a view's thread sleeps in the real wait() */
	struct shr_view *waiter;
	struct shr_view *ids[FR_SHARE_IDS];
	uint8_t idstate[FR_SHARE_IDS];
	struct shr_view *views;
	struct shr_held *unclaimed, *unclaimed_tail;
	int nunclaimed;
	bool warned;
	struct fr_tp_mr **zombies;
	int nzombies, zcap;
	struct shr_kept *kept;
};

static inline struct shr_view *V(struct fr_tp *tp)
{
	return (struct shr_view *)tp;
}

static inline struct shr_conn *C(struct fr_tp_conn *c)
{
	return (struct shr_conn *)c;
}

/* share_link.c */
/* Take the endpoint: with more than one view, the mutex, and no thread
 * inside the real wait(); true if the mutex was taken (for
 * shr_leave). */
bool shr_enter(struct fr_share *s);
void shr_leave(struct fr_share *s, bool locked);
/* Completions held for a view from a peer it has no connection to yet:
 * keep h, hand those of its rank q to its queue, free a list. */
void shr_held_hold(struct shr_view *v, struct shr_held *h);
void shr_held_release(struct shr_view *v, int q);
void shr_held_free(struct shr_held *h);
/* The link to endpoint rank w failed with err: every view's connection
 * over it learns it. */
void shr_link_fail(struct fr_share *s, int w, int err);
/* The link to endpoint rank w, connected on first use: 0 once up,
 * FR_EAGAIN while coming up, or its error. */
int shr_link_need(struct fr_share *s, int w);
/* Poll the real endpoint once and hand out what came: how many, or its
 * error; me's straight to out (up to max, *nout so far) while nothing of
 * its is queued before them, the rest to their views' queues. */
int shr_drain(struct fr_share *s, struct shr_view *me, struct fr_tp_cqe *out,
	      int max, int *nout);

#endif
