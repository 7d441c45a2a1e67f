/* SPDX-License-Identifier: MIT */
/*
 * tcp_ring - what the network carries with no collective on it: every rank
 * streams to the next rank of a ring over one TCP connection and receives
 * from the previous one, both at once, for a fixed time, and prints the
 * payload rate it received.  A ring All-Reduce's bus bandwidth cannot
 * exceed that rate (each rank's link carries 2 (n-1)/n of the vector each
 * way in 2 (n-1) steps of n-th chunks: its busbw is the rate of one
 * stream), so it is the ceiling under the "line rate" of an emulated
 * link: TCP/IP's headers and the CPUs' share included, the library's work
 * not.  perf/bench/ceiling.sh runs one rank in each emulated host.
 *
 * usage: tcp_ring RANK NRANKS PORT SECONDS HOST0 [HOST1 ...]
 *   rank r listens on HOSTr:PORT+r, connects to the next rank's, and sends
 *   4 MiB writes for SECONDS; the bytes received in the first second are
 *   not counted (slow start).  Prints "rank R: X MB/s received" (MB =
 *   10^6 bytes).  With one host given, every rank is on it.  Exits 3 when
 *   its port is taken (choose another), 1 on other failures, 2 on bad
 *   arguments.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (4u << 20)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int addr_of(const char *host, int port, struct sockaddr_in *a)
{
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

static int die(const char *what)
{
	perror(what);
	return 1;
}

int main(int argc, char **argv)
{
	struct sockaddr_in me, next;
	int rank, n, port, ls, out = -1, in = -1, one = 1;
	double secs, t0, counted_from, end;
	unsigned long long got = 0;
	char *sbuf, *rbuf;

	if (argc < 6) {
		fprintf(stderr,
			"usage: tcp_ring RANK NRANKS PORT SECONDS HOST0 [HOST1 ...]\n");
		return 2;
	}
	rank = atoi(argv[1]);
	n = atoi(argv[2]);
	port = atoi(argv[3]);
	secs = atof(argv[4]);
	if (n < 2 || rank < 0 || rank >= n || port < 1 ||
	    port + n - 1 > 65535 || secs < 1.5 ||
	    (argc - 5 != 1 && argc - 5 != n)) {
		fprintf(stderr,
			"tcp_ring: bad arguments (2 or more ranks, SECONDS >= 1.5, one host or NRANKS)\n");
		return 2;
	}
#define HOST(r) argv[5 + (argc - 5 == 1 ? 0 : (r))]
	if (addr_of(HOST(rank), port + rank, &me) ||
	    addr_of(HOST((rank + 1) % n), port + (rank + 1) % n, &next)) {
		fprintf(stderr, "tcp_ring: not an IPv4 address\n");
		return 2;
	}
	sbuf = calloc(1, CHUNK);
	rbuf = malloc(CHUNK);
	if (!sbuf || !rbuf)
		return 1;
	ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0 ||
	    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		return die("tcp_ring: socket");
	if (bind(ls, (struct sockaddr *)&me, sizeof(me))) {
		int taken = errno == EADDRINUSE;

		die("tcp_ring: bind");
		return taken ? 3 : 1;
	}
	if (listen(ls, 1))
		return die("tcp_ring: listen");
	/* the next rank may not listen yet: retry for 30 s */
	t0 = now_s();
	while (out < 0) {
		out = socket(AF_INET, SOCK_STREAM, 0);
		if (out < 0)
			return die("tcp_ring: socket");
		if (!connect(out, (struct sockaddr *)&next, sizeof(next)))
			break;
		close(out);
		out = -1;
		if (now_s() - t0 > 30)
			return die("tcp_ring: connect");
		usleep(20000);
	}
	/* the previous rank connects within 30 s, or it failed */
	{
		struct pollfd lp = {ls, POLLIN, 0};

		if (poll(&lp, 1, 30000) != 1) {
			fprintf(stderr,
				"tcp_ring: rank %d: the previous rank did not connect within 30 s\n",
				rank);
			return 1;
		}
	}
	in = accept(ls, NULL, NULL);
	if (in < 0)
		return die("tcp_ring: accept");
	setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	t0 = now_s();
	counted_from = t0 + 1.0;
	end = t0 + secs;
	{
		size_t soff = 0;
		bool sending = true;
		double counted_t = 0;

		/* send until the time is up, then shut the write side; receive
		 * until the previous rank has shut its own */
		for (;;) {
			struct pollfd p[2] = {{in, POLLIN, 0},
					      {out, sending ? POLLOUT : 0, 0}};
			double t = now_s();

			if (sending && t >= end) {
				shutdown(out, SHUT_WR);
				sending = false;
			}
			if (poll(p, 2, 100) < 0) {
				if (errno == EINTR)
					continue;
				return die("tcp_ring: poll");
			}
			if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
				ssize_t r = recv(in, rbuf, CHUNK, MSG_DONTWAIT);

				if (r == 0)
					break;
				if (r < 0 && errno != EAGAIN && errno != EINTR)
					return die("tcp_ring: recv");
				t = now_s();
				if (r > 0 && t >= counted_from && t <= end) {
					got += (unsigned long long)r;
					counted_t = t;
				}
			}
			if (sending && (p[1].revents & POLLOUT)) {
				ssize_t w = send(out, sbuf + soff, CHUNK - soff,
						 MSG_DONTWAIT | MSG_NOSIGNAL);

				if (w < 0 && errno != EAGAIN && errno != EINTR)
					return die("tcp_ring: send");
				if (w > 0)
					soff = (soff + (size_t)w) % CHUNK;
			}
		}
		if (counted_t <= counted_from) {
			fprintf(stderr, "tcp_ring: rank %d: nothing received\n",
				rank);
			return 1;
		}
		printf("rank %d: %.2f MB/s received\n", rank,
		       (double)got / (counted_t - counted_from) / 1e6);
	}
	close(in);
	close(out);
	close(ls);
	free(sbuf);
	free(rbuf);
	return 0;
}
