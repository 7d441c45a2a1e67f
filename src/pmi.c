/* SPDX-License-Identifier: MIT */
/*
 * pmi.c - the rendezvous address through PMI-1 (MPICH's Hydra, and any
 * launcher that hands its ranks a PMI_FD).
 *
 * Hydra tells a rank only PMI_RANK, PMI_SIZE and a connected socket,
 * PMI_FD; it sets no job id and no address of rank 0.  So rank 0 puts
 * "host:port" into the job's key-value space, every rank meets at a PMI
 * barrier, and the others get it.  The port is one the kernel says is
 * free (fr_free_port: a port hashed from the job id could be in use,
 * and on a busy host was), else derived from the key-value space's
 * name, which is unique to the job; the host is
 * 127.0.0.1 when all ranks are on this host, else the name Hydra gave this
 * node (MPIR_CVAR_CH3_INTERFACE_HOSTNAME) or gethostname().  Finalize ends
 * the conversation at once, so Hydra sees a clean exit whenever the
 * program ends.
 *
 * Wire format: PMI-1 "simple" text commands, one per line,
 * "cmd=NAME key=value ...\n"; every command gets one reply line.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "fastreduce.h"
#include "util.h"

#define PMI_LINE 1100

/* Send one command line and read one reply line into buf. */
static int pmi_cmd(int fd, const char *cmd, char *buf, size_t len)
{
	size_t n = strlen(cmd), off = 0;

	while (off < n) {
		ssize_t w = write(fd, cmd + off, n - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return FR_EBOOTSTRAP;
		off += (size_t)w;
	}
	for (off = 0; off + 1 < len;) {
		ssize_t r = read(fd, buf + off, 1);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return FR_EBOOTSTRAP;
		if (buf[off] == '\n')
			break;
		off++;
	}
	buf[off] = '\0';
	return off + 1 < len ? 0 : FR_EPROTO;
}

/* The value of key in a reply line ("cmd=x rc=0 value=...") into out. */
static bool pmi_field(const char *line, const char *key, char *out,
		      size_t len)
{
	size_t kl = strlen(key);

	for (const char *p = line; (p = strstr(p, key)); p += kl) {
		if ((p != line && p[-1] != ' ') || p[kl] != '=')
			continue;
		p += kl + 1;
		size_t n = strcspn(p, " \n");

		if (n >= len)
			return false;
		memcpy(out, p, n);
		out[n] = '\0';
		return true;
	}
	return false;
}

static bool pmi_rc_ok(const char *line)
{
	char rc[16];

	return !pmi_field(line, "rc", rc, sizeof(rc)) || !strcmp(rc, "0");
}

int fr_pmi_rendezvous(fr_getenv_fn get, void *arg, int rank, bool local,
		      char *rdv, size_t rdvlen, char *err, size_t errlen)
{
	char line[PMI_LINE], cmd[PMI_LINE], kvs[257], val[300];
	const char *fdv = get("PMI_FD", arg);
	long fd;
	int rc;

	if (!fdv || fr_parse_long(fdv, 0, 1 << 20, &fd)) {
		snprintf(err, errlen, "PMI_FD=\"%s\" is not a descriptor",
			 fdv ? fdv : "");
		return FR_EINVAL;
	}
#define PMI(c, want)                                                         \
	do {                                                                 \
		rc = pmi_cmd((int)fd, (c), line, sizeof(line));              \
		if (rc || !strstr(line, "cmd=" want) || !pmi_rc_ok(line)) {  \
			snprintf(err, errlen,                                \
				 "PMI-1 on PMI_FD=%ld: sent %.40s, got \"%.80s\"", \
				 fd, (c), rc ? fr_strerror(rc) : line);     \
			return FR_EBOOTSTRAP;                                \
		}                                                            \
	} while (0)

	PMI("cmd=init pmi_version=1 pmi_subversion=1\n", "response_to_init");
	PMI("cmd=get_my_kvsname\n", "my_kvsname");
	if (!pmi_field(line, "kvsname", kvs, sizeof(kvs))) {
		snprintf(err, errlen, "PMI-1: no kvsname in \"%.80s\"", line);
		return FR_EBOOTSTRAP;
	}
	if (rank == 0) {
		fr_env_rank0_addr(kvs, local,
				  get("MPIR_CVAR_CH3_INTERFACE_HOSTNAME", arg),
				  val, sizeof(val));
		snprintf(cmd, sizeof(cmd),
			 "cmd=put kvsname=%s key=fastreduce_rendezvous value=%s\n",
			 kvs, val);
		PMI(cmd, "put_result");
	}
	PMI("cmd=barrier_in\n", "barrier_out");
	if (rank != 0) {
		snprintf(cmd, sizeof(cmd),
			 "cmd=get kvsname=%s key=fastreduce_rendezvous\n", kvs);
		PMI(cmd, "get_result");
		if (!pmi_field(line, "value", val, sizeof(val))) {
			snprintf(err, errlen, "PMI-1: no value in \"%.80s\"",
				 line);
			return FR_EBOOTSTRAP;
		}
	}
	PMI("cmd=finalize\n", "finalize_ack");
#undef PMI
	snprintf(rdv, rdvlen, "%s", val);
	return 0;
}
