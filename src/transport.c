/* SPDX-License-Identifier: MIT */
/* transport.c - the table of transports built into the library. */
#include <string.h>

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

const struct fr_tp_ops *fr_transport_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (!strcmp(transports[i]->name, name))
			return transports[i];
	return NULL;
}
