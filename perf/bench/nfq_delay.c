/* SPDX-License-Identifier: MIT */
/*
 * nfq_delay - a user-space constant-delay line for kernels without sch_netem,
 * used by perf/bench/netns.sh for --delay-ms.  Built at run time by the
 * harness (cc nfq_delay.c -lnetfilter_queue -lnfnetlink); not part of the
 * autotools build.
 *
 * It runs inside one emulated host's network namespace, next to the rule
 *     iptables-legacy -t raw -A PREROUTING -i eth0 -j NFQUEUE --queue-num Q
 * and gives every packet queued there an ACCEPT verdict D microseconds after
 * it arrived.  Design (after the shared netns-lab's delay line):
 *  - only metadata is copied to user space (NFQNL_COPY_META), GSO packets are
 *    queued whole (NFQA_CFG_F_GSO), so the cost is per skb, not per byte;
 *  - the delay is constant, hence release order = arrival order, and one
 *    batch verdict (nfq_set_verdict_batch: every id <= last) releases all
 *    packets that are due;
 *  - it delays on ingress, so the packets it holds no longer count against
 *    the sender's TCP small-queue budget (a delay on the sender's egress
 *    would throttle a single TCP stream).
 * Every packet between two hosts enters exactly one host's eth0, so the
 * one-way delay host-to-host is D and the RTT 2D (plus the shaper's queue).
 * Precision depends on free CPU: on a loaded 2-core box expect jitter of a
 * few hundred microseconds.
 *
 * usage: nfq_delay --delay-us D [--queue Q] [--maxlen M]
 * SIGTERM/SIGINT: release everything still held, print counters, exit 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <arpa/inet.h>

#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define HOLD (1u << 20) /* packets held at most; beyond that: no delay */

static struct {
	uint32_t id;
	uint64_t due_ns;
} held[HOLD];
static uint32_t head, tail; /* held[head..tail) in arrival order */
static uint64_t delay_ns;
static unsigned long long n_pkts, n_undelayed, max_held;
static volatile sig_atomic_t stopping;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg,
		     struct nfq_data *nfa, void *arg)
{
	struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
	uint32_t id;

	(void)msg;
	(void)arg;
	if (!ph)
		return 0;
	id = ntohl(ph->packet_id);
	n_pkts++;
	if (tail - head >= HOLD) {
		/* Full: pass it on now rather than drop it (would reorder,
		 * but only in a pathological overload). */
		nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
		n_undelayed++;
		return 0;
	}
	held[tail % HOLD].id = id;
	held[tail % HOLD].due_ns = now_ns() + delay_ns;
	tail++;
	if (tail - head > max_held)
		max_held = tail - head;
	return 0;
}

static void release(struct nfq_q_handle *qh, int everything)
{
	uint64_t t = now_ns();
	uint32_t last = head;

	while (last != tail && (everything || held[last % HOLD].due_ns <= t))
		last++;
	if (last == head)
		return;
	nfq_set_verdict_batch(qh, held[(last - 1) % HOLD].id, NF_ACCEPT);
	head = last;
}

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

int main(int argc, char **argv)
{
	static char buf[1 << 16] __attribute__((aligned(8)));
	long long delay_us = -1;
	unsigned maxlen = 200000;
	int queue = 0, fd;
	struct nfq_handle *h;
	struct nfq_q_handle *qh;
	struct sigaction sa;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--delay-us"))
			delay_us = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--queue"))
			queue = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--maxlen"))
			maxlen = (unsigned)atoi(argv[i + 1]);
		else
			delay_us = -1, i = argc;
	}
	if (delay_us < 0) {
		fprintf(stderr, "usage: nfq_delay --delay-us D [--queue Q] [--maxlen M]\n");
		return 2;
	}
	delay_ns = (uint64_t)delay_us * 1000u;
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* wake within 1 us */

	h = nfq_open();
	if (!h) {
		perror("nfq_delay: nfq_open");
		return 1;
	}
	qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
	if (!qh) {
		perror("nfq_delay: nfq_create_queue");
		return 1;
	}
	if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
		perror("nfq_delay: nfq_set_mode");
		return 1;
	}
	nfq_set_queue_maxlen(qh, maxlen);
	if (nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
		fprintf(stderr, "nfq_delay: warning: no NFQA_CFG_F_GSO\n");
	nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20);
	fd = nfq_fd(h);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	fprintf(stderr, "nfq_delay: queue %d, delay %lld us: ready\n", queue,
		delay_us);

	while (!stopping) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		struct timespec to, *top = NULL;
		int r;

		if (head != tail) {
			uint64_t t = now_ns(), d = held[head % HOLD].due_ns;
			uint64_t w = d > t ? d - t : 0;

			to.tv_sec = (time_t)(w / 1000000000u);
			to.tv_nsec = (long)(w % 1000000000u);
			top = &to;
		}
		r = ppoll(&p, 1, top, NULL);
		if (r < 0 && errno != EINTR) {
			perror("nfq_delay: ppoll");
			break;
		}
		if (r > 0 && (p.revents & POLLIN)) {
			for (;;) {
				ssize_t n = recv(fd, buf, sizeof(buf),
						 MSG_DONTWAIT);

				if (n < 0) {
					if (errno == ENOBUFS) {
						/* netlink overrun: the kernel
						 * dropped verdict requests */
						fprintf(stderr, "nfq_delay: ENOBUFS\n");
						continue;
					}
					break;
				}
				nfq_handle_packet(h, buf, (int)n);
			}
		}
		release(qh, 0);
	}
	release(qh, 1);
	fprintf(stderr,
		"nfq_delay: queue %d, delay %lld us: %llu packets, at most %llu held, %llu passed undelayed\n",
		queue, delay_us, n_pkts, max_held, n_undelayed);
	nfq_destroy_queue(qh);
	nfq_close(h);
	return 0;
}
