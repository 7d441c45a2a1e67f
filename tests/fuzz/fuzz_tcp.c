/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tcp.c - libFuzzer harness: the TCP transport's wire protocol as a
 * stranger (or a broken peer) speaks it.  One endpoint lives for the whole
 * run with two registered regions (one that allows remote writes, one that
 * does not).  Each input is sent over a fresh loopback connection:
 *   first byte even: the input is the whole byte stream, handshake included;
 *   first byte odd:  a valid hello comes first (rank 1, the job nonce), the
 *                    connection is accepted, and the input is the stream of
 *                    write headers and payloads.
 * The endpoint must never crash, write outside its regions (ASan watches
 * the regions' neighbours: they are separate heap blocks) or hang: each
 * input ends when the endpoint has closed the connection or after a bound.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fastreduce.h"
#include "transport.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NONCE 0x0123456789abcdefull
#define REGION 4096

static struct fr_tp *tp;
static struct sockaddr_storage addr;
static socklen_t addrlen;
static uint8_t *region[2];
static struct fr_tp_mr *mr[2];

static void setup(void)
{
	struct fr_tp_params p;
	uint8_t blob[FR_TP_ADDR_MAX];
	size_t blen = sizeof(blob);
	char err[256];

	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	p.rank = 0;
	p.job_nonce = NONCE;
	p.local_ip = "127.0.0.1";
	p.timeout_ms = 1000;
	p.errbuf = err;
	p.errlen = sizeof(err);
	if (fr_tcp_ops.open(&p, &tp, blob, &blen) ||
	    fr_sockaddr_decode(blob, blen, 0xfa, &addr, &addrlen)) {
		fprintf(stderr, "fuzz_tcp: cannot open an endpoint: %s\n", err);
		exit(1);
	}
	for (int i = 0; i < 2; i++) {
		region[i] = malloc(REGION);
		if (!region[i] ||
		    fr_tcp_ops.reg_mem(tp, region[i], REGION,
				       i ? FR_TP_LOCAL_READ
					 : FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
				       &mr[i]))
			exit(1);
	}
}

static void hello(uint8_t *h)
{
	memset(h, 0, 24);
	fr_put_le32(h, 0x43545246u); /* "FRTC" */
	h[4] = 1;                    /* version */
	h[6] = 1;                    /* hello */
	fr_put_le32(h + 8, 1);       /* rank 1 */
	fr_put_le64(h + 16, NONCE);
}

/*
 * A fresh connection to the endpoint.  At ten thousand inputs a second the
 * loopback's ephemeral ports run short (each closed connection holds one in
 * TIME_WAIT; see also the zero linger below): wait for one instead of
 * calling the harness's environment a crash.
 */
static int dial(void)
{
	for (int tries = 0; tries < 500; tries++) {
		int s = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (s >= 0 && !connect(s, (struct sockaddr *)&addr, addrlen))
			return s;
		if (s >= 0)
			close(s);
		if (errno != EADDRNOTAVAIL && errno != EAGAIN &&
		    errno != EINTR && errno != EMFILE && errno != ENFILE)
			break;
		usleep(10000);
	}
	perror("fuzz_tcp: connect");
	exit(1);
}

/* Has the endpoint closed its side? */
static int closed(int s)
{
	uint8_t b[64];
	ssize_t n;

	while ((n = recv(s, b, sizeof(b), MSG_DONTWAIT)) > 0)
		;
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fr_tp_conn *conn = NULL;
	struct fr_tp_cqe cqe[16];
	uint8_t h[24];
	bool stream, want;
	int s, peer = 1;

	if (!size)
		return 0;
	if (!tp)
		setup();
	stream = data[0] & 1;
	data++;
	size--;
	/* a raw stream whose hello names a plausible rank: accept that rank,
	 * so that a valid hello is followed by the stream rather than parked */
	if (!stream && size >= 12 && fr_get_le32(data + 8) < 4096)
		peer = (int)fr_get_le32(data + 8);
	want = stream || size >= 12;
	s = dial();
	if (stream) {
		hello(h);
		if (send(s, h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h))
			goto out;
	}
	/* the whole input, then EOF: the endpoint reads it all and fails */
	for (size_t off = 0; off < size;) {
		ssize_t n = send(s, data + off, size - off, MSG_NOSIGNAL);

		if (n <= 0)
			break;
		off += (size_t)n;
	}
	shutdown(s, SHUT_WR);
	for (int i = 0; i < 400; i++) {
		int n = fr_tcp_ops.poll(tp, cqe, 16);

		if (n < 0)
			abort(); /* the endpoint itself must survive */
		if (want && !conn &&
		    fr_tcp_ops.accept(tp, peer, &conn) != FR_EAGAIN && !conn)
			want = false; /* refused: nothing to accept */
		if (closed(s))
			break;
		if (!n)
			fr_tcp_ops.wait(tp, 1);
	}
out:
	if (conn)
		fr_tcp_ops.close_conn(conn);
	/* a reset, not a FIN: no TIME_WAIT left holding the port */
	setsockopt(s, SOL_SOCKET, SO_LINGER,
		   &(struct linger){ .l_onoff = 1, .l_linger = 0 },
		   sizeof(struct linger));
	close(s);
	return 0;
}
