/* SPDX-License-Identifier: MIT */
/* transport.c - the table of transports built into the library. */
#include <string.h>

#include "fastreduce.h"
#include "transport.h"

static const struct fr_tp_ops *const transports[] = {
#ifdef FR_HAVE_VERBS
	&fr_verbs_ops,
	&fr_mux_verbs_ops,
#endif
	&fr_tcp_ops,
	&fr_shm_ops,
	&fr_mux_ops,
};

/* Transports registered at run time (fr_transport_register). */
static const struct fr_tp_ops *extra[4];

const struct fr_tp_ops *fr_transport_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (!strcmp(transports[i]->name, name))
			return transports[i];
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		if (extra[i] && !strcmp(extra[i]->name, name))
			return extra[i];
	return NULL;
}

int fr_transport_register(const struct fr_tp_ops *ops)
{
	if (!ops || !ops->name || ops->size < sizeof(*ops) ||
	    fr_transport_find(ops->name))
		return FR_EINVAL;
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		if (!extra[i]) {
			extra[i] = ops;
			return 0;
		}
	return FR_ENOMEM;
}
