/* SPDX-License-Identifier: MIT */
/*
 * fr_verbs.c - the RDMA verbs transport: write-with-immediate on RC queue
 * pairs, connections set up with librdmacm.
 *
 * Here the interface in transport.h maps one to one onto the hardware:
 * write_imm() is an IBV_WR_RDMA_WRITE_WITH_IMM into the peer's registered
 * region, the peer's HCA checks the remote key and the bounds (so no byte
 * lands outside a region, whatever the sender does), and the immediate
 * consumes one of the receives the peer keeps posted, raising its
 * FR_CQE_RECV.  RC delivers and completes in order, which gives the FIFO
 * rule on both sides.  With FR_IB_QPS > 1 a large write is striped over
 * several QPs and its immediate follows on the first one (below).
 *
 * Files (transports/verbs/; they call downwards only, in this order)
 *   fr_verbs.c    this description; open(), close(), connect(), accept(),
 *                 connect_done(), close_conn(), the operations table and
 *                 the class the base knows us by
 *   verbs_poll.c  poll() and wait(): one pass of all of the below
 *   verbs_data.c  the data path: write_imm(), write_inline() and
 *                 striping, fences, completions, the message log
 *   verbs_lines.c  the polled lines' receiving side (below, "Small
 *                 writes"), and a write's delivery to the caller
 *   verbs_post.c  posting on a lane (ring entry, selective signalling),
 *                 the notification FIFO, receives put back
 *   verbs_cm.c    rdma_cm events: the hello / accept / reject handshake,
 *                 the lanes handshake, retries and deadlines
 *   verbs_resume.c  a connection that was up, re-established after a QP
 *                 failure (below, "Link flaps"); verbs_poll.c says when
 *                 its old QPs are drained, verbs_cm.c hands it its events
 *   verbs_mr.c    memory registration and remote keys
 *   verbs_conn.c  connection objects, their QPs (creation, lanes' state
 *                 transitions), failure and disconnect
 *   verbs_dev.c   device, port and GID choice, the device's limits,
 *                 probe(), locality()
 *   verbs.h       the private structs and constants, and what the files
 *                 share (prefixed verbs_: hidden outside the library)
 * and below them all the transport base (transports/common/tp_base.h): the
 * connection list, the error text (seterr, last_error), the wake eventfd,
 * a connection's allocation, link, parking, retry timing and free, and
 * the operations that are the same in every transport (conn_peer,
 * pending, last_error, wake).
 *
 * Design
 *   - One endpoint = one rdma_cm event channel + one listening cm id bound
 *     to the chosen address (port 0: ephemeral) + one protection domain +
 *     one completion queue shared by the send and receive sides of every
 *     QP, with a completion channel for wait().  PD and CQ are made at
 *     open() on the listening id's device, so the core can register memory
 *     before any connection exists.
 *   - Device, port and GID: FR_IB_DEV=name[:port] restricts the search;
 *     otherwise the ACTIVE port whose RoCE v2 GID table holds local_ip (the
 *     interface the rendezvous went over) wins; failing that, the first
 *     ACTIVE port, ranking devices by hwloc locality to the calling thread
 *     when there are several.  The GID is the RoCE v2 IPv4-mapped entry
 *     (FR_IB_GID_INDEX=n overrides); its address is what we bind and
 *     advertise, so rdma_cm resolves to that very GID.  InfiniBand ports
 *     are addressed by their IPoIB address (local_ip), as rdma_cm expects.
 *     A loopback local_ip is no hint at all (rdma_cm cannot run over lo).
 *   - Everything is non-blocking: cm events are read from a non-blocking
 *     channel inside accept(), connect_done(), poll() and wait(); connects
 *     that are refused (the peer may not listen yet) or fail to resolve
 *     are retried with a back-off until the timeout.  An incoming request
 *     is judged (magic, version, job nonce, a rank not already connected)
 *     and accepted at once, so the connector's connect_done() and our
 *     accept() both complete on ESTABLISHED without waiting for each
 *     other's calls; a refusal carries a reply the connector turns into
 *     FR_EAUTH / FR_EBUSY / FR_EPROTO.  Receive completions of a connection
 *     accept() has not handed out yet are held back (its receives are then
 *     not reposted, so the hold is bounded) and released in order after.
 *   - Several QPs per connection (FR_IB_QPS=n, 1..8, default 1), so that
 *     a large write spreads over n flows (ECMP on RoCE fabrics, bonded
 *     ports).  Lane 0 is the rdma_cm QP; lanes 1..n-1 are plain RC QPs on
 *     the same PD and CQ, connected by hand: the connector creates them
 *     (RESET) and lists their QP numbers in its hello; the acceptor takes
 *     min(its n, the proposal), brings its own extra QPs to RTS before it
 *     accepts (path, MTU, timeouts, access from rdma_init_qp_attr() on the
 *     request's cm id; only dest_qp_num and the PSNs are the lane's, a
 *     PSN being a hash of the sending QP's number) and lists them in its
 *     reply; the connector connects its lanes on ESTABLISHED, drops the
 *     ones not taken, and sends a lanes-ready message on lane 0.  The
 *     acceptor stripes nothing before that message arrives: librdmacm
 *     sends the RTU (the acceptor's ESTABLISHED) before the connector has
 *     seen its own ESTABLISHED, so the connector's lanes may still be in
 *     RESET, where packets are dropped.  Lanes 1.. carry plain RDMA
 *     WRITEs only; each keeps one receive posted that no message takes, so
 *     that a part breaking our registration (the HCA stops the QP) shows
 *     as a flushed receive: FR_ERANGE, as on lane 0.  Lanes are created,
 *     flushed, destroyed and counted in the CQ like lane 0; an error on
 *     any fails the connection; completions are matched to a lane by
 *     qp_num (a destroyed lane's match nothing).
 *   - Striping: a write of at least FR_IB_STRIPE_BYTES (default 256 KiB)
 *     on a connection whose lanes are ready is cut into n parts (rounded
 *     up to 64 bytes), part i a plain RDMA WRITE on lane i.  Lane 0's part
 *     is ordered before anything posted after it on lane 0 by RC; the
 *     parts on lanes 1.. are signalled, and once all have completed (an
 *     RC write completes when its data is placed at the responder) the
 *     notification goes on lane 0: a SEND WITH IMM whose 16-byte payload
 *     holds the whole length, since the receive completion of a write
 *     with immediate reports only that WR's length.  Notifications wait
 *     in a per-connection FIFO (c->notes) and leave in write_imm() order;
 *     a later write, striped or not, posts its data at once but joins the
 *     FIFO while it is not empty (its immediate then also goes as a
 *     notification).  The write's FR_CQE_SEND is its notification's
 *     completion, so it comes after all its parts.  Receives on lane 0
 *     get a 16-byte slot each in a per-connection registered buffer
 *     (c->ctl), named by the wr_id; a notification's payload is checked
 *     (magic) and a malformed one fails the connection (FR_EPROTO).
 *   - Send queue accounting: each QP has a ring of the WRs posted on it.
 *     At most sq_depth writes are in flight per connection and at most
 *     sq_depth WRs other than fences per QP (then FR_EAGAIN), plus a few
 *     slots for fences (below).  Lane 0 keeps one slot reserved per
 *     notification not posted yet, so posting it never finds the queue
 *     full; a write takes all its slots or returns FR_EAGAIN with nothing
 *     posted.  The HW send queue has exactly as many entries as the ring,
 *     and an entry leaves the ring only when the completion that covers it
 *     is polled, so ibv_post_send() never meets a full queue.
 *   - Selective signalling: a WR is signalled when its ctx is not 0 (the
 *     core wants to know when that source is free), every 16th WR, and when
 *     the queue is about to fill (so a full queue always has a completion
 *     coming).  RC completes WRs in order, so a signalled completion also
 *     completes every earlier unsignalled WR: it retires the ring up to
 *     itself, raising one FR_CQE_SEND per write, in order.
 *   - Fences: the core waits for a SEND completion of every write, so an
 *     unsignalled tail must not stay uncovered.  After draining the CQ
 *     (and before wait() sleeps) every QP whose newest WR is unsignalled
 *     gets a signalled zero-length RDMA WRITE.  It carries no immediate, so
 *     it consumes no receive at the peer and raises nothing there; its
 *     completion retires the tail.  A busy QP pays one fence per poll, an
 *     idle one none.  A tail of write_inline()s only owes none: nobody
 *     waits for them, and a later signalled WR retires them.
 *   - Small writes (write_inline, the core's small messages, up to 32
 *     bytes), no FR_CQE_SEND, not while a notification waits (order), go
 *     one of two ways on lane 0:
 *     - Polled lines, while the peer says it polls: a plain RDMA WRITE
 *       (no immediate: no receive consumed, no completion, no interrupt
 *       at the peer) of a 128-byte line into a ring of 64 the peer
 *       registered for us once and sent the key of once (an FLKY message,
 *       right after establishment; FR_IB_LL=0: none, and then neither side
 *       sends lines; unset, 0 on a software device, rxe or siw, where a
 *       receive's completion is a memory write like a line and the
 *       line's 128 bytes cost more: 8 B All-Reduces took 37 us against
 *       34 with the immediate on Soft-RoCE).  A line is 16 words of 8
 *       bytes, each 4 payload bytes and 4 bytes of flag (the line's
 *       number + 1), so the peer takes it once all 16 flags match,
 *       whatever the order its bytes landed in;
 *       its payload: the message's seq, immediate, length, destination
 *       (rkey, address: checked against the peer's own regions like a
 *       write, FR_ERANGE otherwise) and the bytes, which the peer copies
 *       into place before it raises the FR_CQE_RECV.  Lines and writes
 *       with immediate are one sequence of messages (the log's seqs): a
 *       line is taken when it is the next message, and the lines before a
 *       write with immediate are taken before it (RC placed them first).
 *       Flow control: the peer writes back how many of our lines it has
 *       handed out (every 16), and we send at most 64 ahead of that.
 *     - Otherwise one RDMA WRITE WITH IMM whose bytes travel inside the
 *       work request (IBV_SEND_INLINE, no DMA read, no registered source,
 *       no outbox); beyond the device's inline size FR_EAGAIN, and the
 *       core uses write_imm.
 *     The sleeping receiver: a rank that polls and takes a small write
 *     that came as a write with immediate tells that peer it polls (an
 *     8-byte RDMA WRITE of its state word into the peer's region: a
 *     counter, odd while it polls; not in the first poll after a wait(),
 *     so a rank that sleeps for every message does not pay for it).
 *     Before wait() sleeps it writes the even value to each such peer,
 *     signalled, and sleeps only after a later look at its lines, made
 *     once that write's completion came (the write is then placed).  The
 *     sender signals each line, and when the line's completion comes (it
 *     is placed) reads the state word: even, and not yet answered, it
 *     sends a wake-up (a SEND, FWAK), which raises a completion at the
 *     sleeper.  Either the sleeper's last look follows the line's
 *     placement, or the sender's read follows the even word's: no line
 *     is left unseen by a sleeping rank.  A connection that resumes
 *     sends no more lines: what its peer's ring held is taken in the
 *     drain (and counted), the rest of the log goes as writes.  A line's
 *     bytes are put in place when it is taken: a write into them before
 *     that would be overwritten (transport.h allows it; the core never
 *     writes a mailbox slot again before its credit came back).
 *   - Completions: ibv_poll_cq in batches, into a ring of FR completions
 *     that poll() hands out.  One work completion retires at most 16
 *     writes, and the CQ is polled only while the ring has room for that,
 *     so nothing is ever dropped.  wc.status is checked before wc.opcode
 *     (the opcode of an error completion is undefined).  wr_id names the
 *     connection (slot, generation) and the ring position; wc.qp_num must
 *     also match, so completions of a QP destroyed meanwhile (they stay in
 *     a shared CQ) are recognised and ignored.
 *   - Failure: an error on a connection that resume (below) does not take
 *     (the peer's DISCONNECTED, a registration broken, a local error, a
 *     resume that timed out) fails it: we rdma_disconnect() (the peer
 *     learns at once, and the QP enters the error state, which flushes
 *     every outstanding WR with a completion), and once no lane's ring
 *     holds a WR any more each write not known to have arrived gets its
 *     FR_CQE_SEND with an error, once, in order, from the message log
 *     (below); we owe the caller one FR_CQE_RECV with the error unless the
 *     failure itself was a receive completion.  Flushed receives raise
 *     nothing.  Later write_imm() calls return FR_EPEER.  Answering
 *     DISCONNECTED with rdma_disconnect() sends the DREP; without it the
 *     peer waits out the CM's DREQ timeout (~100 s).  The DISCONNECTED of
 *     a live connection is applied only after the CQ has been drained, so
 *     that completions that happened before it (a receive in error, the
 *     last writes) come first.
 *   - Link flaps (resume, verbs_resume.c; FR_IB_RESUME=0 turns it off): a
 *     link that goes down fails a QP (a local QP operation error, the
 *     retries run out) or leaves it retrying for ever (retry count 7 on
 *     rxe).  Either way the connection was up, the peer is alive, and what
 *     was lost is a few writes: so a work completion with a network error
 *     (retries run out, the QP could not send, a flush), or no send
 *     acknowledged for FR_IB_STALL_MS (default the larger of 2 s and a
 *     tenth of the timeout; 0: never; writes of 64 KiB and more are
 *     signalled, so a busy link completes something that often),
 *     re-establishes the connection instead of failing it.  Each
 *     connection keeps a log of its messages (write_imm and write_inline,
 *     whole: source region and offset or the inline bytes, destination,
 *     immediate, ctx; the region stays registered, dereg_mem FR_EBUSY)
 *     until the WR carrying the immediate completes; the receiver counts the
 *     immediates it takes on lane 0 (rx_msgs), in the same order.  The
 *     side that notices moves its QPs to the error state (not
 *     rdma_disconnect(): that is a close), drains them (flushes, or 50 ms
 *     of CQ polling: rxe does not always flush), destroys them, and dials
 *     the peer's listener with a RESUME request naming both connections
 *     and carrying its rx_msgs; the peer, still up or not, drains the
 *     same way, accepts with its own rx_msgs, and each side then
 *     completes the messages the other counted (FR_CQE_SEND 0) and posts
 *     the rest again, in order, whole, on one QP (no striping after a
 *     resume); new writes wait (FR_EAGAIN) until that is done.  A write
 *     lands twice at most in the same place with the same bytes (its
 *     source is not released before it is known to have arrived), and
 *     its immediate is taken once.  Old cm ids are destroyed only once
 *     both sides are on the new connection (their DREQ would be read as a
 *     close).  When both sides dial, the connection's original
 *     connector's dial wins (the acceptor refuses ours with FR_EBUSY and
 *     we wait).  Failed dials are retried with back-off; the whole resume
 *     (resumes in a row with nothing completed in between count as one)
 *     is bounded by 3/4 of the timeout, then the connection fails as
 *     above.  A peer that died is not resumed: its kernel closes its
 *     connections (DISCONNECTED, also on the old id during a resume), and
 *     a dial to it finds no listener: both fail the connection at once.
 *     An accepted dial is never dropped (its dialer may already be on it);
 *     a message arriving on its QP establishes it if the RTU was lost.
 *     FR_IB_FAULT=rank:n (tests) stops that rank's QPs at every n-th
 *     write_imm().
 *   - CQ size: every QP reserves its send and receive depth in the shared
 *     CQ (ibv_resize_cq when it would not fit), so the CQ cannot overflow.
 *     A destroyed QP's reservation is kept until the CQ has been seen
 *     empty, because its completions may still sit in the CQ.
 *   - Limits: a write is at most the port's max_msg_sz (8 MiB on rxe, 1-2
 *     GiB on ConnectX; FR_EINVAL beyond), striped or not: below the stripe
 *     size and before the lanes are ready it goes as one WR.
 *     fork(): librdmacm opens each device once per process, and a
 *     child forked after its parent opened an endpoint inherits that
 *     context, which the kernel will not serve to it (rxe rings its send
 *     doorbell with a write(): EACCES, reported with a hint); such a child
 *     must exec a new program.
 *
 * Wire formats (all integers little-endian)
 *
 *   connection request private data (hello), 28 + 4 * x bytes (<= 56,
 *   what rdma_cm leaves of an IB CM REQ)
 *      0 u32 magic "FRVB" (0x42565246)   4 u16 version (3)
 *      6 u16 kind (1 = hello)            8 i32 connector's rank
 *     12 u16 x: extra QPs proposed (0..7, FR_IB_QPS - 1)
 *     14 u16 connector's listening port 16 u64 job nonce
 *     24 u32 connector's connection id (slot | generation << 16, not 0)
 *     28 u32[x] QP numbers of the connector's lanes 1..x
 *   resume request (kind 4), 40 bytes: magic, version, kind, rank, u16 0,
 *     u16 the dialer's listening port, u64 nonce, 24 u32 the dialer's
 *     connection id, 28 u32 the peer's connection id (from its hello or
 *     accept), 32 u64 messages the dialer has received on it
 *   accept private data, 28 + 4 * y bytes: magic, version, kind 2, i32 our
 *     rank, then u16 y: extra QPs taken (<= x; 0 for a resume), u16 0,
 *     16 u32 our connection id, 20 u64 messages we have received on it (0
 *     for a new connection), 28 u32[y] QP numbers of our lanes 1..y
 *   lane 0 messages other than writes with immediate, 16 bytes each
 *   (zero beyond what is listed):
 *     notification: SEND WITH IMM (the write's immediate), payload u32
 *       length of the whole write, u32 magic "FNOT" (0x544f4e46)
 *     lanes ready (connector -> acceptor, once, before any notification
 *       of its own): SEND, payload u32 magic "FRDY" (0x59445246), u32 n
 *     polled-lines key (each side, once, after establishment): SEND,
 *       u32 magic "FLKY" (0x594b4c46), u32 rkey, u64 address of the ring
 *     wake-up: SEND, u32 magic "FWAK" (0x4b415746)
 *   polled-lines region (one per connection and side, the peer writes):
 *     64 lines of 128 bytes, then u64 credit (lines of ours handed out),
 *     u64 state (odd: polls).  Line word i (u64): bits 0-31 payload word
 *     i, bits 32-63 the line's number + 1.  Payload words: 0 seq (low 32
 *     bits), 1 immediate, 2 length (1..32), 3 rkey, 4-5 address, 6-7 0,
 *     8-15 the bytes.
 *   reject private data, 12 bytes: magic, version, kind 3, i32 status
 *     (FR_EPROTO: version or malformed, FR_EAUTH: wrong nonce, FR_EBUSY:
 *     that rank is already connected, or for a resume: my dial wins, wait
 *     for it; FR_EPEER: a resume of a connection we do not have).  A
 *     request without our magic is rejected without private data.  A
 *     rejection without our reply (no listener yet) is retried; one with it
 *     is final.
 *   address blob, 28 bytes: u8 magic (0xfb), u8 version (1), u8 family
 *     (4 = IPv4, 6 = IPv6), u8 reserved (0), u16 port, u16 reserved (0),
 *     u32 IPv6 scope id (0 for IPv4), u8[16] address (IPv4: first 4 bytes).
 *   remote key blob, 24 bytes: u8 magic (0xfd), u8 version (1), u16
 *     reserved (0), u32 rkey, u64 region address, u64 region length.
 *     Unpacked as a = address, b = length, c = rkey, d = VERBS_RKEY_TAG.
 *     roff in write_imm() is relative to the region start; the sender
 *     checks roff + len against the length (FR_ERANGE, nothing posted), the
 *     peer's HCA checks it again against its real registration.
 *
 * Environment: FR_IB_DEV=name[:port], FR_IB_GID_INDEX=n, FR_IB_TIMEOUT=t
 * (ACK timeout exponent), FR_IB_RETRY_CNT=n, FR_IB_QPS=n (QPs per
 * connection, 1..8), FR_IB_STRIPE_BYTES=size (smallest striped write, K/M/G
 * suffixes, 1 B..1 GiB), FR_POLL=spin (wait() returns at once: the core
 * then busy-polls), FR_IB_RESUME=0 (no resume), FR_IB_STALL_MS=ms,
 * FR_IB_LL=0|1 (polled lines; default 1, 0 on rxe and siw),
 * FR_IB_FAULT=rank:n (tests).
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* ---- small helpers ------------------------------------------------------- */

static int verbs_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

static void verbs_addr_encode(uint8_t *b, const struct sockaddr_storage *sa)
{
	fr_sockaddr_encode(b, VERBS_ADDR_MAGIC, sa);
}

static int verbs_addr_decode(const void *blob, size_t len,
			     struct sockaddr_storage *sa)
{
	socklen_t sl;

	return fr_sockaddr_decode(blob, len, VERBS_ADDR_MAGIC, sa, &sl);
}

/* ---- the operations ------------------------------------------------------ */

/*
 * What the transport base (transports/common/tp_base.h) knows of us: our
 * name, how to make progress, and the hooks fr_tpb_conn_destroy() and
 * fr_tpb_conn_free() run.  No key blob format: our regions are ibv_mrs
 * (verbs_mr.c), not the base's table.
 */
static const struct fr_tpb_class verbs_class = {
	.name = "verbs",
	.progress = verbs_progress,
	.conn_down = verbs_drop_id,
	.conn_free = verbs_conn_release,
};

static void verbs_close(struct fr_tp *tp);

/* FR_IB_TIMEOUT, FR_IB_RETRY_CNT, FR_IB_QPS, FR_IB_STRIPE_BYTES, FR_POLL;
 * FR_EINVAL, with a message in err, for a value out of range. */
static int verbs_options(struct verbs_opts *o, char *err, size_t errlen)
{
	const char *e = getenv("FR_IB_TIMEOUT");
	long ack = VERBS_ACK_TIMEOUT, retry = VERBS_CM_RETRY, nqps = 1;
	size_t stripe = VERBS_DEFAULT_STRIPE;

	if (e && *e && fr_parse_long(e, 0, 31, &ack)) {
		verbs_msg(
			err, errlen,
			"FR_IB_TIMEOUT=\"%s\" is not 0..31 (ACK timeout 4.096 us * 2^n)",
			e);
		return FR_EINVAL;
	}
	e = getenv("FR_IB_RETRY_CNT");
	if (e && *e && fr_parse_long(e, 0, 7, &retry)) {
		verbs_msg(err, errlen, "FR_IB_RETRY_CNT=\"%s\" is not 0..7", e);
		return FR_EINVAL;
	}
	e = getenv("FR_IB_QPS");
	if (e && *e && fr_parse_long(e, 1, VERBS_MAX_QPS, &nqps)) {
		verbs_msg(
			err, errlen,
			"FR_IB_QPS=\"%s\" is not 1..%d (queue pairs per connection)",
			e, VERBS_MAX_QPS);
		return FR_EINVAL;
	}
	e = getenv("FR_IB_STRIPE_BYTES");
	if (e && *e &&
	    (fr_parse_size(e, &stripe) || !stripe ||
	     stripe > VERBS_MAX_STRIPE)) {
		verbs_msg(
			err, errlen,
			"FR_IB_STRIPE_BYTES=\"%s\" is not a size of 1 byte to 1G",
			e);
		return FR_EINVAL;
	}
	e = getenv("FR_IB_RESUME");
	o->resume = !(e && !strcmp(e, "0"));
	e = getenv("FR_IB_LL");
	o->ll_auto = !e || !*e;
	if (!o->ll_auto && strcmp(e, "0") && strcmp(e, "1")) {
		verbs_msg(err, errlen,
			  "FR_IB_LL=\"%s\" is not 0 or 1 (polled lines)", e);
		return FR_EINVAL;
	}
	o->ll = o->ll_auto || !strcmp(e, "1");
	o->fault_every = 0;
	e = getenv("FR_IB_FAULT");
	if (e && *e) {
		long r, n;
		char *colon = strchr(e, ':');

		if (!colon || sscanf(e, "%ld:%ld", &r, &n) != 2 || r < 0 ||
		    n < 1 || fr_parse_long(colon + 1, 1, LONG_MAX, &n)) {
			verbs_msg(err, errlen,
				  "FR_IB_FAULT=\"%s\" is not rank:n (n >= 1)",
				  e);
			return FR_EINVAL;
		}
		o->fault_rank = (int)r;
		o->fault_every = (unsigned long)n;
	}
	o->stall_ms = -1;
	e = getenv("FR_IB_STALL_MS");
	if (e && *e && fr_parse_long(e, 0, INT_MAX, &o->stall_ms)) {
		verbs_msg(
			err, errlen,
			"FR_IB_STALL_MS=\"%s\" is not a number of ms (0: off)",
			e);
		return FR_EINVAL;
	}
	e = getenv("FR_POLL");
	o->spin = e && !strcmp(e, "spin");
	o->ack_timeout = (uint8_t)ack;
	o->retry_cnt = (uint8_t)retry;
	o->nqps = (unsigned int)nqps;
	o->stripe = stripe;
	return 0;
}

static int verbs_open(const struct fr_tp_params *params, struct fr_tp **out,
		      void *addr, size_t *addrlen)
{
	struct fr_tp_params p;
	struct verbs_opts opt;
	struct verbs_choice ch;
	struct sockaddr *la;
	struct fr_tp *tp;
	const char *actual;
	char where[96], why[192];
	int rc;

	rc = fr_tpb_open_params("verbs", params, &p, out, addr, addrlen,
				VERBS_ADDR_LEN, VERBS_MAX_SQ_DEPTH);
	if (!rc)
		rc = verbs_options(&opt, p.errbuf, p.errlen);
	if (!rc)
		rc = verbs_choose(&p, &ch, p.errbuf, p.errlen);
	if (rc)
		return rc;
	/* rank, nonce, timeout, send queue depth; no fds yet (-1) */
	tp = fr_tpb_alloc(&verbs_class, &p, sizeof(*tp));
	if (!tp)
		return FR_ENOMEM;
	tp->opt = opt;
	/* Without resume a stall would only fail a slow connection. */
	tp->stall_ms = !opt.resume ? 0
		       : opt.stall_ms >= 0
			       ? (unsigned int)opt.stall_ms
			       : (unsigned int)FR_MAX(VERBS_STALL_MIN_MS,
						      tp->b.timeout_ms / 10);
	tp->b.cq = &tp->ring;

	rc = FR_ESYS;
	tp->b.wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tp->b.wfd < 0) {
		verbs_msg(p.errbuf, p.errlen, "verbs: eventfd: %s",
			  fr_syserr(errno));
		goto err;
	}
	tp->ec = rdma_create_event_channel();
	if (!tp->ec) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: rdma_create_event_channel: %s",
			  fr_syserr(errno));
		rc = FR_ENODEV;
		goto err;
	}
	if (verbs_nonblock(tp->ec->fd)) {
		verbs_msg(p.errbuf, p.errlen, "verbs: fcntl: %s",
			  fr_syserr(errno));
		goto err;
	}
	if (rdma_create_id(tp->ec, &tp->lid, NULL, RDMA_PS_TCP)) {
		tp->lid = NULL;
		verbs_msg(p.errbuf, p.errlen, "verbs: rdma_create_id: %s",
			  fr_syserr(errno));
		goto err;
	}
	if (rdma_bind_addr(tp->lid, (struct sockaddr *)&ch.sa) ||
	    !tp->lid->verbs) {
		/* Bound without a device: the address is on no RDMA port. */
		const char *e = tp->lid->verbs
					? fr_syserr(errno)
					: "no RDMA device owns that address";

		verbs_msg(p.errbuf, p.errlen,
			  "verbs: cannot bind %s (device %s port %u): %s",
			  fr_sockaddr_str((struct sockaddr *)&ch.sa, where,
					  sizeof(where)),
			  ch.dev, ch.port, e);
		rc = FR_ENODEV;
		goto err;
	}
	/* rdma_cm decides which port an address belongs to; it must be the
	 * one we chose, or FR_IB_DEV would be ignored silently. */
	actual = ibv_get_device_name(tp->lid->verbs->device);
	if (strcmp(actual, ch.dev) || tp->lid->port_num != ch.port) {
		if (getenv("FR_IB_DEV") && *getenv("FR_IB_DEV")) {
			verbs_msg(
				p.errbuf, p.errlen,
				"verbs: FR_IB_DEV names %s port %u, but its address %s belongs to %s port %u",
				ch.dev, ch.port,
				fr_sockaddr_str((struct sockaddr *)&ch.sa,
						where, sizeof(where)),
				actual, tp->lid->port_num);
			rc = FR_ENODEV;
			goto err;
		}
		fr_info("verbs: rank %d: address of %s port %u is served by %s port %u; using that",
			p.rank, ch.dev, ch.port, actual, tp->lid->port_num);
		ch.gid_index = -1;
	}
	rc = verbs_limits(tp, p.errbuf, p.errlen);
	if (rc)
		goto err;
	rc = FR_ESYS;
	tp->pd = ibv_alloc_pd(tp->lid->verbs);
	if (!tp->pd) {
		verbs_msg(p.errbuf, p.errlen, "verbs: ibv_alloc_pd: %s",
			  verbs_strerror(errno, why, sizeof(why)));
		goto err;
	}
	tp->cc = ibv_create_comp_channel(tp->lid->verbs);
	if (!tp->cc) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: ibv_create_comp_channel: %s",
			  fr_syserr(errno));
		goto err;
	}
	if (verbs_nonblock(tp->cc->fd)) {
		verbs_msg(p.errbuf, p.errlen, "verbs: fcntl: %s",
			  fr_syserr(errno));
		goto err;
	}
	tp->cq = ibv_create_cq(tp->lid->verbs, tp->cq_size, NULL, tp->cc, 0);
	if (!tp->cq) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: ibv_create_cq (%d entries): %s", tp->cq_size,
			  fr_syserr(errno));
		goto err;
	}
	tp->cq_size = tp->cq->cqe;
	if (rdma_listen(tp->lid, VERBS_LISTEN_BACKLOG)) {
		const char *e = fr_syserr(errno);

		verbs_msg(p.errbuf, p.errlen, "verbs: rdma_listen on %s: %s",
			  fr_sockaddr_str((struct sockaddr *)&ch.sa, where,
					  sizeof(where)),
			  e);
		goto err;
	}
	la = rdma_get_local_addr(tp->lid);
	memcpy(&tp->addr, la,
	       la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
					 : sizeof(struct sockaddr_in));
	verbs_sa_set_port(&tp->addr, ntohs(rdma_get_src_port(tp->lid)));
	verbs_addr_encode(addr, &tp->addr);
	*addrlen = VERBS_ADDR_LEN;
	fr_info("verbs: rank %d: device %s port %u (%s), gid index %d, listening on %s; %s",
		tp->b.rank, actual, tp->lid->port_num,
		ch.ib ? "InfiniBand" : "RoCE", ch.gid_index,
		fr_sockaddr_str((struct sockaddr *)&tp->addr, where,
				sizeof(where)),
		ch.why);
	*out = tp;
	return 0;

err:
	verbs_close(tp); /* what was made so far */
	return rc;
}

static int verbs_connect(struct fr_tp *tp, int peer, const void *addr,
			 size_t addrlen, struct fr_tp_conn **out)
{
	struct fr_tp_conn *c;
	int rc;

	if (!tp || !addr || !out || peer < 0)
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	c = verbs_conn_new(tp);
	if (!c) {
		fr_tpb_seterr(&tp->b, FR_LOG_DEBUG, "out of memory");
		return FR_ENOMEM;
	}
	rc = verbs_addr_decode(addr, addrlen, &c->dst);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_WARN,
			      "malformed address blob for rank %d (%zu bytes)",
			      peer, addrlen);
		fr_tpb_conn_destroy(c);
		return rc;
	}
	fr_tpb_conn_outgoing(c, peer, VERBS_BACKOFF_MIN_MS);
	fr_tpb_conn_link(c);
	verbs_start_connect(c);
	if (c->b.state == VERBS_FAILED) {
		rc = c->b.error;
		fr_tpb_conn_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

static int verbs_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **out)
{
	if (!tp || !out || peer < 0)
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	verbs_progress(tp, true);
	/* Receives held so far go out with the next poll. */
	*out = fr_tpb_take(&tp->b, peer);
	return *out ? 0 : FR_EAGAIN;
}

static int verbs_connect_done(struct fr_tp_conn *c)
{
	if (!c)
		return FR_EINVAL;
	if (c->b.tp->fatal)
		return c->b.tp->fatal;
	verbs_progress(c->b.tp, true);
	if (c->b.state == VERBS_UP)
		return 0;
	if (c->b.state == VERBS_FAILED)
		return c->was_up ? FR_EPEER : c->b.error;
	return FR_EAGAIN;
}

static void verbs_close_conn(struct fr_tp_conn *c)
{
	if (!c)
		return;
	if (c->nqps > 1)
		fr_dbg("verbs: rank %d: connection %s rank %d: %u queue pairs, %llu writes striped",
		       c->b.tp->b.rank, c->b.incoming ? "from" : "to",
		       c->b.peer, c->nqps, (unsigned long long)c->nstriped);
	if (c->ll_sent || c->ll_taken)
		fr_dbg("verbs: rank %d: connection %s rank %d: polled lines: %llu sent, %llu taken, %llu wake-ups",
		       c->b.tp->b.rank, c->b.incoming ? "from" : "to",
		       c->b.peer, (unsigned long long)c->ll_sent,
		       (unsigned long long)c->ll_taken,
		       (unsigned long long)c->ll_rings);
	/* Tell the peer now rather than leave it to its timeouts. */
	if (c->id && !c->disconnected && c->b.state == VERBS_UP &&
	    !rdma_disconnect(c->id))
		c->disconnected = true;
	fr_tpb_close_conn(c); /* its completions purged from the ring, freed */
}

static void verbs_close(struct fr_tp *tp)
{
	if (!tp)
		return;
	while (tp->b.conns)
		verbs_close_conn(tp->b.conns);
	while (tp->mrs) {
		struct fr_tp_mr *mr = (struct fr_tp_mr *)(void *)tp->mrs;

		mr->inflight = 0;
		verbs_dereg_mem(tp, mr);
	}
	/* ibv_destroy_cq() waits for every event to be acknowledged. */
	if (tp->cq_unacked)
		ibv_ack_cq_events(tp->cq, tp->cq_unacked);
	/* An open() that failed half way closes what it made so far. */
	if (tp->cq)
		ibv_destroy_cq(tp->cq);
	if (tp->cc)
		ibv_destroy_comp_channel(tp->cc);
	if (tp->pd)
		ibv_dealloc_pd(tp->pd);
	if (tp->lid)
		rdma_destroy_id(tp->lid);
	if (tp->ec)
		rdma_destroy_event_channel(tp->ec);
	free(tp->slots);
	free(tp->slot_gen);
	fr_tpb_close(tp); /* the eventfd, the epoll set, the struct */
}

const struct fr_tp_ops fr_verbs_ops = {
	.size = sizeof(struct fr_tp_ops),
	.name = "verbs",
	.probe = verbs_probe,
	.open = verbs_open,
	.connect = verbs_connect,
	.accept = verbs_accept,
	.connect_done = verbs_connect_done,
	.reg_mem = verbs_reg_mem,
	.dereg_mem = verbs_dereg_mem,
	.pack_rkey = verbs_pack_rkey,
	.unpack_rkey = verbs_unpack_rkey,
	.write_imm = verbs_write_imm,
	.write_inline = verbs_write_inline,
	.poll = verbs_poll,
	.wait = verbs_wait,
	.wake = fr_tpb_wake,
	.wait_prepare = verbs_wait_prepare,
	.wait_fd = verbs_wait_fd,
	.wait_finish = verbs_wait_finish,
	.close_conn = verbs_close_conn,
	.close = verbs_close,
	.conn_peer = fr_tpb_conn_peer,
	.last_error = fr_tpb_last_error,
	.pending = fr_tpb_pending,
	.locality = verbs_locality,
};
