/* SPDX-License-Identifier: MIT */
/* util.h - small helpers: clocks, number parsing, host:port parsing. */
#ifndef FR_UTIL_H
#define FR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sched.h>
#include <stdint.h>
#include <sys/socket.h>

#define FR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FR_MAX(a, b) ((a) > (b) ? (a) : (b))
/* The size of an error message buffer (a communicator's last error). */
#define FR_ERRMSG_MAX 512

#define FR_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Monotonic time in nanoseconds / milliseconds. */
uint64_t fr_now_ns(void);
static inline uint64_t fr_now_ms(void) { return fr_now_ns() / 1000000u; }
/*
 * The same clock in milliseconds as of the kernel's last tick
 * (CLOCK_MONOTONIC_COARSE: a quarter of fr_now_ns()'s cost, for the peer
 * layer's stamps on every message).  It lags by up to fr_coarse_tick_ms(),
 * so a span between two readings may count a tick that has not passed:
 * fr_coarse_since() takes it off, and a timeout on it fires at most a tick
 * late, never early.
 */
uint64_t fr_coarse_ms(void);
uint64_t fr_coarse_tick_ms(void);
/* Milliseconds since the coarse reading t, less a tick (see above). */
static inline uint64_t fr_coarse_since(uint64_t t)
{
	uint64_t now = fr_coarse_ms(), tick = fr_coarse_tick_ms();

	return now > t + tick ? now - t - tick : 0;
}
/* Has the coarse clock moved on since *last (0: never read)?  If so, it
 * records the new reading: for work done at most once per tick on a
 * polling path without a system call (the transports' socket and event
 * channel looks). */
static inline bool fr_coarse_tick_new(uint64_t *last)
{
	uint64_t now = fr_coarse_ms();

	if (now == *last)
		return false;
	*last = now;
	return true;
}

/*
 * a[0..alen) == b[0..blen), in a time that depends on the lengths only,
 * not on where the bytes differ (job tokens).
 */
bool fr_ct_equal(const void *a, size_t alen, const void *b, size_t blen);

/* strerror(err), plus what to do about it where a resource limit is the
 * cause (EMFILE: the process's open-file limit and `ulimit -n`; ENFILE:
 * the system's).  The text lives in a thread-local buffer until the next
 * call in the same thread. */
const char *fr_syserr(int err);

/*
 * Fault in every page of p[0..len), freshly allocated (calloc, a new
 * shared segment) and so still all zeros: it writes a zero into each page.  For
 * rings on the latency path that are written a little further on every message
 * (the transports' completion ring): calloc leaves a large block unmapped, and
 * each first touch of a page then costs a fault in the middle of a call.
 * Under a hypervisor that shadows the guest's page tables (PVM, as on this
 * project's development machines) a first touch traps even where the
 * kernel has mapped the page, 10-50 us against 0.5 us for an 8-byte
 * All-Reduce over shm: before this, every 128th such call, until the ring
 * had wrapped once.
 */
void fr_touch_zeroed(void *p, size_t len);

/* The system's page size (4096 if it will not say). */
size_t fr_page_size(void);

/*
 * Private anonymous pages for len bytes, zeroed, each made on its first
 * touch (or all at once with populate); *mapped gets the length rounded
 * up to whole pages, which fr_pages_free wants.  A table of an entry per
 * rank that a large job writes only here and there costs its written
 * pages only.  NULL when none.
 */
void *fr_pages_new(size_t len, bool populate, size_t *mapped);
void fr_pages_free(void *p, size_t mapped);

/* Make sure this process may open about `need` descriptors: raise the soft
 * RLIMIT_NOFILE up to the hard one if it must.  0, or FR_ESYS with a
 * message in err naming the limits and how to raise them. */
int fr_fd_reserve(long need, char *err, size_t errlen);

/*
 * Which node this process is on: FR_NODE when set (tests and emulated
 * clusters name nodes themselves), else the kernel's boot id and the
 * network namespace (one namespace per host in the netns lab).  Never 0.
 */
uint64_t fr_node_id(void);
uint16_t fr_online_cpus(void);

/*
 * One turn of a busy wait.  For the first FR_SPIN_PURE_NS of a wait only a
 * pause instruction: a system call costs more than a shared-memory message
 * (about a microsecond here, more under a hypervisor), so the peer's reply
 * is caught sooner.  After that sched_yield(), so that a rank sharing its
 * core with another (more ranks than cores) lets it run.  since_ns: when
 * this wait found nothing to do first.
 *
 * Returns true when the yield gave the core away (it took longer than
 * FR_SPIN_SHARED_NS: something else ran on it meanwhile).  Two ranks that
 * share a core yield to each other, never sleep and so are never moved by
 * the scheduler, even with the other cores idle: every call then costs a
 * round trip through the scheduler (24 us instead of 4.6 us for 8 bytes at
 * n = 2 over 1 Gbit/s namespaces, in about one job in three).  The caller
 * then moves to another core now and then (request.c, shared_core()).
 */
#define FR_SPIN_PURE_NS 5000u
#define FR_SPIN_SHARED_NS 5000u
static inline void fr_spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline bool fr_spin_turn(uint64_t since_ns, uint64_t now_ns)
{
	if (now_ns - since_ns < FR_SPIN_PURE_NS) {
		fr_spin_pause();
		return false;
	}
	sched_yield();
	return fr_now_ns() - now_ns > FR_SPIN_SHARED_NS;
}

/* Parse a whole decimal string into [min, max]; 0 or FR_EINVAL. */
int fr_parse_long(const char *s, long min, long max, long *out);
/* Like fr_parse_long, accepting a K/M/G suffix (powers of 1024). */
int fr_parse_size(const char *s, size_t *out);

/* Split "host:port", "[v6]:port" into host (NUL-terminated) and port. */
int fr_parse_hostport(const char *s, char *host, size_t hostlen,
		      uint16_t *port);
/*
 * A TCP port that is free right now (on 127.0.0.1 when local, else on every
 * address): the kernel's choice for a socket bound to port 0, which is then
 * closed; fallback if there is none.  For a rank 0 that publishes its
 * rendezvous port through the launcher (PMI-1, PMIx): a port hashed from
 * the job id can collide with one in use, this one only if someone takes
 * it in the instant before rank 0 binds it.
 */
uint16_t fr_free_port(bool local, uint16_t fallback);
/* Resolve host/port into a sockaddr (numeric or DNS).  0 or FR_EINVAL. */
int fr_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
	       socklen_t *sslen);
/* Numeric "a.b.c.d" / "v6" text of a sockaddr's address (no port). */
int fr_sockaddr_ip(const struct sockaddr *sa, char *buf, size_t len);
/* "a.b.c.d:port" / "[v6]:port" for messages ("?" if unprintable). */
const char *fr_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len);

/*
 * A socket address as a transport address blob, FR_SOCKADDR_BLOB_LEN bytes,
 * little-endian: u8 magic (the transport's own), u8 version, u8 family (4 or
 * 6), u8 0, u16 port, u16 0, u32 IPv6 scope id, 16 address bytes (IPv4 in
 * the first 4, the rest 0).  Decoding refuses anything else.
 */
#define FR_SOCKADDR_BLOB_LEN 28
void fr_sockaddr_encode(uint8_t *b, uint8_t magic,
			const struct sockaddr_storage *sa);
int fr_sockaddr_decode(const void *blob, size_t len, uint8_t magic,
		       struct sockaddr_storage *sa, socklen_t *salen);

/* Little-endian fixed-width stores/loads for wire formats. */
static inline void fr_put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t fr_get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}
static inline void fr_put_le64(uint8_t *p, uint64_t v)
{
	fr_put_le32(p, (uint32_t)v);
	fr_put_le32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t fr_get_le64(const uint8_t *p)
{
	return (uint64_t)fr_get_le32(p) | (uint64_t)fr_get_le32(p + 4) << 32;
}
static inline void fr_put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline uint16_t fr_get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

#endif
