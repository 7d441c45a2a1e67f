/* SPDX-License-Identifier: MIT */
/*
 * fr_shm.c - the shared-memory transport: write-with-immediate between
 * processes of one node.  This file: the design, the wire format, the
 * interface and the progress pass; shm_conn.c: connections (listening, the
 * handshake that hands over the segment, retries, deadlines); shm_data.c:
 * the rings; shm.h: the layout and who calls what.
 *
 * Design
 *   - Each connection owns a shared segment (a memfd, never a name in
 *     /dev/shm, so nothing can leak, not even after kill -9) holding two
 *     single-producer single-consumer rings of fixed slots, one per
 *     direction.  The connector creates it and hands the file descriptor to
 *     the acceptor with its hello, over an AF_UNIX SOCK_SEQPACKET socket in
 *     the abstract namespace.  The socket then serves only to wake a
 *     sleeping peer and to learn that the peer died: the kernel closes it
 *     with the process, and the survivor reads EOF.
 *   - A write of fewer than cma_bytes (FR_SHM_CMA_BYTES, default 4 MiB)
 *     travels through the ring in fragments of up to SHM_SLOT_DATA bytes;
 *     the receiver checks each fragment against its region table and copies
 *     it into place when it polls (two copies, no system call: this is the
 *     latency path).  A larger write travels as one PULL slot that names
 *     the source in the writer's address space; the receiver checks the
 *     whole write against its region table when it reaches the slot and
 *     then copies the bytes itself by cross-memory attach
 *     (process_vm_readv: one copy, by the kernel).  The receiver pulls
 *     rather than the writer pushing (process_vm_writev) so that the only
 *     process that ever writes into a region is its owner, right after
 *     checking that the region is still registered: a late write from a
 *     writer that has not yet heard that the region went away (a failed
 *     communicator dropped its registrations, the application freed or
 *     reused the memory) is refused, it cannot land in memory that now
 *     serves something else.
 *   - Pulling needs the receiver to be allowed to attach to the writer
 *     (ptrace rules).  The receiver probes it once per connection, by
 *     reading back through cross-memory attach a word the writer left in
 *     the ring header (the ring's address in the writer's process), and
 *     grants pulls by setting pull_ok in that header; until the grant, or
 *     for good where the kernel refuses (Yama, another PID namespace),
 *     large writes go through the ring in fragments.
 *   - Sends are queued (sq_depth descriptors pointing at the caller's
 *     memory) and pushed into the ring as it has room.  A SEND completion
 *     comes when the last fragment is in the ring, or for a PULL slot when
 *     the receiver has moved its head past the slot (it has read the
 *     source: only then may it be reused); a RECV completion when the
 *     receiver has placed the last byte.  Later writes may be pushed behind
 *     a pull still pending, but completions are retired in order: slots go
 *     in order, so completions are FIFO on both sides.
 *   - A side that closes or fails a connection first sets "closed" in its
 *     ring header: its application may free a source that a pull has not
 *     read yet, and a receiver that sees the flag after a pull fails the
 *     connection instead of completing the write (see shm_pull()).
 *   - Lines (transport.h, line_put; shm_data.c): four lines in the
 *     segment, two per direction, by the parity of their numbers, for a
 *     collective that goes whole in one message to each peer.  The writer
 *     copies the bytes and their count, then stores the number (release);
 *     the reader polls the number in the line itself.  No slot, no region
 *     check (the line is the connection's, not the application's memory),
 *     no completion.  A failed connection keeps its segment mapped until
 *     it is freed: a line the peer put before it left is still read.
 *   - Idle: wait() sets this side's "sleeping" flag in every segment, checks
 *     the rings (and a line a get waits for) once more and sleeps in
 *     epoll (the sockets, the listener and the wake eventfd).  A producer
 *     that publishes a slot or a line, or a consumer that frees a slot,
 *     reads the peer's flag after a full fence and sends one
 *     byte on the socket if it is set (a Dekker pair: either the sleeper
 *     sees the slot or the producer sees the flag).  No core spins while
 *     nothing arrives.
 *
 * Wire format (host byte order: both ends are on one machine)
 *
 *   hello, connector -> acceptor, one SEQPACKET message of 24 bytes with
 *   the segment's descriptor attached (SCM_RIGHTS):
 *      0 u32 magic "FSHM"   4 u16 version (5)   6 u16 kind (1 = hello)
 *      8 i32 connector's rank   12 u32 segment bytes   16 u64 job nonce
 *   reply, acceptor -> connector, 12 bytes:
 *      0 u32 magic   4 u16 version   6 u16 kind (2 = reply)   8 i32 status
 *      (0, FR_EPROTO, FR_EAUTH wrong nonce, FR_EBUSY rank already connected)
 *   afterwards only 1-byte wake messages.
 *
 *   segment: u32 connector asleep, u32 acceptor asleep (each in its own
 *      cache line), then four lines of 256 bytes, the connector's two
 *      (even, odd numbers) and the acceptor's, each u64 number, u32 byte
 *      count, u32 0, then up to 240 bytes; then ring[0] (connector ->
 *      acceptor) and ring[1].
 *   ring header, one cache line each: u64 head (consumer); u64 the
 *      ring's address in the producer's process and u32 closed
 *      (producer); u32 pull_ok (consumer); then 64 slots.
 *   slot (SHM_SLOT_BYTES): u64 seq, u32 imm, u32 flags (FIRST 1, LAST 2,
 *      PULL 4, INLINE 8; an INLINE slot's byte count in bits 16-23), u32
 *      region id, u32 generation, u64 offset of this fragment in the
 *      region, then at 32 either u32 fragment bytes, u32 total bytes of the
 *      write, u64 source address in the writer's process (PULL only), or an
 *      INLINE slot's bytes (up to 32), then from 64 the payload.  seq is
 *      written last: the slot's index in the ring (counting every slot ever
 *      produced) plus one, so the consumer of index i waits for
 *      seq == i + 1 (the ring starts zeroed).  A PULL slot is FIRST | LAST
 *      with no payload: the receiver reads total bytes from the source.  An
 *      INLINE slot (write_inline) is FIRST | LAST and carries the whole
 *      write in the slot's first cache line, with seq: the consumer's one
 *      miss brings it all (the low-latency path of small messages).
 *   address blob (SHM_ADDR_LEN): u8 magic 0xfd, u8 version, u16 0, u32 0,
 *      u64 node id (boot id + network namespace, or FR_NODE), then the
 *      abstract socket name (SHM_NAME_LEN bytes).
 *   remote key blob, 28 bytes: u8 magic 0xfe, u8 version, u16 0, u32
 *      region id, u32 generation, u64 region length, u64 region address
 *      (unused since pulls replaced pushes; kept for the layout).
 *      Unpacked as a = length, b = address, c = id, d = generation.
 *
 * The receiver is the authority on its regions, as in the TCP transport: a
 * fragment outside a registered region (unknown id, stale generation, no
 * remote-write access, past the end) fails the connection with FR_ERANGE
 * before a byte is copied.  A pulled write is checked the same way, as a
 * whole and again before every chunk, at the moment the receiver copies
 * it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "fastreduce.h"
#include "log.h"
#include "shm.h"
#include "util.h"

static void shm_progress(struct fr_tp *tp, bool force_events);

static const struct fr_tpb_class shm_class = {
	.name = "shm",
	.rkey = {SHM_RKEY_MAGIC, SHM_VERSION, SHM_RKEY_LEN},
	.progress = shm_progress,
	.conn_down = shm_conn_down,
	.conn_free = shm_conn_free,
};

static void shm_progress(struct fr_tp *tp, bool force_events)
{
	struct fr_tp_conn *c, *next;
	bool handshakes = false;

	for (c = tp->b.conns; c; c = next) {
		next = c->b.next;
		if (c->b.state == SHM_UP && c->b.owned) {
			if (c->b.sq.count)
				shm_tx(c);
			shm_rx(c);
		} else if (c->b.state == SHM_FAILED) {
			if (c->b.owned)
				fr_tpb_flush_failed(c);
			else if (c->b.incoming) {
				fr_tpb_conn_free(c);
				continue;
			}
		} else if (c->b.state != SHM_UP) {
			handshakes = true;
		}
	}
	/*
	 * The sockets cost a system call, which on the latency path costs
	 * more than the ring itself (several times more under a hypervisor
	 * that traps system calls: one look every 16th pass, as before, was
	 * one 8-byte All-Reduce in four and doubled the median here), while
	 * nothing on them is urgent for a rank that polls: they carry wake
	 * bytes (for a sleeper), a dead peer's EOF (timeouts are seconds)
	 * and new connections (their handshakes are then looked at on every
	 * pass).  So look during handshakes, when wait() saw an event, and
	 * otherwise once per tick of the coarse clock (fr_coarse_ms, a few
	 * milliseconds, read without a system call).
	 */
	if (!force_events && !handshakes && !fr_coarse_tick_new(&tp->events_ms))
		return;
	shm_events(tp);
	if (handshakes || force_events)
		shm_timers(tp);
}

/* ---- the interface --------------------------------------------------------
 */

static int shm_probe(char *errbuf, size_t errlen)
{
	int fd = memfd_create("fastreduce-probe", MFD_CLOEXEC), s;

	if (fd < 0) {
		snprintf(errbuf, errlen, "memfd_create: %s", fr_syserr(errno));
		return FR_ENODEV;
	}
	close(fd);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(errbuf, errlen, "AF_UNIX socket: %s",
			 fr_syserr(errno));
		return FR_ENODEV;
	}
	close(s);
	return 0;
}

static int shm_tp_open(const struct fr_tp_params *params, struct fr_tp **out,
		       void *addr, size_t *addrlen)
{
	static _Atomic unsigned int counter;
	struct fr_tp_params p;
	struct sockaddr_un sa;
	socklen_t salen;
	struct fr_tp *tp;
	const char *v, *what;
	uint8_t *b = addr;
	int rc;

	rc = fr_tpb_open_params("shm", params, &p, out, addr, addrlen,
				SHM_ADDR_LEN, SHM_MAX_SQ_DEPTH);
	if (rc)
		return rc;
	tp = fr_tpb_alloc(&shm_class, &p, sizeof(*tp));
	if (!tp)
		return FR_ENOMEM;
	tp->b.cq = &tp->cq;
	tp->node = fr_node_id();
	tp->cma_bytes = SHM_CMA_DEFAULT;
	/* FR_SHM_CMA_BYTES: writes from this size go by cross-memory
	 * attach; 0 turns it off (everything through the rings). */
	v = getenv("FR_SHM_CMA_BYTES");
	if (v && *v) {
		size_t s;

		if (fr_parse_size(v, &s)) {
			(void)fr_tpb_open_fail(
				tp, &p, "FR_SHM_CMA_BYTES=\"%s\" is not a size",
				v);
			return FR_EINVAL;
		}
		tp->cma_bytes = s ? s : SIZE_MAX;
	}
	snprintf(tp->name, sizeof(tp->name), "fastreduce-%016" PRIx64 "-%d-%u",
		 tp->b.nonce, (int)getpid(), atomic_fetch_add(&counter, 1));
	tp->b.lfd = socket(AF_UNIX,
			   SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (tp->b.lfd < 0) {
		fr_tpb_open_err("shm", &p, "shm: socket: %s", fr_syserr(errno));
	}
	shm_name_addr(tp->name, &sa, &salen);
	if (bind(tp->b.lfd, (struct sockaddr *)&sa, salen) ||
	    listen(tp->b.lfd, SOMAXCONN))
		return fr_tpb_open_fail(tp, &p, "shm: cannot listen on @%s: %s",
					tp->name, fr_syserr(errno));
	/* the listener's events come with data NULL, the wake's &b.wfd */
	if (fr_tpb_open_fds(&tp->b, &what))
		return fr_tpb_open_fail(tp, &p, "shm: %s: %s", what,
					fr_syserr(errno));
	memset(b, 0, SHM_ADDR_LEN);
	b[0] = SHM_ADDR_MAGIC;
	b[1] = SHM_VERSION;
	fr_put_le64(b + 8, tp->node);
	memcpy(b + 16, tp->name, strnlen(tp->name, SHM_NAME_LEN));
	*addrlen = SHM_ADDR_LEN;
	*out = tp;
	fr_dbg("shm: rank %d listening on @%s", tp->b.rank, tp->name);
	return 0;
}

static int shm_connect(struct fr_tp *tp, int peer, const void *addr,
		       size_t addrlen, struct fr_tp_conn **out)
{
	const uint8_t *b = addr;
	struct fr_tp_conn *c;
	char name[SHM_NAME_LEN + 1];
	uint64_t now;
	int rc;

	if (!tp || !addr || !out || peer < 0)
		return FR_EINVAL;
	if (addrlen != SHM_ADDR_LEN || b[0] != SHM_ADDR_MAGIC ||
	    b[1] != SHM_VERSION) {
		fr_tpb_seterr(&tp->b, FR_LOG_WARN,
			      "malformed address blob for rank %d (%zu bytes)",
			      peer, addrlen);
		return FR_EPROTO;
	}
	if (fr_get_le64(b + 8) != tp->node) {
		fr_tpb_seterr(
			&tp->b, FR_LOG_ERROR,
			"rank %d is on another node (or network namespace): shared memory cannot reach it",
			peer);
		return FR_ENODEV;
	}
	c = shm_conn_new(tp);
	if (!c) {
		fr_tpb_seterr(&tp->b, FR_LOG_DEBUG, "out of memory");
		return FR_ENOMEM;
	}
	memcpy(name, b + 16, SHM_NAME_LEN);
	name[SHM_NAME_LEN] = 0;
	shm_name_addr(name, &c->sa, &c->salen);
	now = fr_tpb_conn_outgoing(c, peer, SHM_BACKOFF_MIN_MS);
	rc = shm_start_connect(c, now);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_DEBUG, "connect to rank %d: %s",
			      peer, fr_syserr(c->b.last_errno));
		fr_tpb_conn_destroy(c);
		return rc;
	}
	fr_tpb_conn_link(c);
	*out = c;
	return 0;
}

static int shm_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr,
			 size_t loff, const struct fr_tp_rkey *rkey,
			 uint64_t roff, size_t len, uint32_t imm, uint64_t ctx)
{
	struct shm_sqe *e;
	int rc;

	rc = fr_tpb_write_check(c, lmr, loff, rkey, len);
	if (rc)
		return rc;
	e = fr_tpb_sq_at(&c->b.sq, c->b.sq.count);
	memset(e, 0, sizeof(*e));
	e->loff = loff;
	e->len = len;
	e->roff = roff;
	e->rid = len ? rkey->c : 0;
	e->rgen = len ? rkey->d : 0;
	e->imm = imm;
	fr_tpb_sq_post(&c->b.sq, len ? fr_tpb_mr(lmr) : NULL, ctx);
	if (c->b.sq.count - c->sq_push == 1) /* nothing waits before it */
		shm_tx(c);
	return 0;
}

static void shm_set_sleeping(struct fr_tp *tp, uint32_t v)
{
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next)
		if (c->b.state == SHM_UP && c->b.owned)
			atomic_store(c->my_sleep, v);
}

/* Mark us asleep and check once more: 1 if something is ready (the mark
 * is gone again), 0 when a sleep may begin; *timeout_ms is lowered to the
 * nearest handshake deadline. */
static int shm_wait_prepare(struct fr_tp *tp, int *timeout_ms)
{
	struct fr_tp_conn *c;
	uint64_t now;
	int t = *timeout_ms < 0 ? -1 : *timeout_ms, rc;

	rc = fr_tpb_wait_begin(tp);
	if (rc)
		return rc;
	shm_set_sleeping(tp, 1);
	atomic_thread_fence(memory_order_seq_cst);
	now = fr_now_ms();
	for (c = tp->b.conns; c; c = c->b.next) {
		if (shm_ready(c)) {
			shm_set_sleeping(tp, 0);
			return 1;
		}
		t = fr_tpb_due(c, t, now);
	}
	*timeout_ms = t;
	return 0;
}

static void shm_wait_finish(struct fr_tp *tp)
{
	if (!tp)
		return;
	shm_set_sleeping(tp, 0);
	tp->events_ms = 0; /* the next poll() looks at what woke us */
}

static int shm_wait(struct fr_tp *tp, int timeout_ms)
{
	struct epoll_event ev;
	int t = timeout_ms, n, rc;

	rc = shm_wait_prepare(tp, &t);
	if (rc)
		return rc < 0 ? rc : 0;
	/* Events are consumed by the next poll(), not here. */
	n = epoll_wait(tp->b.epfd, &ev, 1, t);
	shm_set_sleeping(tp, 0);
	if (n < 0 && errno != EINTR) {
		fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "epoll_wait: %s",
			      fr_syserr(errno));
		return FR_ESYS;
	}
	/* Level-triggered: the event stays for poll() to handle; a wake
	 * eventfd is drained there too. */
	if (n > 0)
		shm_progress(tp, true);
	return 0;
}

static size_t shm_line_bytes(struct fr_tp *tp)
{
	(void)tp;
	return FR_TP_LINE_MAX;
}

const struct fr_tp_ops fr_shm_ops = {
	FR_TPB_OPS_FIELDS("shm", shm_probe, shm_tp_open, shm_connect,
			  fr_tpb_dereg_mem, shm_write_imm, shm_write_inline,
			  shm_wait, shm_wait_prepare, shm_wait_finish),
	.line_bytes = shm_line_bytes,
	.line_put = shm_line_put,
	.line_get = shm_line_get,
};
