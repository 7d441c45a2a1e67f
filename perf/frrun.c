/* SPDX-License-Identifier: MIT */
/*
 * frrun - start N local ranks of a libfastreduce program.
 *
 *   frrun -n N [--transport auto|tcp|shm|verbs|shm+tcp|shm+verbs]
 *         [--timeout SEC] [--host ADDR]
 *         [--port P] [--no-prefix] [--keep-going] [--respawn N]
 *         [--env NAME=VALUE]...
 *         [--] PROGRAM [ARGS...]
 *
 * Every rank is fork()+execvp() of PROGRAM with the environment that
 * fr_comm_create_from_env() reads (FR_RANK, FR_NRANKS, FR_LOCAL_RANK,
 * FR_LOCAL_SIZE, FR_RENDEZVOUS, FR_JOB_TOKEN, FR_TRANSPORT).  Variables of
 * other launchers are removed from the ranks' environment: the library
 * prefers FR_* anyway, but a stray SLURM_PROCID from an enclosing srun must
 * never be mistaken for this job's rank.
 *
 * Output: each rank's stdout and stderr come through pipes and are re-emitted
 * line by line as "[R] line" on the same stream, so lines of different ranks
 * never interleave mid-line.  One poll loop (ppoll, with the signals we care
 * about blocked everywhere else) multiplexes pipes, SIGCHLD, forwarded
 * signals and the timers, so there is no race between "a child exited" and
 * "we went to sleep".
 *
 * Failure: the first rank that exits non-zero or dies from a signal is
 * reported once; the others get SIGTERM, then SIGKILL after a grace period,
 * and frrun exits with that first status (128+signal for signals), like
 * mpirun and srun --kill-on-bad-exit.  --keep-going lets the others run on
 * (failure-handling tests want to see what the survivors report).
 * --respawn N replaces a rank that fails, up to N times in all, by a new
 * process of the same program with FR_JOIN=1 (and the rank's FR_RANK), for
 * the survivors to re-admit with fr_comm_grow: fr_comm_create_from_env()
 * joins then; a failure so replaced does not count as the job's.
 *
 * Each rank runs in its own process group so that SIGTERM also reaches what
 * the rank started (a shell wrapper's children), and a rank that outlives a
 * SIGKILLed frrun is killed by PR_SET_PDEATHSIG.  frrun is also the
 * subreaper of what the ranks leave behind, so no zombie outlives the job
 * even under an init that never reaps.  frrun links no library: it must
 * work before libfastreduce is even installed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perf_common.h"

#define MAX_RANKS 1024
/* Longest line kept whole; a longer one is cut (with a newline added) so a
 * rank that never prints '\n' cannot make us buffer without bound. */
#define LINE_CAP 65536
#define GRACE_NS (3ull * 1000000000u) /* SIGTERM -> SIGKILL            */
#define DRAIN_NS (1ull * 1000000000u) /* output after the last rank    */
#define JOINERS_NS (10ull * 1000000000u) /* newcomers alone, then stopped */
#define TOKEN_BYTES 16

/* Variables of other launchers that fr_comm_create_from_env() would read. */
static const char *const foreign_vars[] = {
	"OMPI_COMM_WORLD_RANK",
	"OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_RANK",
	"OMPI_COMM_WORLD_LOCAL_SIZE",
	"OMPI_COMM_WORLD_NODE_RANK",
	"PMI_RANK",
	"PMI_SIZE",
	"PMIX_RANK",
	"SLURM_PROCID",
	"SLURM_NTASKS",
	"SLURM_LOCALID",
	"SLURM_NPROCS",
	"RANK",
	"WORLD_SIZE",
	"LOCAL_RANK",
	"LOCAL_WORLD_SIZE",
};

enum { BIND_AUTO, BIND_CORE, BIND_NONE };

/* Forwarded to the ranks when frrun receives them. */
static const int fwd_signals[] = {SIGINT, SIGTERM, SIGHUP};

struct opts {
	int nranks;
	const char *transport;
	double timeout_s; /* 0: none */
	const char *host;
	long port; /* 0: pick a free one */
	bool no_prefix;
	bool keep_going;   /* a failure does not stop the others */
	int respawn;	   /* replacements left (--respawn) */
	int bind;          /* BIND_AUTO, BIND_CORE, BIND_NONE */
	const char **envs; /* NAME=VALUE strings from --env */
	int nenvs;
	char **argv; /* the program and its arguments */
};

struct outstream {
	int fd;	   /* 1 or 2 */
	bool dead; /* EPIPE etc.: discard from now on */
	char buf[LINE_CAP + 32];
	size_t len;
};

struct rank {
	pid_t pid;     /* 0 once reaped */
	int fd[2];     /* read ends of stdout, stderr pipes; -1 closed */
	char *line[2]; /* partial line per stream */
	size_t len[2];
	bool joiner; /* a newcomer (--respawn) */
};

static volatile sig_atomic_t got_sigchld;
static volatile sig_atomic_t got_signal; /* last forwarded signal */
static volatile sig_atomic_t signal_count;

static void on_sigchld(int sig)
{
	got_sigchld = 1;
}

static void on_forward(int sig)
{
	got_signal = sig;
	signal_count++;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: frrun -n N [OPTIONS] [--] PROGRAM [ARGS...]\n"
		"Start N local ranks of PROGRAM for libfastreduce.\n"
		"\n"
		"  -n, --np N              number of ranks (1..%d)\n"
		"  -x, --transport NAME    set FR_TRANSPORT=auto|tcp|shm|shm+tcp|verbs|\n"
		"                          shm+verbs\n"
		"  -t, --timeout SEC       kill everything after SEC seconds, exit 124\n"
		"  -H, --host ADDR         rendezvous address (default 127.0.0.1)\n"
		"  -p, --port P            rendezvous port (default: a free one)\n"
		"      --no-prefix         let ranks write to stdout/stderr directly\n"
		"  -k, --keep-going        a failing rank does not stop the others\n"
		"  -r, --respawn N         replace a failing rank by a newcomer (FR_JOIN=1)\n"
		"                          that fr_comm_grow re-admits, up to N times\n"
		"  -b, --bind auto|core|none  pin rank r to the r-th CPU frrun may use\n"
		"                          (auto, the default: only if each rank gets one)\n"
		"  -e, --env NAME=VALUE    set a variable for every rank (repeatable)\n"
		"  -h, --help              this text\n"
		"\n"
		"Ranks get FR_RANK, FR_NRANKS, FR_LOCAL_RANK, FR_LOCAL_SIZE, FR_RENDEZVOUS,\n"
		"FR_JOB_TOKEN (and FR_TRANSPORT).  Exit status: 0, the first failing rank's\n"
		"status (128+signal if killed), 124 on timeout, 2 on bad usage.\n",
		MAX_RANKS);
}

/*
 * Pin the rank to one CPU, as mpirun does (--bind-to core): rank r gets the
 * r-th CPU of those frrun itself may run on.  Unpinned ranks that busy-poll
 * each other get moved onto one CPU now and then by the scheduler, and a
 * microsecond exchange becomes a context switch.  auto pins only when every
 * rank gets a CPU of its own: with more ranks than CPUs they must share, and
 * the scheduler shares better than a fixed placement.
 */
static void bind_rank(const struct opts *o, int rank)
{
	cpu_set_t allowed, one;
	int n = 0;

	if (o->bind == BIND_NONE ||
	    sched_getaffinity(0, sizeof(allowed), &allowed))
		return;
	if (o->bind == BIND_AUTO && CPU_COUNT(&allowed) < o->nranks)
		return;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (!CPU_ISSET(cpu, &allowed))
			continue;
		if (n++ == rank % CPU_COUNT(&allowed)) {
			CPU_ZERO(&one);
			CPU_SET(cpu, &one);
			if (sched_setaffinity(0, sizeof(one), &one))
				fprintf(stderr,
					"frrun: rank %d: cannot bind to CPU %d: %s\n",
					rank, cpu, strerror(errno));
			return;
		}
	}
}

static int bad_usage(const char *fmt, const char *arg)
{
	fputs("frrun: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\nTry 'frrun --help' for more information.\n", stderr);
	return 2;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{"np", required_argument, NULL, 'n'},
		{"transport", required_argument, NULL, 'x'},
		{"timeout", required_argument, NULL, 't'},
		{"host", required_argument, NULL, 'H'},
		{"port", required_argument, NULL, 'p'},
		{"no-prefix", no_argument, NULL, 'P'},
		{"keep-going", no_argument, NULL, 'k'},
		{"respawn", required_argument, NULL, 'r'},
		{"bind", required_argument, NULL, 'b'},
		{"env", required_argument, NULL, 'e'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	long v;
	int c;

	memset(o, 0, sizeof(*o));
	o->host = "127.0.0.1";
	o->envs = calloc((size_t)argc, sizeof(*o->envs));
	if (!o->envs) {
		perror("frrun");
		return 1;
	}
	opterr = 0;
	/* '+': stop at the program name, its options are its own. */
	while ((c = getopt_long(argc, argv, "+:n:x:t:H:p:e:b:r:kh", lopts,
				NULL)) != -1) {
		switch (c) {
		case 'n':
			if (pc_parse_long(optarg, 1, MAX_RANKS, &v))
				return bad_usage("invalid number of ranks '%s'",
						 optarg);
			o->nranks = (int)v;
			break;
		case 'x':
			if (strcmp(optarg, "auto") && strcmp(optarg, "tcp") &&
			    strcmp(optarg, "shm") && strcmp(optarg, "shm+tcp") &&
			    strcmp(optarg, "verbs") &&
			    strcmp(optarg, "shm+verbs"))
				return bad_usage(
					"unknown transport '%s' (auto, tcp, shm, shm+tcp, verbs, shm+verbs)",
					optarg);
			o->transport = optarg;
			break;
		case 't':
			if (pc_parse_seconds(optarg, &o->timeout_s) ||
			    o->timeout_s <= 0)
				return bad_usage("invalid timeout '%s'",
						 optarg);
			break;
		case 'H':
			if (!*optarg)
				return bad_usage("empty host%s", "");
			o->host = optarg;
			break;
		case 'p':
			if (pc_parse_long(optarg, 1, 65535, &o->port))
				return bad_usage("invalid port '%s'", optarg);
			break;
		case 'P':
			o->no_prefix = true;
			break;
		case 'k':
			o->keep_going = true;
			break;
		case 'r':
			if (pc_parse_long(optarg, 0, 1 << 20, &v))
				return bad_usage("invalid respawn count '%s'",
						 optarg);
			o->respawn = (int)v;
			break;
		case 'b':
			if (!strcmp(optarg, "auto"))
				o->bind = BIND_AUTO;
			else if (!strcmp(optarg, "core"))
				o->bind = BIND_CORE;
			else if (!strcmp(optarg, "none"))
				o->bind = BIND_NONE;
			else
				return bad_usage(
					"unknown binding '%s' (auto, core, none)",
					optarg);
			break;
		case 'e': {
			const char *eq = strchr(optarg, '=');

			if (!eq || eq == optarg)
				return bad_usage(
					"--env wants NAME=VALUE, got '%s'",
					optarg);
			o->envs[o->nenvs++] = optarg;
			break;
		}
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			return bad_usage("option '%s' needs a value",
					 argv[optind - 1]);
		default:
			/* getopt leaves the bad option in argv[optind - 1]. */
			return bad_usage("unknown option '%s'",
					 argv[optind - 1]);
		}
	}
	if (!o->nranks)
		return bad_usage("-n N is required%s", "");
	if (optind >= argc)
		return bad_usage("no program given%s", "");
	o->argv = argv + optind;
	return 0;
}

/* Can port be bound on ai's address (nothing listens there now)? */
static bool port_free(const struct addrinfo *ai, long port)
{
	struct sockaddr_storage ss;
	bool ok = false;
	int fd;

	if (ai->ai_addrlen > sizeof(ss))
		return false;
	memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
	else if (ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
	else
		return false;
	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0)
		return false;
	ok = bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) == 0;
	close(fd);
	return ok;
}

/*
 * A port below the kernel's ephemeral range whose next two are free too:
 * the rendezvous takes it, the Python package's torch store (fastreduce.
 * torch) the port two above.  Ports in the ephemeral range would do for the
 * first, but the ones next to it are those the kernel hands out to the next
 * connections on the host: a test suite's other jobs took one there while
 * its store was starting (EADDRINUSE).  0 if none found in a few tries.
 */
static long pick_low_port(const struct addrinfo *ai)
{
	unsigned int seed = (unsigned int)getpid() ^ (unsigned int)time(NULL);
	long lo = 10000, hi = 32768; /* below Linux's default 32768-60999 */
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	long elo, ehi;

	if (f) {
		if (fscanf(f, "%ld %ld", &elo, &ehi) == 2 && elo < hi)
			hi = elo;
		fclose(f);
	}
	/* an ephemeral range from (nearly) the bottom: no room below it */
	if (hi < lo + 1000)
		return 0;
	for (int tries = 0; tries < 64; tries++) {
		long p = lo +
			 (long)(rand_r(&seed) % (unsigned int)(hi - lo - 3));

		if (port_free(ai, p) && port_free(ai, p + 1) &&
		    port_free(ai, p + 2))
			return p;
	}
	return 0;
}

/*
 * Find a free port: one below the ephemeral range with its next two free
 * (pick_low_port), else by binding port 0 on the rendezvous host and
 * reading the kernel's choice back.  The socket is closed before rank 0
 * binds it, so in theory another process could take it in between, and a
 * collision shows up as a clear bind error in rank 0, not as a wrong job.
 */
static int pick_port(const char *host, long *port)
{
	struct addrinfo hints, *res = NULL, *ai;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int fd = -1, rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(host, "0", &hints, &res);
	if (rc) {
		fprintf(stderr, "frrun: cannot resolve '%s': %s\n", host,
			gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		*port = pick_low_port(ai);
		if (*port) {
			freeaddrinfo(res);
			return 0;
		}
	}
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
			    ai->ai_protocol);
		if (fd < 0)
			continue;
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		fprintf(stderr,
			"frrun: cannot bind a port on '%s' (is it a local address?): %s\n",
			host, strerror(errno));
		goto fail;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &sl)) {
		perror("frrun: getsockname");
		goto fail_close;
	}
	if (ss.ss_family == AF_INET)
		*port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	else
		*port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	close(fd);
	freeaddrinfo(res);
	return 0;

fail_close:
	close(fd);
fail:
	freeaddrinfo(res);
	return -1;
}

/* A random job token so that ranks of two concurrent jobs that happen to
 * share a port can never join each other. */
static int make_token(char *hex, size_t len)
{
	unsigned char raw[TOKEN_BYTES];
	size_t got = 0;

	while (got < sizeof(raw)) {
		ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got < sizeof(raw)) {
		/* Old kernels without getrandom(2). */
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

		if (fd < 0 ||
		    read(fd, raw, sizeof(raw)) != (ssize_t)sizeof(raw)) {
			fprintf(stderr, "frrun: cannot read random bytes: %s\n",
				strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		close(fd);
	}
	for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < len; i++)
		snprintf(hex + 2 * i, 3, "%02x", raw[i]);
	return 0;
}

static void set_env_int(const char *name, long v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%ld", v);
	setenv(name, buf, 1);
}

/* In the child, between fork and exec: never returns. */
static void __attribute__((noreturn))
exec_rank(const struct opts *o, int rank, bool join, const char *rdv,
	  const char *token, const sigset_t *origmask, int out_fd, int err_fd,
	  pid_t parent)
{
	int fd;

	/* Our own group, so that the launcher can signal the whole subtree. */
	setpgid(0, 0);
	/* Die with the launcher, even if it is SIGKILLed. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127); /* the launcher died before prctl took effect */

	for (size_t i = 0; i < PC_ARRAY_SIZE(fwd_signals); i++)
		signal(fwd_signals[i], SIG_DFL);
	signal(SIGCHLD, SIG_DFL);
	signal(SIGPIPE, SIG_DFL); /* ignored in frrun; exec would keep that */
	sigprocmask(SIG_SETMASK, origmask, NULL);

	/*
	 * The rank is in a background process group: reading a terminal
	 * would stop it with SIGTTIN, so it gets /dev/null instead.  A pipe
	 * or file on stdin goes to rank 0 only, as with mpirun.
	 */
	if (rank != 0 || isatty(STDIN_FILENO)) {
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0 && fd != STDIN_FILENO) {
			dup2(fd, STDIN_FILENO);
			close(fd);
		}
	}
	if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0)
		_exit(127);
	if (err_fd >= 0 && dup2(err_fd, STDERR_FILENO) < 0)
		_exit(127);

	bind_rank(o, rank);
	for (size_t i = 0; i < PC_ARRAY_SIZE(foreign_vars); i++)
		unsetenv(foreign_vars[i]);
	set_env_int("FR_RANK", rank);
	set_env_int("FR_NRANKS", o->nranks);
	set_env_int("FR_LOCAL_RANK", rank);
	set_env_int("FR_LOCAL_SIZE", o->nranks);
	setenv("FR_RENDEZVOUS", rdv, 1);
	setenv("FR_JOB_TOKEN", token, 1);
	if (o->transport)
		setenv("FR_TRANSPORT", o->transport, 1);
	if (join)
		setenv("FR_JOIN", "1", 1);
	else
		unsetenv("FR_JOIN");
	/* --env last: the user may deliberately override any of the above. */
	for (int i = 0; i < o->nenvs; i++) {
		const char *eq = strchr(o->envs[i], '=');
		char *name = strndup(o->envs[i], (size_t)(eq - o->envs[i]));

		if (!name || setenv(name, eq + 1, 1))
			_exit(127);
		free(name);
	}

	execvp(o->argv[0], o->argv);
	fd = errno;
	fprintf(stderr, "frrun: cannot run '%s': %s\n", o->argv[0],
		strerror(fd));
	_exit(fd == ENOENT ? 127 : 126); /* as POSIX shells do */
}

/* ---- output -------------------------------------------------------------- */

static void out_flush(struct outstream *s)
{
	size_t off = 0;

	while (off < s->len && !s->dead) {
		ssize_t n = write(s->fd, s->buf + off, s->len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* Reader gone (EPIPE): keep draining the ranks so
			 * they do not block, but stop writing. */
			s->dead = true;
			break;
		}
		off += (size_t)n;
	}
	s->len = 0;
}

/* Append "[R] " + line + '\n' (line has no newline) to the stream. */
static void out_line(struct outstream *s, int rank, const char *line,
		     size_t len)
{
	char pfx[24];
	int plen = snprintf(pfx, sizeof(pfx), "[%d] ", rank);

	if (s->dead)
		return;
	if (s->len + (size_t)plen + len + 1 > sizeof(s->buf))
		out_flush(s);
	memcpy(s->buf + s->len, pfx, (size_t)plen);
	s->len += (size_t)plen;
	memcpy(s->buf + s->len, line, len);
	s->len += len;
	s->buf[s->len++] = '\n';
}

/*
 * Read what one pipe has and emit its complete lines.  Returns 0 after data,
 * 1 at EOF (the partial last line, if any, has been emitted with a newline)
 * or 2 if there was nothing to read.
 */
static int pump(struct rank *rk, int rank, int which, struct outstream *s)
{
	char *buf = rk->line[which];
	size_t start = 0;
	ssize_t n;

	do
		n = read(rk->fd[which], buf + rk->len[which],
			 LINE_CAP - rk->len[which]);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return 2;
	if (n <= 0) {
		if (rk->len[which])
			out_line(s, rank, buf, rk->len[which]);
		rk->len[which] = 0;
		out_flush(s);
		return 1;
	}
	rk->len[which] += (size_t)n;
	for (size_t i = rk->len[which] - (size_t)n; i < rk->len[which]; i++) {
		if (buf[i] != '\n')
			continue;
		out_line(s, rank, buf + start, i - start);
		start = i + 1;
	}
	if (start == 0 && rk->len[which] == LINE_CAP) {
		/* One line fills the buffer: cut it here. */
		out_line(s, rank, buf, LINE_CAP);
		start = LINE_CAP;
	}
	memmove(buf, buf + start, rk->len[which] - start);
	rk->len[which] -= start;
	out_flush(s);
	return 0;
}

/* ---- the job ------------------------------------------------------------- */

struct job {
	struct opts *o;
	struct rank *ranks;
	int live;	      /* ranks not reaped yet */
	int exit_code;	      /* of the first event */
	bool failed;	      /* a first event (failure, timeout, signal) */
	bool stopped;	      /* we sent the ranks SIGTERM (or worse) */
	uint64_t kill_at;     /* SIGKILL deadline, 0: none */
	bool joiners_stopped; /* only newcomers were left: we stopped them */
	uint64_t joiners_at;  /* when to stop them (stop_joiners), 0: none */
	uint64_t timeout_at;  /* --timeout deadline, 0: none */
	uint64_t drain_until; /* stop reading output after this */
	struct outstream out[2];
	/* what spawning a rank takes */
	const char *rdv, *token;
	const sigset_t *origmask;
	pid_t self;
};

static void abort_job(struct job *j, int code, int sig);
static void signal_all(struct job *j, int sig);

/* Send sig to every rank left, and SIGKILL after the grace period. */
static void stop_all(struct job *j, int sig)
{
	if (j->stopped)
		return;
	j->stopped = true;
	signal_all(j, sig);
	j->kill_at = pc_now_ns() + GRACE_NS;
}

/*
 * Start rank r (join: as a newcomer, FR_JOIN=1) with its output through
 * two pipes of ours.  0, or -1 (said) after which the job is aborted.
 */
static int spawn_rank(struct job *j, int r, bool join)
{
	struct rank *rk = &j->ranks[r];
	int po[2] = {-1, -1}, pe[2] = {-1, -1};

	for (int w = 0; w < 2; w++) {
		if (rk->fd[w] >= 0)
			close(rk->fd[w]);
		rk->fd[w] = -1;
		rk->len[w] = 0;
	}
	if (!j->o->no_prefix) {
		if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
			perror("frrun: pipe");
			goto fail;
		}
		if (!rk->line[0])
			rk->line[0] = malloc(LINE_CAP);
		if (!rk->line[1])
			rk->line[1] = malloc(LINE_CAP);
		if (!rk->line[0] || !rk->line[1]) {
			perror("frrun");
			goto fail;
		}
	}
	rk->joiner = join;
	rk->pid = fork();
	if (rk->pid < 0) {
		perror("frrun: fork");
		rk->pid = 0;
		goto fail;
	}
	if (rk->pid == 0)
		exec_rank(j->o, r, join, j->rdv, j->token, j->origmask, po[1],
			  pe[1], j->self);
	/* Also here: the group must exist before we may signal it. */
	setpgid(rk->pid, rk->pid);
	j->live++;
	if (!j->o->no_prefix) {
		close(po[1]);
		close(pe[1]);
		rk->fd[0] = po[0];
		rk->fd[1] = pe[0];
		fcntl(po[0], F_SETFL, O_NONBLOCK);
		fcntl(pe[0], F_SETFL, O_NONBLOCK);
	}
	return 0;

fail:
	for (int k = 0; k < 2; k++) {
		if (po[k] >= 0)
			close(po[k]);
		if (pe[k] >= 0)
			close(pe[k]);
	}
	abort_job(j, 1, SIGKILL);
	return -1;
}

static void signal_all(struct job *j, int sig)
{
	for (int r = 0; r < j->o->nranks; r++) {
		/*
		 * Only unreaped ranks: their pid (= process group id) cannot
		 * have been reused, so we cannot hit an unrelated group.
		 */
		if (j->ranks[r].pid > 0 && kill(-j->ranks[r].pid, sig) &&
		    errno == ESRCH)
			kill(j->ranks[r].pid, sig);
	}
}

/* Tear the job down; the first event (failure, timeout, signal) sets the
 * exit status. */
static void abort_job(struct job *j, int code, int sig)
{
	if (!j->failed) {
		j->failed = true;
		j->exit_code = code;
	}
	stop_all(j, sig);
}

/*
 * Emit what a rank that just exited left in its pipes.  Bounded: something
 * it started may still hold the pipe and keep writing.
 */
static void drain_rank(struct job *j, int r)
{
	struct rank *rk = &j->ranks[r];

	for (int w = 0; w < 2; w++) {
		for (int i = 0; i < 64 && rk->fd[w] >= 0; i++) {
			int rc = pump(rk, r, w, &j->out[w]);

			if (rc == 2)
				break;
			if (rc == 1) {
				close(rk->fd[w]);
				rk->fd[w] = -1;
			}
		}
		out_flush(&j->out[w]);
	}
}

/*
 * Reap every child that has exited.  Besides the ranks these can be
 * processes the ranks started and left behind: frrun is their subreaper
 * (see main), so that they do not linger as zombies under an init that
 * never reaps, as in many containers.
 */
/* Are newcomers (--respawn) all that is left running? */
static bool only_joiners(const struct job *j)
{
	if (j->live <= 0 || j->stopped)
		return false;
	for (int r = 0; r < j->o->nranks; r++)
		if (j->ranks[r].pid > 0 && !j->ranks[r].joiner)
			return false;
	return true;
}

static void reap(struct job *j)
{
	int st, code, r;
	pid_t p;

	for (;;) {
		p = waitpid(-1, &st, WNOHANG);
		if (p < 0 && errno == EINTR)
			continue;
		if (p <= 0)
			break;
		for (r = 0; r < j->o->nranks; r++)
			if (j->ranks[r].pid == p)
				break;
		if (r == j->o->nranks)
			continue; /* an orphan of a rank */
		j->ranks[r].pid = 0;
		j->live--;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			continue;
		if (j->joiners_stopped && j->ranks[r].joiner)
			continue; /* ours, below */
		/*
		 * After we stopped the job, failures are our own doing.  With
		 * --keep-going nobody was stopped: report every failure, the
		 * first one decides the exit status.
		 */
		if (j->failed && (!j->o->keep_going || j->stopped))
			continue;
		/* Its last words first, then our verdict. */
		drain_rank(j, r);
		if (WIFEXITED(st))
			fprintf(stderr,
				"frrun: rank %d exited with status %d\n", r,
				WEXITSTATUS(st));
		else
			fprintf(stderr,
				"frrun: rank %d killed by signal %d (%s)\n", r,
				WTERMSIG(st), strsignal(WTERMSIG(st)));
		code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (j->o->respawn > 0 && !j->stopped) {
			j->o->respawn--;
			fprintf(stderr,
				"frrun: starting a newcomer for rank %d (FR_JOIN=1; %d more allowed)\n",
				r, j->o->respawn);
			spawn_rank(j, r, true);
			continue;
		}
		if (j->o->keep_going) {
			if (!j->failed) {
				j->failed = true;
				j->exit_code = code;
			}
		} else {
			abort_job(j, code, SIGTERM);
		}
	}
	if (only_joiners(j) && !j->joiners_at)
		j->joiners_at = pc_now_ns() + JOINERS_NS;
}

/*
 * --respawn: a newcomer waits (up to FR_SLOW_TIMEOUT_MS) for the
 * survivors to re-admit it; once no other rank has been left for
 * JOINERS_NS (one that was re-admitted ends with the others, within it),
 * nobody will.  Stopping it then is not a failure of the job.
 */
static void stop_joiners(struct job *j)
{
	if (!only_joiners(j))
		return;
	fprintf(stderr,
		"frrun: only newcomers are left, with nobody to re-admit them: stopping them\n");
	j->joiners_stopped = true;
	stop_all(j, SIGTERM);
}

/* Milliseconds until deadline t (0 = none): for the ppoll timeout. */
static void clamp_timeout(uint64_t t, uint64_t now, int64_t *best)
{
	int64_t d;

	if (!t)
		return;
	d = t > now ? (int64_t)(t - now) : 0;
	if (*best < 0 || d < *best)
		*best = d;
}

static int run_loop(struct job *j, const sigset_t *waitmask)
{
	struct pollfd *pfd;
	int *map;
	int nr = j->o->nranks, nfd;

	pfd = calloc((size_t)nr * 2, sizeof(*pfd));
	map = calloc((size_t)nr * 2, sizeof(*map));
	if (!pfd || !map) {
		perror("frrun");
		free(pfd);
		free(map);
		abort_job(j, 1, SIGKILL);
		return -1;
	}
	for (;;) {
		uint64_t now;
		int64_t wait_ns = -1;
		struct timespec ts;

		if (got_sigchld) {
			got_sigchld = 0;
			reap(j);
		}
		if (got_signal) {
			int sig = got_signal;

			got_signal = 0;
			if (!j->stopped)
				fprintf(stderr,
					"frrun: got signal %d (%s), stopping ranks\n",
					sig, strsignal(sig));
			/* A second ^C means "now". */
			if (signal_count > 1)
				signal_all(j, SIGKILL);
			else if (j->stopped)
				signal_all(j, sig);
			else
				abort_job(j, 128 + sig, sig);
		}

		now = pc_now_ns();
		if (j->timeout_at && now >= j->timeout_at) {
			j->timeout_at = 0;
			if (!j->stopped)
				fprintf(stderr,
					"frrun: timeout after %g s, killing all ranks\n",
					j->o->timeout_s);
			abort_job(j, 124, SIGTERM);
		}
		if (j->kill_at && now >= j->kill_at) {
			j->kill_at = 0;
			signal_all(j, SIGKILL);
		}
		if (j->joiners_at && now >= j->joiners_at) {
			j->joiners_at = 0;
			stop_joiners(j);
		}

		nfd = 0;
		for (int r = 0; r < nr; r++)
			for (int w = 0; w < 2; w++)
				if (j->ranks[r].fd[w] >= 0) {
					pfd[nfd].fd = j->ranks[r].fd[w];
					pfd[nfd].events = POLLIN;
					map[nfd++] = r * 2 + w;
				}

		if (!j->live) {
			/*
			 * Every rank is gone; what is left on the pipes was
			 * written before they exited, unless something they
			 * started still holds the pipe: give that a bounded
			 * time, then stop.
			 */
			if (!nfd)
				break;
			if (!j->drain_until)
				j->drain_until = now + DRAIN_NS;
			else if (now >= j->drain_until)
				break;
			clamp_timeout(j->drain_until, now, &wait_ns);
		}
		clamp_timeout(j->timeout_at, now, &wait_ns);
		clamp_timeout(j->kill_at, now, &wait_ns);
		clamp_timeout(j->joiners_at, now, &wait_ns);
		if (wait_ns >= 0) {
			ts.tv_sec = (time_t)(wait_ns / 1000000000);
			ts.tv_nsec = (long)(wait_ns % 1000000000);
		}
		/* Signals arrive only inside ppoll: no lost wakeups. */
		if (ppoll(pfd, (nfds_t)nfd, wait_ns >= 0 ? &ts : NULL,
			  waitmask) < 0) {
			if (errno == EINTR)
				continue;
			perror("frrun: ppoll");
			abort_job(j, 1, SIGKILL);
			continue;
		}
		for (int i = 0; i < nfd; i++) {
			int r = map[i] / 2, w = map[i] % 2;

			if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (pump(&j->ranks[r], r, w, &j->out[w]) == 1) {
				close(j->ranks[r].fd[w]);
				j->ranks[r].fd[w] = -1;
			}
		}
	}
	free(pfd);
	free(map);
	return 0;
}

/*
 * Two pipes a rank, and a few descriptors more: 1,024 ranks need about
 * 2,100, past the soft limit of 1,024 a login shell gives.  Raise ours
 * (the ranks inherit it) within the hard limit, or say what to do before
 * any rank starts.
 */
static int raise_nofile(const struct opts *o)
{
	rlim_t need = (rlim_t)(o->no_prefix ? 0 : 2 * o->nranks) + 64;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= need)
		return 0;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) {
		rl.rlim_cur = need;
		if (!setrlimit(RLIMIT_NOFILE, &rl))
			return 0;
	}
	fprintf(stderr,
		"frrun: %ld ranks need about %llu file descriptors here, but the limit is %llu (hard %llu): raise it (ulimit -n %llu)\n",
		(long)o->nranks, (unsigned long long)need,
		(unsigned long long)rl.rlim_cur,
		(unsigned long long)rl.rlim_max, (unsigned long long)need);
	return 1;
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	sigset_t block, origmask, waitmask;
	struct opts o;
	struct job j;
	char token[2 * TOKEN_BYTES + 1] = "";
	char rdv[NI_MAXHOST + 16];
	pid_t self = getpid();
	int rc, r;

	rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc;
	if (!o.port && pick_port(o.host, &o.port))
		return 1;
	snprintf(rdv, sizeof(rdv), strchr(o.host, ':') ? "[%s]:%ld" : "%s:%ld",
		 o.host, o.port);
	if (make_token(token, sizeof(token)))
		return 1;
	if (raise_nofile(&o))
		return 1;

	memset(&j, 0, sizeof(j));
	j.o = &o;
	j.out[0].fd = STDOUT_FILENO;
	j.out[1].fd = STDERR_FILENO;
	j.ranks = calloc((size_t)o.nranks, sizeof(*j.ranks));
	if (!j.ranks) {
		perror("frrun");
		return 1;
	}
	for (r = 0; r < o.nranks; r++)
		j.ranks[r].fd[0] = j.ranks[r].fd[1] = -1;

	/* Keep our signals blocked except inside ppoll (see run_loop). */
	sigemptyset(&block);
	sigaddset(&block, SIGCHLD);
	for (size_t i = 0; i < PC_ARRAY_SIZE(fwd_signals); i++)
		sigaddset(&block, fwd_signals[i]);
	sigprocmask(SIG_BLOCK, &block, &origmask);
	waitmask = origmask;
	sigdelset(&waitmask, SIGCHLD);
	for (size_t i = 0; i < PC_ARRAY_SIZE(fwd_signals); i++)
		sigdelset(&waitmask, fwd_signals[i]);

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_sigchld;
	sigaction(SIGCHLD, &sa, NULL);
	sa.sa_handler = on_forward;
	for (size_t i = 0; i < PC_ARRAY_SIZE(fwd_signals); i++)
		sigaction(fwd_signals[i], &sa, NULL);
	/* A closed stdout must not kill the launcher (and orphan ranks). */
	signal(SIGPIPE, SIG_IGN);
	/* Orphans of the ranks become our children, and we reap them. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	fflush(NULL);

	j.rdv = rdv;
	j.token = token;
	j.origmask = &origmask;
	j.self = self;
	for (r = 0; r < o.nranks; r++)
		if (spawn_rank(&j, r, false))
			break;

	if (o.timeout_s > 0 && !j.failed)
		j.timeout_at = pc_now_ns() + (uint64_t)(o.timeout_s * 1e9);
	run_loop(&j, &waitmask);

	/*
	 * Normally every rank is reaped by now; after an internal error the
	 * loop may have left early: make sure, so that no zombie or orphan
	 * outlives us.
	 */
	if (j.live) {
		signal_all(&j, SIGKILL);
		for (r = 0; r < o.nranks; r++)
			if (j.ranks[r].pid > 0)
				while (waitpid(j.ranks[r].pid, NULL, 0) < 0 &&
				       errno == EINTR)
					;
	}
	/* Orphans that already died; live ones go on to init. */
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	out_flush(&j.out[0]);
	out_flush(&j.out[1]);
	for (r = 0; r < o.nranks; r++) {
		for (int w = 0; w < 2; w++)
			if (j.ranks[r].fd[w] >= 0)
				close(j.ranks[r].fd[w]);
		free(j.ranks[r].line[0]);
		free(j.ranks[r].line[1]);
	}
	free(j.ranks);
	free(o.envs);
	return j.failed ? j.exit_code : 0;
}
