/* SPDX-License-Identifier: MIT */
/* util.c - clocks, number and address parsing. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"

uint64_t fr_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t fr_coarse_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t fr_coarse_tick_ms(void)
{
	/* the clock's resolution, whole milliseconds rounded up, plus 1 for
	 * the truncation to milliseconds; read once */
	static _Atomic uint64_t tick;
	uint64_t t = atomic_load_explicit(&tick, memory_order_relaxed);
	struct timespec res;

	if (t)
		return t;
	t = 1;
	if (!clock_getres(CLOCK_MONOTONIC_COARSE, &res))
		t += ((uint64_t)res.tv_sec * 1000000000u +
		      (uint64_t)res.tv_nsec + 999999u) /
		     1000000u;
	atomic_store_explicit(&tick, t, memory_order_relaxed);
	return t;
}

size_t fr_page_size(void)
{
	long pg = sysconf(_SC_PAGESIZE);

	return pg > 0 ? (size_t)pg : 4096;
}

void fr_touch_zeroed(void *p, size_t len)
{
	volatile uint8_t *b = p;
	size_t step = fr_page_size();

	for (size_t off = 0; off < len; off += step)
		b[off] = 0;
}

void *fr_pages_new(size_t len, bool populate, size_t *mapped)
{
	size_t ps = fr_page_size();
	void *p;

	*mapped = ((len ? len : 1) + ps - 1) / ps * ps;
	p = mmap(NULL, *mapped, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0),
		 -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void fr_pages_free(void *p, size_t mapped)
{
	if (p)
		munmap(p, mapped);
}

int fr_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	if (!s || !*s || isspace((unsigned char)*s))
		return FR_EINVAL;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return FR_EINVAL;
	*out = v;
	return 0;
}

int fr_parse_size(const char *s, size_t *out)
{
	unsigned long long v, mul = 1;
	char *end;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return FR_EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return FR_EINVAL;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (v && mul > SIZE_MAX / v))
		return FR_EINVAL;
	*out = (size_t)(v * mul);
	return 0;
}

uint16_t fr_free_port(bool local, uint16_t fallback)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint16_t port = fallback;

	if (fd < 0)
		return fallback;
	sa.sin_addr.s_addr = htonl(local ? INADDR_LOOPBACK : INADDR_ANY);
	if (!bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &len) && ntohs(sa.sin_port))
		port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

int fr_parse_hostport(const char *s, char *host, size_t hostlen,
		      uint16_t *port)
{
	const char *colon, *hs = s, *he;
	long p;

	if (!s || !*s)
		return FR_EINVAL;
	if (*s == '[') {
		he = strchr(s, ']');
		if (!he || he[1] != ':')
			return FR_EINVAL;
		hs = s + 1;
		colon = he + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || memchr(s, ':', (size_t)(colon - s)))
			return FR_EINVAL; /* bare IPv6 needs brackets */
		he = colon;
	}
	if (he == hs || (size_t)(he - hs) >= hostlen)
		return FR_EINVAL;
	if (fr_parse_long(colon + 1, 1, 65535, &p))
		return FR_EINVAL;
	memcpy(host, hs, (size_t)(he - hs));
	host[he - hs] = '\0';
	*port = (uint16_t)p;
	return 0;
}

int fr_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
	       socklen_t *sslen)
{
	struct addrinfo hints, *res;
	char ps[8];

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%u", port);
	if (getaddrinfo(host, ps, &hints, &res) || !res)
		return FR_EINVAL;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sslen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

int fr_sockaddr_ip(const struct sockaddr *sa, char *buf, size_t len)
{
	const void *a;

	if (sa->sa_family == AF_INET)
		a = &((const struct sockaddr_in *)sa)->sin_addr;
	else if (sa->sa_family == AF_INET6)
		a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
	else
		return FR_EINVAL;
	return inet_ntop(sa->sa_family, a, buf, (socklen_t)len) ? 0 : FR_EINVAL;
}

const char *fr_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN + 16], serv[8];
	socklen_t sl = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
						   sizeof(struct sockaddr_in);

	if (getnameinfo(sa, sl, host, sizeof(host), serv, sizeof(serv),
			NI_NUMERICHOST | NI_NUMERICSERV))
		snprintf(buf, len, "?");
	else if (sa->sa_family == AF_INET6)
		snprintf(buf, len, "[%s]:%s", host, serv);
	else
		snprintf(buf, len, "%s:%s", host, serv);
	return buf;
}

#define SOCKADDR_BLOB_VERSION 1

void fr_sockaddr_encode(uint8_t *b, uint8_t magic,
			const struct sockaddr_storage *sa)
{
	memset(b, 0, FR_SOCKADDR_BLOB_LEN);
	b[0] = magic;
	b[1] = SOCKADDR_BLOB_VERSION;
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		b[2] = 4;
		fr_put_le16(b + 4, ntohs(in->sin_port));
		memcpy(b + 12, &in->sin_addr, 4);
	} else {
		const struct sockaddr_in6 *in6 =
			(const struct sockaddr_in6 *)sa;

		b[2] = 6;
		fr_put_le16(b + 4, ntohs(in6->sin6_port));
		fr_put_le32(b + 8, in6->sin6_scope_id);
		memcpy(b + 12, &in6->sin6_addr, 16);
	}
}

int fr_sockaddr_decode(const void *blob, size_t len, uint8_t magic,
		       struct sockaddr_storage *sa, socklen_t *salen)
{
	const uint8_t *b = blob;
	uint16_t port;

	if (len != FR_SOCKADDR_BLOB_LEN || b[0] != magic ||
	    b[1] != SOCKADDR_BLOB_VERSION || b[3] || fr_get_le16(b + 6))
		return FR_EPROTO;
	port = fr_get_le16(b + 4);
	if (!port)
		return FR_EPROTO;
	memset(sa, 0, sizeof(*sa));
	if (b[2] == 4) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;

		if (fr_get_le32(b + 8))
			return FR_EPROTO;
		for (int i = 16; i < FR_SOCKADDR_BLOB_LEN; i++)
			if (b[i])
				return FR_EPROTO;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		memcpy(&in->sin_addr, b + 12, 4);
		*salen = sizeof(*in);
	} else if (b[2] == 6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		in6->sin6_scope_id = fr_get_le32(b + 8);
		memcpy(&in6->sin6_addr, b + 12, 16);
		*salen = sizeof(*in6);
	} else {
		return FR_EPROTO;
	}
	return 0;
}

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	while (n--) {
		h ^= *b++;
		h *= 1099511628211ull;
	}
	return h;
}

uint64_t fr_node_id(void)
{
	uint64_t h = 1469598103934665603ull;
	const char *node = getenv("FR_NODE");
	char boot[64] = "";
	struct stat st;
	FILE *f;

	if (node && *node)
		return fnv64(h, node, strlen(node)) | 1;
	f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = 0;
		fclose(f);
	}
	h = fnv64(h, boot, strlen(boot));
	if (!stat("/proc/self/ns/net", &st))
		h = fnv64(h, &st.st_ino, sizeof(st.st_ino));
	return h | 1;
}

/* The host's online CPUs (not this process's affinity: a launcher that
 * binds each rank to its own core does not oversubscribe the node), 1 to
 * 65535: what a rank tells the others at the rendezvous. */
uint16_t fr_online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 65535 ? 65535 : (uint16_t)n;
}

bool fr_ct_equal(const void *a, size_t alen, const void *b, size_t blen)
{
	const volatile unsigned char *x = a, *y = b;
	size_t n = alen > blen ? alen : blen;
	unsigned char d = alen != blen;

	for (size_t i = 0; i < n; i++)
		d |= (unsigned char)((i < alen ? x[i] : 0) ^
				     (i < blen ? y[i] : 0));
	return d == 0;
}

const char *fr_syserr(int err)
{
	static _Thread_local char buf[256];
	struct rlimit rl;

	if (err == EMFILE && !getrlimit(RLIMIT_NOFILE, &rl)) {
		snprintf(buf, sizeof(buf),
			 "%s (this process may open %llu; raise the limit: ulimit -n, or nofile in /etc/security/limits.conf)",
			 strerror(err), (unsigned long long)rl.rlim_cur);
		return buf;
	}
	if (err == ENFILE) {
		snprintf(buf, sizeof(buf),
			 "%s (the system-wide limit: raise fs.file-max)",
			 strerror(err));
		return buf;
	}
	return strerror(err);
}

int fr_fd_reserve(long need, char *err, size_t errlen)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return 0; /* cannot tell: let the calls say it */
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)need)
		return 0;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)need) {
		rlim_t was = rl.rlim_cur;

		rl.rlim_cur = (rlim_t)need;
		if (!setrlimit(RLIMIT_NOFILE, &rl)) {
			fr_info("raised the open-file limit from %llu to %ld descriptors",
				(unsigned long long)was, need);
			return 0;
		}
	}
	snprintf(err, errlen,
		 "this rank needs about %ld file descriptors but may open only %llu (soft limit; hard limit %llu): raise the limit (ulimit -n %ld, or nofile in /etc/security/limits.conf)",
		 need, (unsigned long long)rl.rlim_cur,
		 (unsigned long long)rl.rlim_max, need);
	return FR_ESYS;
}
