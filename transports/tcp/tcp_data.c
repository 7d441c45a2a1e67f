/* SPDX-License-Identifier: MIT */
/*
 * tcp_data.c - the TCP transport's data path: queued writes leave as
 * header/payload iovec pairs, several per sendmsg(), resuming mid-header or
 * mid-payload; the receiver reads ahead a little, checks each header
 * against its region table and reads the payload straight into the
 * registered memory.  The design and the wire format are in fr_tcp.c, the
 * declarations in tcp.h.  Calls only the transport base.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fastreduce.h"
#include "log.h"
#include "tcp.h"
#include "util.h"

/* ---- data path ----------------------------------------------------------- */

/* The head of the send queue has left: complete it. */
static void tcp_sq_retire(struct fr_tp_conn *c)
{
	fr_tpb_sq_retire(c);
	c->tx_off = 0;
}

/*
 * Send what is queued: the handshake reply first (it precedes every
 * message in the stream), then as many messages as fit in one sendmsg(),
 * but never more than the completion ring can take.  A short send or
 * EAGAIN leaves tx_full set: progress calls again only once epoll says
 * EPOLLOUT (perf/bench/README.md, "System calls per byte").
 */
void tcp_tx(struct fr_tp_conn *c)
{
	struct iovec iov[1 + 2 * TCP_TX_BATCH];
	struct fr_tp *tp = c->b.tp;
	unsigned int i, room;
	size_t hs_left, off, n, offered;
	struct msghdr msg;
	ssize_t sent;
	int niov;

	while (c->b.state == TCP_UP) {
		niov = 0;
		hs_left = c->hs_out_len - c->hs_out_off;
		if (hs_left) {
			iov[niov].iov_base = c->hs_out + c->hs_out_off;
			iov[niov++].iov_len = hs_left;
		}
		room = fr_cqring_room(&tp->cq);
		off = c->tx_off;
		for (i = 0; i < c->b.sq.count && i < TCP_TX_BATCH && i < room;
		     i++) {
			struct tcp_sqe *e = fr_tpb_sq_at(&c->b.sq, i);

			if (off < TCP_HDR_LEN) {
				iov[niov].iov_base = e->hdr + off;
				iov[niov++].iov_len = TCP_HDR_LEN - off;
				off = 0;
			} else {
				off -= TCP_HDR_LEN;
			}
			if (e->len > off) {
				iov[niov].iov_base = (void *)(e->payload + off);
				iov[niov++].iov_len = e->len - off;
			}
			off = 0;
		}
		if (!niov) {
			c->tx_full = false;
			return;
		}
		offered = 0;
		for (int k = 0; k < niov; k++)
			offered += iov[k].iov_len;
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)niov;
		/* MSG_NOSIGNAL: a dead peer is an error code, never SIGPIPE. */
		sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno)) {
				c->tx_full = true;
				return;
			}
			fr_tpb_conn_fail(c, FR_EPEER, "send: %s",
					 fr_syserr(errno));
			return;
		}
		n = (size_t)sent;
		if (hs_left) {
			size_t t = FR_MIN(n, hs_left);

			c->hs_out_off += t;
			n -= t;
		}
		while (n) {
			const struct tcp_sqe *head = fr_tpb_sq_at(&c->b.sq, 0);
			size_t rest = TCP_HDR_LEN + head->len - c->tx_off;

			if (n < rest) {
				c->tx_off += n;
				break;
			}
			n -= rest;
			tcp_sq_retire(c);
		}
		/* A short send on a non-blocking socket: it is full now. */
		c->tx_full = (size_t)sent < offered;
		if (c->tx_full)
			return;
	}
}

/* Judge a complete header; 0 to go on, else the connection has failed. */
static int tcp_rx_header(struct fr_tp_conn *c)
{
	const uint8_t *h = c->rx_hdr;
	struct fr_tp *tp = c->b.tp;
	struct fr_tpb_mr *mr = NULL;
	uint32_t imm, id, gen, len;
	uint64_t off;

	imm = fr_get_le32(h + 4);
	id = fr_get_le32(h + 8);
	gen = fr_get_le32(h + 12);
	off = fr_get_le64(h + 16);
	len = fr_get_le32(h + 24);
	if (h[0] != TCP_VERSION || h[1] != TCP_OP_WRITE_IMM ||
	    fr_get_le16(h + 2) || fr_get_le32(h + 28)) {
		fr_tpb_conn_fail(c, FR_EPROTO,
				 "malformed message header (version %u, op %u)",
				 h[0], h[1]);
		return -1;
	}
	if (len) {
		mr = fr_tpb_region(&tp->b, id, gen);
		if (!mr) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write of %u bytes to unknown or deregistered region %u/%u",
				len, id, gen);
			return -1;
		}
		if (!(mr->access & FR_TP_REMOTE_WRITE)) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write to region %u, which does not allow remote writes",
				id);
			return -1;
		}
		/* Overflow-safe: never form off + len. */
		if (off > mr->len || len > mr->len - off) {
			fr_tpb_conn_fail(
				c, FR_ERANGE,
				"write of %u bytes at offset %llu outside region %u of %zu bytes",
				len, (unsigned long long)off, id, mr->len);
			return -1;
		}
	}
	c->rx_state = TCP_RX_DATA;
	c->rx_dst = mr ? mr->base + off : NULL;
	c->rx_len = len;
	c->rx_done = 0;
	c->rx_off = 0;
	c->rx_imm = imm;
	c->rx_region = id;
	c->rx_gen = gen;
	return 0;
}

/*
 * The socket ran dry (or the budget ran out) in the middle of a payload:
 * its rest arrives in bursts of a few tens of KiB, each of which would wake
 * a sleeping wait and cost a wake-up, an epoll_wait() and a readv() of its
 * own, though nothing completes before the last byte.  SO_RCVLOWAT set to
 * what the payload lacks makes epoll report the socket once that much is
 * there (or the receive buffer fills, or the peer closes: the kernel reports
 * those at any mark), so a 512 KiB segment costs one wake-up instead of
 * eight (perf/bench/README.md, "one wake-up per segment").  The mark never
 * exceeds what the payload lacks, and goes back to 1 before anything else
 * is read, so no header or small message ever waits for bytes that do not
 * come.  A failed setsockopt leaves the old mark: harmless where that is
 * still no more than the payload lacks (only the wake-ups go unsaved),
 * otherwise the connection fails rather than wait for bytes that may never
 * come.
 */
static void tcp_rx_lowat(struct fr_tp_conn *c)
{
	size_t lack = c->rx_state == TCP_RX_DATA ? c->rx_len - c->rx_done : 0;
	int want = lack >= TCP_LOWAT_MIN ? (int)FR_MIN(lack, TCP_LOWAT_MAX) : 1;

	if (want == c->rx_lowat)
		return;
	if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want))) {
		/* the old mark, if it exceeds what is left to come (want 1
		 * means lack < TCP_LOWAT_MIN <= any mark but 1) */
		if ((size_t)c->rx_lowat > lack)
			fr_tpb_conn_fail(c, FR_EPEER, "SO_RCVLOWAT: %s",
					 fr_syserr(errno));
		return;
	}
	c->rx_lowat = want;
}

/*
 * Receive: a header into rx_hdr, then its payload straight into the
 * region.  While a payload lands, the same readv() also takes the next
 * header, so a stream of small writes costs one system call each.  A header
 * is read together with up to TCP_RX_AHEAD bytes more, so that a small
 * message (the eager protocol's header and data) takes one readv instead
 * of two: those bytes are copied out once the header has been checked,
 * which for a few hundred bytes costs less than a system call.
 */
void tcp_rx(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	size_t budget = TCP_RX_BUDGET, take, want;
	struct iovec iov[2];
	bool drained = false;
	int niov;
	ssize_t n;

	for (;;) {
		if (c->rx_state == TCP_RX_HDR && c->rx_off == TCP_HDR_LEN) {
			if (tcp_rx_header(c))
				return;
			continue;
		}
		if (c->rx_state == TCP_RX_DATA && c->rx_done == c->rx_len) {
			if (c->rx_lowat != 1) {
				tcp_rx_lowat(c); /* back to 1 first */
				if (c->b.state != TCP_UP)
					return;
			}
			/* Full ring: stop reading until poll() drains it. */
			if (fr_cqring_full(&tp->cq))
				return;
			fr_cqring_push(&tp->cq, FR_CQE_RECV, 0, c, 0, c->rx_imm,
				       (uint32_t)c->rx_len);
			/* rx_off keeps header bytes that came with it. */
			c->rx_state = TCP_RX_HDR;
			continue;
		}
		/* Bytes read ahead: into the payload or the next header. */
		if (c->rx_ahead_pos < c->rx_ahead_len) {
			const uint8_t *p = c->rx_ahead + c->rx_ahead_pos;

			take = c->rx_ahead_len - c->rx_ahead_pos;
			if (c->rx_state == TCP_RX_DATA) {
				take = FR_MIN(take, c->rx_len - c->rx_done);
				memcpy(c->rx_dst + c->rx_done, p, take);
				c->rx_done += take;
			} else {
				take = FR_MIN(take, TCP_HDR_LEN - c->rx_off);
				memcpy(c->rx_hdr + c->rx_off, p, take);
				c->rx_off += take;
			}
			c->rx_ahead_pos += take;
			if (c->rx_ahead_pos == c->rx_ahead_len)
				c->rx_ahead_pos = c->rx_ahead_len = 0;
			continue;
		}
		/* A short read emptied the socket: another would only say
		 * EAGAIN (epoll tells us when more arrives). */
		if (!budget || drained) {
			tcp_rx_lowat(c);
			return;
		}
		if (c->rx_state == TCP_RX_DATA) {
			iov[0].iov_base = c->rx_dst + c->rx_done;
			iov[0].iov_len = c->rx_len - c->rx_done;
			iov[1].iov_base = c->rx_hdr;
			iov[1].iov_len = TCP_HDR_LEN;
			niov = 2;
		} else {
			iov[0].iov_base = c->rx_hdr + c->rx_off;
			iov[0].iov_len = TCP_HDR_LEN - c->rx_off;
			iov[1].iov_base = c->rx_ahead;
			iov[1].iov_len = TCP_RX_AHEAD;
			niov = 2;
		}
		n = readv(c->fd, iov, niov);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (tcp_would_block(errno)) {
				tcp_rx_lowat(c);
				return;
			}
			fr_tpb_conn_fail(c, FR_EPEER, "receive: %s",
					 fr_syserr(errno));
			return;
		}
		if (n == 0) {
			if (c->rx_state == TCP_RX_HDR && c->rx_off == 0)
				fr_tpb_conn_fail(c, FR_EPEER,
						 "peer closed the connection");
			else
				fr_tpb_conn_fail(
					c, FR_EPEER,
					"peer closed the connection in the middle of a message");
			return;
		}
		want = iov[0].iov_len + (niov > 1 ? iov[1].iov_len : 0);
		drained = (size_t)n < want;
		budget -= FR_MIN((size_t)n, budget);
		if (c->rx_state == TCP_RX_DATA) {
			take = FR_MIN((size_t)n, c->rx_len - c->rx_done);
			c->rx_done += take;
			c->rx_off = (size_t)n - take;
		} else {
			take = FR_MIN((size_t)n, iov[0].iov_len);
			c->rx_off += take;
			c->rx_ahead_pos = 0;
			c->rx_ahead_len = (size_t)n - take;
		}
	}
}

/* Bytes already read that tcp_rx() has not finished with. */
bool tcp_rx_buffered(const struct fr_tp_conn *c)
{
	return (c->rx_state == TCP_RX_HDR && c->rx_off == TCP_HDR_LEN) ||
	       (c->rx_state == TCP_RX_DATA && c->rx_done == c->rx_len) ||
	       c->rx_ahead_pos < c->rx_ahead_len;
}
