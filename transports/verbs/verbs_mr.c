/* SPDX-License-Identifier: MIT */
/*
 * verbs_mr.c - memory registration and remote keys: reg_mem() with least
 * privilege and the locked-memory hint, dereg_mem(), and the 24-byte
 * remote key blob (format at the top of fr_verbs.c) that pack_rkey()
 * writes and unpack_rkey() checks.  A region's inflight count is kept by
 * the data path (verbs_data.c).
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <infiniband/verbs.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* ---- memory -------------------------------------------------------------- */

int verbs_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		  struct fr_tp_mr **out)
{
	const int all =
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	struct fr_tp_mr *mr;
	struct rlimit rl;
	char lim[32];
	int flags = 0, e;

	if (!tp || !out || (access & ~all) || (!buf && len) ||
	    (uintptr_t)buf + len < (uintptr_t)buf)
		return FR_EINVAL;
	/* Least privilege: never remote read; the HCA needs local write
	 * to let a peer write into the region. */
	if (access & (FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE))
		flags |= IBV_ACCESS_LOCAL_WRITE;
	if (access & FR_TP_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return FR_ENOMEM;
	if (len) {
		mr->mr = ibv_reg_mr(tp->pd, buf, len, flags);
		if (!mr->mr) {
			e = errno;
			free(mr);
			if (e != ENOMEM && e != EPERM) {
				char why[192];

				fr_tpb_seterr(
					&tp->b, FR_LOG_WARN,
					"ibv_reg_mr of %zu bytes at %p: %s",
					len, buf,
					verbs_strerror(e, why, sizeof(why)));
				return FR_ESYS;
			}
			if (getrlimit(RLIMIT_MEMLOCK, &rl) ||
			    rl.rlim_cur == RLIM_INFINITY)
				snprintf(lim, sizeof(lim), "unlimited");
			else
				snprintf(lim, sizeof(lim), "%llu KiB",
					 (unsigned long long)rl.rlim_cur /
						 1024);
			fr_tpb_seterr(
				&tp->b, FR_LOG_WARN,
				"ibv_reg_mr of %zu bytes at %p: %s; registered memory is pinned and counts against the locked-memory limit (ulimit -l: %s): raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf)",
				len, buf, strerror(e), lim);
			return FR_ENOMEM;
		}
	}
	mr->tp = tp;
	mr->base = buf;
	mr->len = len;
	mr->remote = access & FR_TP_REMOTE_WRITE;
	fr_tpb_list_add(&tp->mrs, &mr->link);
	*out = mr;
	return 0;
}

int verbs_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr)
{
	int rc;

	if (!tp || !mr || mr->tp != tp)
		return FR_EINVAL;
	/* Posted writes still read from it: the caller must poll first. */
	if (mr->inflight)
		return FR_EBUSY;
	if (mr->mr) {
		rc = ibv_dereg_mr(mr->mr);
		if (rc) {
			fr_tpb_seterr(&tp->b, FR_LOG_WARN, "ibv_dereg_mr: %s",
				      strerror(rc));
			return FR_ESYS;
		}
	}
	if (tp->mr_hint == mr)
		tp->mr_hint = NULL;
	fr_tpb_list_del(&tp->mrs, &mr->link);
	free(mr);
	return 0;
}

/*
 * The region of ours a peer's polled line may write len bytes into at
 * addr under rkey: registered with FR_TP_REMOTE_WRITE, and holding all of
 * it; NULL otherwise.  What the HCA checks for a write, checked by us for
 * the bytes we copy out of a line.  The last match is tried first: small
 * messages go to the same mailbox.
 */
static bool verbs_mr_holds(const struct fr_tp_mr *mr, uint32_t rkey,
			   uint64_t addr, size_t len)
{
	uint64_t base = (uint64_t)(uintptr_t)mr->base;

	return mr->mr && mr->remote && mr->mr->rkey == rkey && addr >= base &&
	       len <= mr->len && addr - base <= mr->len - len;
}

struct fr_tp_mr *verbs_mr_find(struct fr_tp *tp, uint32_t rkey, uint64_t addr,
			       size_t len)
{
	struct fr_tpb_link *l;

	if (tp->mr_hint && verbs_mr_holds(tp->mr_hint, rkey, addr, len))
		return tp->mr_hint;
	for (l = tp->mrs; l; l = l->next) {
		struct fr_tp_mr *mr = (struct fr_tp_mr *)(void *)l;

		if (verbs_mr_holds(mr, rkey, addr, len)) {
			tp->mr_hint = mr;
			return mr;
		}
	}
	return NULL;
}

int verbs_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len)
{
	uint8_t *b = blob;

	if (!mr || !blob || !len || *len < VERBS_RKEY_LEN)
		return FR_EINVAL;
	/* Only what a peer needs: never the ibv_mr (lkey, handles). */
	b[0] = VERBS_RKEY_MAGIC;
	b[1] = VERBS_RKEY_VERSION;
	fr_put_le16(b + 2, 0);
	fr_put_le32(b + 4, mr->mr ? mr->mr->rkey : 0);
	fr_put_le64(b + 8, (uint64_t)(uintptr_t)mr->base);
	fr_put_le64(b + 16, mr->len);
	*len = VERBS_RKEY_LEN;
	return 0;
}

int verbs_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
		      struct fr_tp_rkey *rkey)
{
	const uint8_t *b = blob;
	uint64_t addr, rlen;

	if (!blob || !rkey)
		return FR_EINVAL;
	if (len != VERBS_RKEY_LEN || b[0] != VERBS_RKEY_MAGIC ||
	    b[1] != VERBS_RKEY_VERSION || fr_get_le16(b + 2))
		return FR_EPROTO;
	addr = fr_get_le64(b + 8);
	rlen = fr_get_le64(b + 16);
	/* addr + roff never wraps once roff + len <= rlen is checked. */
	if (addr + rlen < addr)
		return FR_EPROTO;
	rkey->a = addr;
	rkey->b = rlen;
	rkey->c = fr_get_le32(b + 4);
	rkey->d = VERBS_RKEY_TAG;
	return 0;
}
