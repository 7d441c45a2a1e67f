/* SPDX-License-Identifier: MIT */
/*
 * shm_conn.c - the shared-memory transport's connections: the abstract
 * AF_UNIX listener's name, the connector's hello with the segment's memfd,
 * the acceptor's checks and reply, the pull probe, retries and deadlines,
 * the sockets' events (wake bytes, EOF of a dead peer), going down.  The
 * design and the wire format are in fr_shm.c, the layout in shm.h.  Calls
 * only the transport base.
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

/* ---- helpers ------------------------------------------------------------- */

void shm_name_addr(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
	size_t n = strnlen(name, SHM_NAME_LEN);

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Abstract namespace: sun_path[0] = 0, no file to clean up. */
	memcpy(sa->sun_path + 1, name, n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* ---- connections ----------------------------------------------------------
 */

struct fr_tp_conn *shm_conn_new(struct fr_tp *tp)
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
	c->line_tx = c->line_rx = NULL;
	c->my_sleep = c->peer_sleep = NULL;
}

/*
 * A connection fails (fr_tpb_conn_fail, which also releases the regions
 * of its queued sends, remembers the error and owes one error completion
 * plus one per queued send if it was established and handed out) or goes
 * away: say so in the segment first, close the socket (the peer reads
 * EOF).  The segment stays mapped until the connection is freed: a peer
 * that put its line and then closed (its communicator destroyed right
 * after its last collective) has still given us that line
 * (shm_line_get).
 */
void shm_conn_down(struct fr_tp_conn *c)
{
	shm_mark_closed(c);
	shm_close_fd(c);
	c->sq_push = 0; /* pushed or not, they all fail now */
}

void shm_conn_free(struct fr_tp_conn *c)
{
	shm_unmap(c);
}

/*
 * Touch every page of the segment now, before any message: the ring we
 * produce by writing a zero into each of its pages (nothing reads them
 * until a slot's seq says so), the ring we consume by reading.  The
 * kernel maps the pages (MAP_POPULATE), but under a hypervisor that
 * shadows page tables each process's first access to a page still traps:
 * without this the first pass through the ring cost 12-25 us a message
 * against 0.5 for an 8-byte All-Reduce at n = 2 (the first 63 calls of
 * every job, and as many after every new connection).
 */
static void shm_warm(struct shm_seg *seg, int side)
{
	const volatile uint8_t *rx =
		(const volatile uint8_t *)&seg->ring[1 - side];
	uint8_t sum = 0;

	fr_touch_zeroed(&seg->ring[side], sizeof(struct shm_ring));
	for (size_t off = 0; off < sizeof(struct shm_ring); off += 4096)
		sum += rx[off];
	(void)sum;
}

static void shm_attach(struct fr_tp_conn *c, struct shm_seg *seg, size_t len)
{
	c->seg = seg;
	c->seg_len = len;
	shm_warm(seg, c->side);
	c->tx = &seg->ring[c->side];
	c->rx = &seg->ring[1 - c->side];
	c->line_tx = seg->line[c->side];
	c->line_rx = seg->line[1 - c->side];
	c->line_want = 1;
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
	struct iovec l = {&got, sizeof(got)};
	struct iovec r = {(void *)(uintptr_t)at, sizeof(got)};
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

/* ---- handshake ------------------------------------------------------------
 */

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
	struct iovec iov = {b, sizeof(b)};
	struct msghdr m = {0};
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
int shm_start_connect(struct fr_tp_conn *c, uint64_t now)
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
	struct iovec iov = {b, sizeof(b)};
	struct msghdr m = {0};
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
	seg = mmap(NULL, seglen, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_POPULATE, mfd, 0);
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
void shm_events(struct fr_tp *tp)
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
void shm_timers(struct fr_tp *tp)
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
