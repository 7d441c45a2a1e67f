/* SPDX-License-Identifier: MIT */
/*
 * fr_shm.c - the shared-memory transport: write-with-immediate between
 * processes of one node.
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
 *   - Idle: wait() sets this side's "sleeping" flag in every segment, checks
 *     the rings once more and sleeps in epoll (the sockets, the listener and
 *     the wake eventfd).  A producer that publishes a slot, or a consumer
 *     that frees one, reads the peer's flag after a full fence and sends one
 *     byte on the socket if it is set (a Dekker pair: either the sleeper
 *     sees the slot or the producer sees the flag).  No core spins while
 *     nothing arrives.
 *
 * Wire format (host byte order: both ends are on one machine)
 *
 *   hello, connector -> acceptor, one SEQPACKET message of 24 bytes with
 *   the segment's descriptor attached (SCM_RIGHTS):
 *      0 u32 magic "FSHM"   4 u16 version (3)   6 u16 kind (1 = hello)
 *      8 i32 connector's rank   12 u32 segment bytes   16 u64 job nonce
 *   reply, acceptor -> connector, 12 bytes:
 *      0 u32 magic   4 u16 version   6 u16 kind (2 = reply)   8 i32 status
 *      (0, FR_EPROTO, FR_EAUTH wrong nonce, FR_EBUSY rank already connected)
 *   afterwards only 1-byte wake messages.
 *
 *   segment: u32 connector asleep, u32 acceptor asleep (each in its own
 *      cache line), then ring[0] (connector -> acceptor) and ring[1].
 *   ring header, one cache line each: u64 head (consumer); u64 the
 *      ring's address in the producer's process and u32 closed
 *      (producer); u32 pull_ok (consumer); then 64 slots.
 *   slot (SHM_SLOT_BYTES): u32 imm, u32 flags (FIRST 1, LAST 2, PULL 4),
 *      u32 region id, u32 generation, u64 offset of this fragment in the
 *      region, u32 fragment bytes, u32 total bytes of the write, u64 source
 *      address in the writer's process (PULL only), u64 seq, payload.  seq
 *      is written last: the slot's index in the ring (counting every slot
 *      ever produced) plus one, so the consumer of index i waits for
 *      seq == i + 1 (the ring starts zeroed).  A PULL slot is FIRST | LAST
 *      with no payload: the receiver reads total bytes from the source.
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

#include "../common/tp_base.h"
#include "fastreduce.h"
#include "log.h"
#include "transport.h"
#include "util.h"

#define SHM_MAGIC 0x4d485346u /* "FSHM" */
/* 2: PULL slots replaced writes placed by the writer; 3: the consumer
 * polls the slot's own sequence number instead of the ring's tail */
#define SHM_VERSION 3
#define SHM_KIND_HELLO 1
#define SHM_KIND_REPLY 2
#define SHM_HELLO_LEN 24
#define SHM_REPLY_LEN 12

#define SHM_SLOTS 64u
#define SHM_SLOT_BYTES 8192u
#define SHM_SLOT_HDR 48u
#define SHM_SLOT_DATA (SHM_SLOT_BYTES - SHM_SLOT_HDR)
#define SLOT_FIRST 1u
#define SLOT_LAST 2u
#define SLOT_PULL 4u /* no payload: the receiver reads it from src */
#define SLOT_FLAGS (SLOT_FIRST | SLOT_LAST | SLOT_PULL)

#define SHM_NAME_LEN 48
#define SHM_ADDR_MAGIC 0xfd
#define SHM_ADDR_LEN (16 + SHM_NAME_LEN)
#define SHM_RKEY_MAGIC 0xfe
#define SHM_RKEY_LEN 28

#define SHM_MAX_SQ_DEPTH 65536
#define SHM_CMA_DEFAULT (4u << 20)
/* Bytes the receiver pulls per cross-memory attach call and per pass of
 * its progress (at most one pulled write per pass, too), so that one huge
 * write does not hold up the other connections for long. */
#define SHM_CMA_CHUNK (4u << 20)
#define SHM_BACKOFF_MIN_MS 5
#define SHM_BACKOFF_MAX_MS 500

struct shm_slot {
	uint32_t imm, flags, region, gen;
	uint64_t off;
	uint32_t len, total;
	uint64_t src; /* PULL: the source, in the writer's address space */
	/* Written last (release): the slot's index in the ring plus one,
	 * once the rest is in place.  The consumer polls this word, in the
	 * line it reads next anyway, instead of a tail in a line of its own:
	 * one cache miss between cores per message instead of two in a
	 * row. */
	_Atomic uint64_t seq;
	uint8_t data[SHM_SLOT_DATA];
};

struct shm_ring {
	_Alignas(64) _Atomic uint64_t head; /* written by the consumer */
	/* Producer, rarely: where this ring is mapped in its process (read
	 * back by the consumer's probe), and "closed": it has given up on
	 * the connection, its sources may be gone (shm_pull()). */
	_Alignas(64) _Atomic uint64_t self;
	_Atomic uint32_t closed;
	/* Consumer: its probe succeeded, it pulls large writes. */
	_Alignas(64) _Atomic uint32_t pull_ok;
	_Alignas(64) struct shm_slot slot[SHM_SLOTS];
};

/* ring[s] carries side s's writes to side 1 - s (0 = connector). */
struct shm_seg {
	_Alignas(64) _Atomic uint32_t sleeping0;
	_Alignas(64) _Atomic uint32_t sleeping1;
	_Alignas(64) struct shm_ring ring[2];
};

_Static_assert(sizeof(struct shm_slot) == SHM_SLOT_BYTES, "slot layout");
_Static_assert(offsetof(struct shm_slot, data) == SHM_SLOT_HDR, "slot header");
/* what shm_rx copies before judging it (seq is read on its own) */
#define SHM_SLOT_FIELDS offsetof(struct shm_slot, seq)

/* A registered region is the base's (struct fr_tpb_mr, tp_base.h): its
 * slot in the region table is its remote key. */

/* A queued write: points at the caller's memory, never copies it early. */
struct shm_sqe {
	struct fr_tpb_sqe b;	/* its region and ctx */
	size_t loff, len, done; /* done: bytes in the ring (or to be pulled) */
	uint64_t roff;
	uint32_t rid, rgen, imm;
	uint64_t seq; /* pushed: its last slot's index in the ring */
	bool pull; /* went as a PULL slot: retired when the peer is past seq */
};

enum shm_state {
	/* outgoing: nobody listening yet, trying again later */
	SHM_RETRY = FR_TPB_RETRY,
	/* established */
	SHM_UP = FR_TPB_UP,
	/* socket closed; error completions may be owed */
	SHM_FAILED = FR_TPB_FAILED,
	/* outgoing: hello sent, awaiting the reply */
	SHM_HELLO = FR_TPB_SETUP,
	/* incoming: awaiting the hello */
	SHM_GREET,
};

struct fr_tp_conn {
	struct fr_tpb_conn b; /* endpoint, list, peer, state, failure,
			       * establishment deadlines */
	int fd;
	int side; /* 0 connector, 1 acceptor */
	pid_t peer_pid;
	bool cma;     /* FR_SHM_CMA_BYTES allows cross-memory attach here */
	bool pull_tx; /* the peer pulls our large writes (it set pull_ok) */
	bool pull_rx; /* we pull the peer's (our probe succeeded) */
	struct sockaddr_un sa;
	socklen_t salen;

	struct shm_seg *seg;
	size_t seg_len;
	struct shm_ring *tx, *rx;
	_Atomic uint32_t *my_sleep, *peer_sleep;
	uint64_t tx_tail, rx_head;
	uint64_t tx_head; /* the consumer's head as we last read it */
	size_t rx_pulled; /* bytes of the PULL slot at rx_head read so far */

	/*
	 * The send queue is b.sq, of struct shm_sqe: the first sq_push of its
	 * entries are entirely in the ring but not retired yet (a pull still
	 * reading the source, or no room for the completion), the others
	 * wait for room in the ring (the first of them may be in part).
	 */
	unsigned int sq_push;
};

/* The base (rank, connections, regions, listener, wake eventfd, epoll
 * set, error text), the listener's name and the completions. */
struct fr_tp {
	struct fr_tpb b;
	uint64_t node;
	size_t cma_bytes;
	char name[SHM_NAME_LEN];
	uint64_t events_ms; /* fr_coarse_ms() of the last look at the sockets */
	struct fr_cqring cq;
};

FR_TPB_FIRST(fr_tp);
FR_TPB_FIRST(fr_tp_conn);
FR_TPB_FIRST(shm_sqe);

/* ---- helpers ------------------------------------------------------------- */

static void shm_name_addr(const char *name, struct sockaddr_un *sa,
			  socklen_t *len)
{
	size_t n = strnlen(name, SHM_NAME_LEN);

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Abstract namespace: sun_path[0] = 0, no file to clean up. */
	memcpy(sa->sun_path + 1, name, n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* ---- connections ---------------------------------------------------------- */

static struct fr_tp_conn *shm_conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c =
		fr_tpb_conn_new(tp, sizeof(*c), sizeof(struct shm_sqe));

	if (c) {
		c->fd = -1;
		c->cma = tp->cma_bytes != SIZE_MAX;
	}
	return c;
}

static int shm_watch(struct fr_tp_conn *c)
{
	return fr_tpb_watch(&c->b.tp->b, c->fd, EPOLLIN | EPOLLRDHUP, c);
}

static void shm_close_fd(struct fr_tp_conn *c)
{
	if (c->fd < 0)
		return;
	epoll_ctl(c->b.tp->b.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
}

/*
 * We give up on the connection: tell the peer before anything lets the
 * application reuse a source that a PULL slot names (the release of the
 * send queue, the error completions, close).  Sequentially consistent:
 * see shm_pull().
 */
static void shm_mark_closed(struct fr_tp_conn *c)
{
	if (c->tx)
		atomic_store_explicit(&c->tx->closed, 1, memory_order_seq_cst);
}

static void shm_unmap(struct fr_tp_conn *c)
{
	if (c->seg)
		munmap(c->seg, c->seg_len);
	c->seg = NULL;
	c->tx = c->rx = NULL;
	c->my_sleep = c->peer_sleep = NULL;
}

static void shm_progress(struct fr_tp *tp, bool force_events);

/*
 * A connection fails (fr_tpb_conn_fail, which also releases the regions
 * of its queued sends, remembers the error and owes one error completion
 * plus one per queued send if it was established and handed out) or goes
 * away: say so in the segment first, close the socket (the peer reads
 * EOF), keep the segment mapped no longer.
 */
static void shm_conn_down(struct fr_tp_conn *c)
{
	shm_mark_closed(c);
	shm_close_fd(c);
	shm_unmap(c);
	c->sq_push = 0; /* pushed or not, they all fail now */
}

static const struct fr_tpb_class shm_class = {
	.name = "shm",
	.rkey = {SHM_RKEY_MAGIC, SHM_VERSION, SHM_RKEY_LEN},
	.progress = shm_progress,
	.conn_down = shm_conn_down,
};

static void shm_attach(struct fr_tp_conn *c, struct shm_seg *seg, size_t len)
{
	c->seg = seg;
	c->seg_len = len;
	c->tx = &seg->ring[c->side];
	c->rx = &seg->ring[1 - c->side];
	c->my_sleep = c->side ? &seg->sleeping1 : &seg->sleeping0;
	c->peer_sleep = c->side ? &seg->sleeping0 : &seg->sleeping1;
	/* For the peer's probe (shm_probe_pull), before the hello or the
	 * reply that lets it begin. */
	atomic_store_explicit(&c->tx->self, (uint64_t)(uintptr_t)c->tx,
			      memory_order_release);
}

/*
 * May we pull the peer's large writes?  Read back, by cross-memory attach,
 * the word in which the peer wrote where it maps the ring it produces: it
 * is there only if peer_pid is that process and the kernel lets us attach.
 * On success grant the peer pulls (pull_ok); otherwise its large writes
 * come through the ring.
 */
static void shm_probe_pull(struct fr_tp_conn *c)
{
	uint64_t want = atomic_load_explicit(&c->rx->self,
					     memory_order_acquire),
		 at = want + offsetof(struct shm_ring, self), got = 0;
	struct iovec l = { &got, sizeof(got) };
	struct iovec r = { (void *)(uintptr_t)at, sizeof(got) };
	ssize_t n;

	if (!c->cma || c->peer_pid <= 0 || !want)
		return;
	do
		n = process_vm_readv(c->peer_pid, &l, 1, &r, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(got) && got == want) {
		c->pull_rx = true;
		atomic_store_explicit(&c->rx->pull_ok, 1, memory_order_release);
		return;
	}
	if (n < 0 && (errno == EPERM || errno == EACCES || errno == ENOSYS))
		fr_info("shm: rank %d: cross-memory attach to rank %d refused (%s): its large writes come through the ring",
			c->b.tp->b.rank, c->b.peer, fr_syserr(errno));
	else if (n < 0)
		fr_dbg("shm: rank %d: cross-memory attach probe of rank %d: %s",
		       c->b.tp->b.rank, c->b.peer, fr_syserr(errno));
	else
		fr_info("shm: rank %d: cross-memory attach to rank %d reads another process (PID namespaces?): its large writes come through the ring",
			c->b.tp->b.rank, c->b.peer);
}

static pid_t shm_peer_pid(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		return 0;
	return cr.pid;
}

/* ---- handshake ------------------------------------------------------------ */

static void shm_put_hdr(uint8_t *b, uint16_t kind)
{
	uint32_t magic = SHM_MAGIC;
	uint16_t v = SHM_VERSION;

	memcpy(b, &magic, 4);
	memcpy(b + 4, &v, 2);
	memcpy(b + 6, &kind, 2);
}

static bool shm_hdr_ok(const uint8_t *b, uint16_t kind)
{
	uint32_t magic;
	uint16_t v, k;

	memcpy(&magic, b, 4);
	memcpy(&v, b + 4, 2);
	memcpy(&k, b + 6, 2);
	return magic == SHM_MAGIC && v == SHM_VERSION && k == kind;
}

/* Create the segment and send the hello with it.  0, FR_EAGAIN (socket
 * full, try later) or an error. */
static int shm_send_hello(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	size_t len = sizeof(struct shm_seg);
	uint8_t b[SHM_HELLO_LEN];
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { b, sizeof(b) };
	struct msghdr m = { 0 };
	struct cmsghdr *cm;
	uint32_t seglen = (uint32_t)len;
	void *seg;
	int mfd;

	mfd = memfd_create("fastreduce-shm", MFD_CLOEXEC);
	if (mfd < 0) {
		c->b.last_errno = errno;
		return FR_ESYS;
	}
	if (ftruncate(mfd, (off_t)len)) {
		c->b.last_errno = errno;
		close(mfd);
		return FR_ENOMEM;
	}
	seg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
		   mfd, 0);
	if (seg == MAP_FAILED) {
		c->b.last_errno = errno;
		close(mfd);
		return FR_ENOMEM;
	}
	shm_put_hdr(b, SHM_KIND_HELLO);
	memcpy(b + 8, &tp->b.rank, 4);
	memcpy(b + 12, &seglen, 4);
	memcpy(b + 16, &tp->b.nonce, 8);
	memset(&u, 0, sizeof(u)); /* the control buffer's padding too */
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof(u.buf);
	cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
	if (sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(b)) {
		c->b.last_errno = errno;
		close(mfd);
		munmap(seg, len);
		return errno == EAGAIN ? FR_EAGAIN : FR_EPEER;
	}
	close(mfd); /* the mapping and the peer's copy keep it alive */
	c->side = 0;
	shm_attach(c, seg, len);
	c->b.state = SHM_HELLO;
	return 0;
}

static bool shm_retryable(int e)
{
	return e == ECONNREFUSED || e == ENOENT || e == EAGAIN || e == EINTR;
}

/* One connect attempt and the hello; refusals become a later retry. */
static int shm_start_connect(struct fr_tp_conn *c, uint64_t now)
{
	int fd, e, rc;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		c->b.last_errno = errno;
		return FR_ESYS;
	}
	if (connect(fd, (struct sockaddr *)&c->sa, c->salen)) {
		e = errno;
		close(fd);
		if (shm_retryable(e)) {
			fr_tpb_retry(c, e, now, SHM_BACKOFF_MAX_MS);
			return 0;
		}
		c->b.last_errno = e;
		return FR_ESYS;
	}
	c->fd = fd;
	rc = shm_send_hello(c);
	if (rc == FR_EAGAIN) {
		close(fd);
		c->fd = -1;
		fr_tpb_retry(c, EAGAIN, now, SHM_BACKOFF_MAX_MS);
		return 0;
	}
	if (rc) {
		close(fd);
		c->fd = -1;
		return rc;
	}
	c->peer_pid = shm_peer_pid(fd);
	if (shm_watch(c)) {
		c->b.last_errno = errno;
		return FR_ESYS;
	}
	return 0;
}

static void shm_reply(int fd, int status)
{
	uint8_t b[SHM_REPLY_LEN];

	shm_put_hdr(b, SHM_KIND_REPLY);
	memcpy(b + 8, &status, 4);
	if (send(fd, b, sizeof(b), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		fr_dbg("shm: reply: %s", fr_syserr(errno));
}

static bool shm_rank_taken(struct fr_tp *tp, int rank,
			   const struct fr_tp_conn *self)
{
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next)
		if (c != self && c->b.incoming && c->b.peer == rank &&
		    (c->b.state == SHM_UP ||
		     (c->b.state == SHM_FAILED && c->b.owned)))
			return true;
	return false;
}

/* An incoming connection's hello (with the segment) has arrived. */
static void shm_greet(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	uint8_t b[SHM_HELLO_LEN + 1];
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { b, sizeof(b) };
	struct msghdr m = { 0 };
	struct cmsghdr *cm;
	uint64_t nonce;
	uint32_t seglen;
	struct stat st;
	int rank, mfd = -1;
	ssize_t n;
	void *seg;

	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof(u.buf);
	n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && errno == EAGAIN)
		return;
	for (cm = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; cm;
	     cm = CMSG_NXTHDR(&m, cm))
		if (cm->cmsg_level == SOL_SOCKET &&
		    cm->cmsg_type == SCM_RIGHTS &&
		    cm->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&mfd, CMSG_DATA(cm), sizeof(int));
	if (n != SHM_HELLO_LEN || !shm_hdr_ok(b, SHM_KIND_HELLO) || mfd < 0 ||
	    (m.msg_flags & MSG_CTRUNC)) {
		if (mfd >= 0)
			close(mfd);
		if (n > 0)
			shm_reply(c->fd, FR_EPROTO);
		fr_tpb_conn_fail(c, FR_EPROTO, "malformed hello");
		return;
	}
	memcpy(&rank, b + 8, 4);
	memcpy(&seglen, b + 12, 4);
	memcpy(&nonce, b + 16, 8);
	c->b.peer = rank;
	if (nonce != tp->b.nonce) {
		close(mfd);
		shm_reply(c->fd, FR_EAUTH);
		fr_tpb_seterr(
			&tp->b, FR_LOG_WARN,
			"refused a connection claiming rank %d: wrong job nonce",
			rank);
		fr_tpb_conn_fail(c, FR_EAUTH, "wrong job nonce");
		return;
	}
	if (rank < 0 || seglen != sizeof(struct shm_seg) || fstat(mfd, &st) ||
	    (uint64_t)st.st_size != seglen) {
		close(mfd);
		shm_reply(c->fd, FR_EPROTO);
		fr_tpb_conn_fail(c, FR_EPROTO, "hello with a bad segment");
		return;
	}
	if (shm_rank_taken(tp, rank, c)) {
		close(mfd);
		shm_reply(c->fd, FR_EBUSY);
		fr_tpb_seterr(&tp->b, FR_LOG_WARN,
			      "refused a second connection from rank %d", rank);
		fr_tpb_conn_fail(c, FR_EBUSY, "duplicate rank");
		return;
	}
	seg = mmap(NULL, seglen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
		   mfd, 0);
	close(mfd);
	if (seg == MAP_FAILED) {
		shm_reply(c->fd, FR_ENOMEM);
		fr_tpb_conn_fail(c, FR_ENOMEM, "mmap of the segment: %s",
				 fr_syserr(errno));
		return;
	}
	c->side = 1;
	shm_attach(c, seg, seglen);
	c->peer_pid = shm_peer_pid(c->fd);
	shm_probe_pull(c); /* before the reply: the connector's large writes
			    * can be pulled from the start */
	shm_reply(c->fd, 0);
	c->b.state = SHM_UP;
}

static void shm_hello_reply(struct fr_tp_conn *c)
{
	uint8_t b[SHM_REPLY_LEN + 1];
	ssize_t n = recv(c->fd, b, sizeof(b), MSG_DONTWAIT);
	int status;

	if (n < 0 && errno == EAGAIN)
		return;
	/* closed or reset under us (the peer died, or could not take the
	 * connection: out of descriptors) is a peer failure, not a protocol
	 * error */
	if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE))) {
		fr_tpb_conn_fail(c, FR_EPEER, "closed during the handshake");
		return;
	}
	if (n != SHM_REPLY_LEN || !shm_hdr_ok(b, SHM_KIND_REPLY)) {
		fr_tpb_conn_fail(c, FR_EPROTO, "malformed reply");
		return;
	}
	memcpy(&status, b + 8, 4);
	if (status) {
		fr_tpb_conn_fail(c, status < 0 ? status : FR_EPROTO,
				 "refused by the peer: %s",
				 fr_strerror(status));
		return;
	}
	shm_probe_pull(c);
	c->b.state = SHM_UP;
}

static void shm_accept_new(struct fr_tp *tp, uint64_t now)
{
	for (;;) {
		struct fr_tp_conn *c;
		int fd = accept4(tp->b.lfd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				tp->b.accept_errno = errno;
			return;
		}
		tp->b.accept_errno = 0;
		if (tp->b.npending >= FR_TPB_MAX_PENDING ||
		    !(c = shm_conn_new(tp))) {
			close(fd);
			continue;
		}
		c->fd = fd;
		if (shm_watch(c)) {
			fr_tpb_conn_destroy(c); /* closes fd */
			continue;
		}
		fr_tpb_conn_park(c, SHM_GREET, now);
	}
}

/* ---- data path ------------------------------------------------------------ */

static void shm_poke(struct fr_tp_conn *c)
{
	char one = 0;

	/* Seen the peer asleep after our ring update: wake it. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(c->peer_sleep, memory_order_relaxed) &&
	    send(c->fd, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
	    errno != EAGAIN)
		fr_dbg("shm: wake rank %d: %s", c->b.peer, fr_syserr(errno));
}

/* Report the oldest queued write done: its source is no longer read
 * (shm_sq_done). */
static void shm_sq_retire(struct fr_tp_conn *c)
{
	fr_tpb_sq_retire(c);
	c->sq_push--;
}

/* Can the oldest pushed write be retired, the consumer's head being head? */
static bool shm_sq_done(const struct fr_tp_conn *c, uint64_t head)
{
	const struct shm_sqe *e = fr_tpb_sq_at(&c->b.sq, 0);

	/* A fragment's bytes are in the ring; a pull reads the source until
	 * the consumer moves past its slot. */
	return c->sq_push && (!e->pull || head > e->seq);
}

/* Retire pushed writes, oldest first, while they are done. */
static void shm_sq_reap(struct fr_tp_conn *c, uint64_t head)
{
	while (shm_sq_done(c, head) && !fr_cqring_full(&c->b.tp->cq))
		shm_sq_retire(c);
}

/* Does this write go as one PULL slot?  Large enough, not started, and the
 * peer has said it can pull from us. */
static bool shm_pull_eligible(struct fr_tp_conn *c, const struct shm_sqe *e)
{
	if (!c->cma || e->done || e->len < c->b.tp->cma_bytes)
		return false;
	if (!c->pull_tx)
		c->pull_tx = atomic_load_explicit(&c->tx->pull_ok,
						  memory_order_acquire);
	return c->pull_tx;
}

/* Push queued writes into the ring while it has room, and retire those
 * that are done. */
static void shm_tx(struct fr_tp_conn *c)
{
	bool pushed = false;
	uint64_t head;

	if (c->b.state != SHM_UP)
		return;
	/*
	 * The consumer writes head after every pass: reading it costs a
	 * cache miss, which before writing the slot is one more on the
	 * latency path (and takes the line from the consumer, whose next
	 * store then misses too).  The last value read serves until the
	 * ring looks full, or a pull waits for the consumer to pass it.
	 */
	head = c->tx_head;
	if (c->sq_push &&
	    ((const struct shm_sqe *)fr_tpb_sq_at(&c->b.sq, 0))->pull)
		head = atomic_load_explicit(&c->tx->head, memory_order_acquire);
	/*
	 * Later writes may follow a pull still pending: the consumer takes
	 * slots in order, so one that covers the same bytes lands after it.
	 */
	while (c->sq_push < c->b.sq.count) {
		struct shm_sqe *e = fr_tpb_sq_at(&c->b.sq, c->sq_push);
		struct shm_slot *s;
		uint32_t flags = 0, n = 0;

		if (c->tx_tail - head >= SHM_SLOTS) {
			head = atomic_load_explicit(&c->tx->head,
						    memory_order_acquire);
			if (c->tx_tail - head >= SHM_SLOTS)
				break;
		}
		s = &c->tx->slot[c->tx_tail % SHM_SLOTS];
		if (shm_pull_eligible(c, e)) {
			flags = SLOT_FIRST | SLOT_LAST | SLOT_PULL;
			s->src = (uint64_t)(uintptr_t)(e->b.mr->base + e->loff);
			s->off = e->roff;
			e->pull = true;
			e->done = e->len;
		} else {
			n = (uint32_t)FR_MIN((size_t)SHM_SLOT_DATA,
					     e->len - e->done);
			if (e->done == 0)
				flags |= SLOT_FIRST;
			if (e->done + n == e->len)
				flags |= SLOT_LAST;
			if (n)
				memcpy(s->data,
				       e->b.mr->base + e->loff + e->done, n);
			s->src = 0;
			s->off = e->roff + e->done;
			e->done += n;
		}
		s->imm = e->imm;
		s->flags = flags;
		s->region = e->rid;
		s->gen = e->rgen;
		s->len = n;
		s->total = (uint32_t)e->len;
		if (flags & SLOT_LAST) {
			e->seq = c->tx_tail;
			c->sq_push++;
		}
		c->tx_tail++;
		atomic_store_explicit(&s->seq, c->tx_tail,
				      memory_order_release);
		pushed = true;
	}
	c->tx_head = head;
	shm_sq_reap(c, head);
	if (pushed)
		shm_poke(c);
}

/*
 * Pull the next chunk of the PULL slot h (checked against mr) from the
 * writer's memory into ours, spending at most *budget bytes.  0 when the
 * write is all here, 1 when more remains, or an error (the connection has
 * failed).
 */
static int shm_pull(struct fr_tp_conn *c, struct fr_tpb_mr *mr,
		    const struct shm_slot *h, size_t *budget)
{
	size_t n = FR_MIN(*budget, (size_t)h->total - c->rx_pulled);
	struct iovec l = { mr->base + h->off + c->rx_pulled, n };
	struct iovec r = { (void *)(uintptr_t)(h->src + c->rx_pulled), n };
	ssize_t got;

	do
		got = process_vm_readv(c->peer_pid, &l, 1, &r, 1, 0);
	while (got < 0 && errno == EINTR);
	if (got < 0 && errno == ESRCH) {
		fr_tpb_conn_fail(c, FR_EPEER, "peer process %d is gone",
				 (int)c->peer_pid);
		return FR_EPEER;
	}
	if (got <= 0) {
		fr_tpb_conn_fail(c, FR_ERANGE,
				 "cross-memory read from the peer failed: %s",
				 got < 0 ? fr_syserr(errno) : "nothing read");
		return FR_ERANGE;
	}
	/*
	 * Did the writer give up on the connection while we read?  Then its
	 * application may have freed or reused the source, and the bytes we
	 * read may be anything: fail rather than complete the write.
	 *
	 * This suffices: the writer sets "closed" (seq_cst) before anything
	 * lets its application reuse the source (shm_mark_closed, then the
	 * release of the queue, the error completions, close), and it does
	 * not otherwise let the source go before we have moved head past
	 * the slot, which we do only after this check.  Our read is ordered
	 * before the load below by the system call and by the load itself,
	 * a seq_cst read-modify-write (a full barrier; a bare fence is what
	 * ThreadSanitizer cannot follow).
	 * So if the load still sees 0, the writer's store comes later in the
	 * single total order, every reuse of the source later still, and
	 * every byte we read predates them: it is the write's own data.  If
	 * a reuse could have raced with our read, we see the flag.
	 */
	if (atomic_fetch_or_explicit(&c->rx->closed, 0, memory_order_seq_cst)) {
		fr_tpb_conn_fail(c, FR_EPEER,
				 "peer closed while its write was being read");
		return FR_EPEER;
	}
	c->rx_pulled += (size_t)got;
	*budget -= (size_t)got;
	return c->rx_pulled < h->total;
}

/* Has the producer published the slot at index i (shm_slot.seq)? */
static bool shm_slot_ready(const struct shm_ring *r, uint64_t i)
{
	return atomic_load_explicit(&r->slot[i % SHM_SLOTS].seq,
				    memory_order_acquire) == i + 1;
}

/* Take the peer's writes out of the ring, check and place them. */
static void shm_rx(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	size_t budget = SHM_CMA_CHUNK;
	bool got = false;

	if (c->b.state != SHM_UP) /* shm_tx may just have failed it */
		return;

	while (c->b.state == SHM_UP && shm_slot_ready(c->rx, c->rx_head)) {
		const struct shm_slot *s = &c->rx->slot[c->rx_head % SHM_SLOTS];
		struct shm_slot h;
		struct fr_tpb_mr *mr = NULL;
		uint32_t n;
		bool pull, bad;

		if (fr_cqring_full(&tp->cq))
			break;
		/* The peer can rewrite the slot: judge a private copy. */
		memcpy(&h, s, SHM_SLOT_FIELDS);
		pull = h.flags & SLOT_PULL;
		/* A pull has no payload, is its write's only slot, and one
		 * begun in an earlier pass must still be there as it was. */
		if (pull)
			bad = h.len || h.total <= c->rx_pulled ||
			      (h.flags & (SLOT_FIRST | SLOT_LAST)) !=
				      (SLOT_FIRST | SLOT_LAST);
		else
			bad = c->rx_pulled != 0;
		if (bad || h.len > SHM_SLOT_DATA || (h.flags & ~SLOT_FLAGS)) {
			fr_tpb_conn_fail(c, FR_EPROTO, "malformed slot");
			break;
		}
		if (pull && !c->pull_rx) {
			fr_tpb_conn_fail(
				c, FR_EPROTO,
				"a pull, but cross-memory attach was not granted");
			break;
		}
		if (pull && !budget)
			break; /* enough for this pass */
		n = pull ? h.total : h.len;
		if (h.total) {
			uint64_t end = h.off + n;

			/* A pull's whole range is checked now, before each of
			 * its chunks: the region may have gone meanwhile. */
			mr = fr_tpb_region(&tp->b, h.region, h.gen);
			if (!mr || !(mr->access & FR_TP_REMOTE_WRITE) ||
			    end < h.off || end > mr->len) {
				fr_tpb_conn_fail(
					c, FR_ERANGE,
					"write outside a registered region (region %u gen %u, offset %" PRIu64
					", %u bytes)",
					h.region, h.gen, h.off, n);
				break;
			}
			if (pull) {
				if (shm_pull(c, mr, &h, &budget))
					break; /* failed, or more next pass */
				c->rx_pulled = 0;
				/* One pulled write per pass: the caller gets
				 * its completion (uses the bytes, returns
				 * credits) before we copy the next one. */
				budget = 0;
			} else if (h.len) {
				memcpy(mr->base + h.off, s->data, h.len);
			}
		}
		if (h.flags & SLOT_LAST)
			fr_cqring_push(&tp->cq, FR_CQE_RECV, 0, c, 0, h.imm,
				       h.total);
		c->rx_head++;
		got = true;
	}
	/* Moving head past a PULL slot tells the writer that its source is
	 * free again: only after the bytes are here (shm_sq_done). */
	if (got && c->b.state == SHM_UP) {
		atomic_store_explicit(&c->rx->head, c->rx_head,
				      memory_order_release);
		shm_poke(c); /* a producer may wait for room, or a pull */
	}
}

/* The socket of an established connection: wake bytes, or EOF. */
static void shm_sock_drain(struct fr_tp_conn *c)
{
	char buf[64];

	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n > 0)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		fr_tpb_conn_fail(
			c, FR_EPEER,
			"peer rank %d closed the connection (process exited?)",
			c->b.peer);
		return;
	}
}

/* Socket events: new connections, handshakes, wake bytes, dead peers. */
static void shm_events(struct fr_tp *tp)
{
	struct epoll_event ev[32];
	int n = epoll_wait(tp->b.epfd, ev, (int)FR_ARRAY_SIZE(ev), 0);

	for (int i = 0; i < n; i++) {
		struct fr_tp_conn *c = ev[i].data.ptr;

		if (!c) {
			shm_accept_new(tp, fr_now_ms());
			continue;
		}
		if (ev[i].data.ptr == &tp->b.wfd) {
			fr_tpb_wake_drain(&tp->b);
			continue;
		}
		switch (c->b.state) {
		case SHM_GREET:
			shm_greet(c);
			break;
		case SHM_HELLO:
			shm_hello_reply(c);
			break;
		case SHM_UP:
			shm_sock_drain(c);
			break;
		default:
			break;
		}
	}
}

/* Deadlines and retries of handshakes. */
static void shm_timers(struct fr_tp *tp)
{
	uint64_t now = fr_now_ms();
	struct fr_tp_conn *c, *next;

	for (c = tp->b.conns; c; c = next) {
		next = c->b.next;
		if (c->b.state == SHM_UP || c->b.state == SHM_FAILED)
			continue;
		if (now >= c->b.deadline_ms) {
			if (c->b.incoming && !c->b.owned) {
				fr_tpb_conn_free(c);
				continue;
			}
			fr_tpb_conn_fail(
				c, FR_ETIMEDOUT,
				"no connection to rank %d within %d ms (%s)",
				c->b.peer, c->b.tp->b.timeout_ms,
				c->b.last_errno ? fr_syserr(c->b.last_errno)
						: "no reply");
			continue;
		}
		if (c->b.state == SHM_RETRY && now >= c->b.retry_ms &&
		    shm_start_connect(c, now))
			fr_tpb_conn_fail(c, FR_ESYS, "connect: %s",
					 fr_syserr(c->b.last_errno));
	}
}

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

/* ---- the interface -------------------------------------------------------- */

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
		snprintf(errbuf, errlen, "AF_UNIX socket: %s", fr_syserr(errno));
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

/* Is there anything for poll() on this connection right now? */
static bool shm_ready(struct fr_tp_conn *c)
{
	if (c->b.state == SHM_FAILED)
		return fr_tpb_owes(c);
	if (c->b.state != SHM_UP || !c->b.owned)
		return false;
	if (shm_slot_ready(c->rx, c->rx_head))
		return true;
	if (c->b.sq.count) {
		uint64_t head = atomic_load_explicit(&c->tx->head,
						     memory_order_acquire);

		/* A write to retire (a pull the peer has finished: its
		 * consumer pokes us when it moves head), or room for the
		 * next one. */
		if (shm_sq_done(c, head))
			return true;
		return c->sq_push < c->b.sq.count &&
		       c->tx_tail - head < SHM_SLOTS;
	}
	return false;
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

const struct fr_tp_ops fr_shm_ops =
	FR_TPB_OPS("shm", shm_probe, shm_tp_open, shm_connect, fr_tpb_dereg_mem,
		   shm_write_imm, shm_wait, shm_wait_prepare, shm_wait_finish);
