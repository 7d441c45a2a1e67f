/* SPDX-License-Identifier: MIT */
/*
 * fake_tp.h - an in-process transport ("fake") for the unit tests of the
 * engine and the peer layer (test_peer.c, test_engine.c), and a job of N
 * communicators in one process built on it.
 *
 * The fake implements struct fr_tp_ops (src/transport.h) between endpoints
 * of this process only: an address blob names an endpoint, a write is a
 * memcpy into the peer's registered region, completions wait in a queue per
 * endpoint.  Writes leave their connection's send queue (sq_depth deep, so
 * FR_EAGAIN is real back-pressure) when the writing endpoint polls: the
 * receiver then gets FR_CQE_RECV with the immediate and length, the writer
 * FR_CQE_SEND (none for write_inline, whose bytes are copied into the queue
 * at once; fake_tp_inline() makes it refuse some or all).  One process-wide lock makes it safe for a thread per
 * endpoint (blocking collectives, the progress thread); wait() sleeps on an
 * eventfd that deliveries, accept() and wake() write.
 *
 * The tests address endpoints by rank (the most recently opened live
 * endpoint of that rank), never through struct fr_comm, and can:
 *   - count connections and writes (by immediate type) per pair of ranks,
 *     and read back the first bytes of every mailbox message written;
 *   - kill an endpoint (every connection to it fails with FR_EPEER, later
 *     connections to it are never answered), break one connection, freeze
 *     an endpoint (a hung process: its poll returns nothing, its writes do
 *     not leave), refuse connections to an endpoint;
 *   - drop, corrupt or misdirect (out of its region's bounds) one write.
 * What it mirrors of TCP: a write outside the receiver's registered memory
 * fails the receiver's end with FR_ERANGE and the writer's with FR_EPEER
 * (the receiver closed it); a connection whose address has no endpoint (or
 * a frozen one) is retried until the endpoint's timeout, then
 * FR_ETIMEDOUT; wrong nonce FR_EAUTH, a second live connection from the
 * same rank FR_EBUSY; incoming connections wait for accept() and are listed
 * by pending(); last_error() names the peer rank.
 */
#ifndef FR_TESTS_FAKE_TP_H
#define FR_TESTS_FAKE_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"
#include "transport.h"

/* Highest rank the counters keep track of (plus one). */
#define FAKE_MAX_RANKS 16

extern const struct fr_tp_ops fake_tp_ops;

/* Register "fake" with the library's transport table (once; idempotent). */
void fake_tp_install(void);
/* Clear counters, the write log and every fault; live endpoints stay. */
void fake_tp_reset(void);
/* write_inline (the small-message path, FR_LL): 1 takes every one (the
 * default, and after fake_tp_reset), 0 refuses every one with FR_EAGAIN,
 * 2 every other one (the caller then sends by write_imm). */
void fake_tp_inline(int mode);
/* Endpoints open now (0 after every communicator is destroyed). */
int fake_tp_endpoints(void);

/* ---- counters -------------------------------------------------------- */

/* Connections from rank a's endpoint to rank b's that were established
 * (data and liveness alike). */
int fake_tp_connects(int a, int b);
/* Established connections in all, since the last reset. */
int fake_tp_connects_total(void);
/* Writes posted from rank `from` to rank `to` whose immediate's top nibble
 * is imm_type (-1: any from, any to, any type). */
uint64_t fake_tp_writes(int from, int to, int imm_type);
/* Writes posted from `from` to `to` with exactly this immediate. */
uint64_t fake_tp_writes_imm(int from, int to, uint32_t imm);
/* The k-th write (in posting order) from `from` to `to` with exactly this
 * immediate: its first bytes (a mailbox message's header), up to max; the
 * number of bytes copied, or -1 when there is no such write. */
int fake_tp_write_head(int from, int to, uint32_t imm, int k, uint8_t *buf,
		       size_t max);
/* The immediates of the writes from `from` to `to` whose top nibble is
 * imm_type, in posting order, up to max; returns how many there were. */
size_t fake_tp_imms(int from, int to, int imm_type, uint32_t *imms, size_t max);

/* ---- faults ---------------------------------------------------------- */

/* Rank's endpoint dies: every connection to it fails on both ends with
 * FR_EPEER; connections to it are never answered again. */
void fake_tp_kill(int rank);
/* The connection(s) between ranks a and b fail on both ends (FR_EPEER). */
void fake_tp_break(int a, int b);
/* A hung process: while frozen, rank's poll() returns nothing and its
 * writes do not leave; writes to it still land (and wait in its queue). */
void fake_tp_freeze(int rank, bool on);
/* Connections to rank fail at connect_done() with err (0: accept again). */
void fake_tp_refuse(int rank, int err);

enum fake_fault {
	FAKE_DROP,    /* lost: the writer's SEND succeeds, nothing lands */
	FAKE_CORRUPT, /* lands, then byte `offset` of it is xor'ed with xor */
	FAKE_OOB,     /* aimed past the end of its region: FR_ERANGE */
};
/* Arm a one-shot fault for a write from `from` to `to` whose immediate's
 * top nibble is imm_type and that carries more than `offset` bytes (any
 * length for FAKE_DROP); the first `skip` such writes pass untouched. */
void fake_tp_fault(int from, int to, int imm_type, int skip,
		   enum fake_fault kind, size_t offset, uint8_t xor_mask);
/* Has the armed fault fired? */
bool fake_tp_fault_fired(void);

/* ---- virtual time: the simulator's (perf/sim) ------------------------- */

/*
 * With a clock, the fake runs in the clock's time, for one thread that
 * drives every endpoint itself (the simulator): a write posted from rank
 * `from` to rank `to` asks due() when it lands (at or after now, in order
 * on its connection: one never overtakes the one before) and waits in
 * its send queue until the clock's owner has moved now there and polled
 * the writer; ready() says which endpoint has something to poll (a
 * completion, a connection to accept), in place of the eventfd, which is
 * then neither written nor read (wait() must not be called).  The write
 * log is not kept (fake_tp_write_head, fake_tp_imms see nothing).
 */
struct fake_clock {
	uint64_t now; /* ns, moved forward by the owner only */
	/* 0: a write's bytes all land; else only its first copy_max (a
	 * simulation of sizes without their data: the messages' headers
	 * and keys must still arrive) */
	size_t copy_max;
	uint64_t (*due)(struct fake_clock *clk, int from, int to, size_t len);
	void (*ready)(struct fake_clock *clk, int rank);
};
/* Set the clock (NULL: none, the default: writes land at once) while no
 * endpoint is open; clearing it is safe at any time (what waits for its
 * time then lands at the writer's next poll). */
void fake_tp_clock(struct fake_clock *clk);

/* ---- a job of communicators in this process -------------------------- */

/*
 * Create n communicators over "fake" with fr_comm_create(), one thread per
 * rank and a rendezvous on a free loopback port, from the template cfg
 * (rank, nranks, rendezvous and transport are set here; NULL: defaults
 * with a 20 s timeout).  0, or the first error (with its message in err).
 */
int fake_job_create(int n, const fr_config_t *cfg, fr_comm_t **comms, char *err,
		    size_t errlen);
/*
 * Drive requests from this thread, deterministically: round after round,
 * fr_progress() on each of comms[0..ncomms) (so that ranks without a
 * request still serve the others; NULL entries are skipped) and fr_test()
 * on each request still in reqs[0..nreq) (NULL: done), until all are done
 * or deadline_ms passes.  rcs[i] gets request i's result (unchanged for one
 * not finished).  0, or FR_ETIMEDOUT when the deadline came first.
 */
int fake_job_drive(fr_comm_t **comms, int ncomms, fr_request_t **reqs, int *rcs,
		   int nreq, int deadline_ms);
/* Destroy them, one thread each (so that their BYEs cross); NULL entries
 * are skipped and every entry is set to NULL. */
void fake_job_destroy(int n, fr_comm_t **comms);

#endif
