/* SPDX-License-Identifier: MIT */
/*
 * bootstrap.h - the TCP rendezvous through which ranks find each other.
 *
 * Rank 0 serves at the rendezvous address; every other rank connects to it
 * (retrying with back-off until the timeout), sends a HELLO with its rank,
 * the job token, a configuration string that must be equal on all ranks
 * and its "card" (transport address and remote keys, opaque here), and
 * gets back a WELCOME with every rank's card and a random job nonce.  Then
 * the connection is closed: after the rendezvous only ring neighbours talk.
 *
 * Wire format: every message is a 12-byte little-endian header
 *   u32 magic "FRB1", u16 version, u16 type, u32 payload length
 * followed by the payload (see bootstrap.c).  Parsers never trust a length.
 */
#ifndef FR_BOOTSTRAP_H
#define FR_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#define FR_BOOT_MAGIC 0x31425246u /* "FRB1" */
#define FR_BOOT_VERSION 1
#define FR_BOOT_HDR 12
#define FR_BOOT_CARD_MAX 512
#define FR_BOOT_TOKEN_MAX 256
#define FR_BOOT_CONFIG_MAX 256
#define FR_BOOT_PAYLOAD_MAX (1u << 26)

enum fr_boot_type {
	FR_BOOT_HELLO = 1,
	FR_BOOT_WELCOME = 2,
	FR_BOOT_REJECT = 3,
	FR_BOOT_JOIN = 4,   /* a newcomer asks for a ticket (fr_comm_join)  */
	FR_BOOT_TICKET = 5, /* its rank, the size and the grow's nonce      */
};

struct fr_boot_card {
	uint16_t len;
	uint8_t data[FR_BOOT_CARD_MAX];
};

struct fr_boot_hello {
	uint32_t rank, nranks;
	uint16_t token_len, config_len;
	char token[FR_BOOT_TOKEN_MAX + 1];
	char config[FR_BOOT_CONFIG_MAX + 1];
	struct fr_boot_card card;
};

struct fr_boot_params {
	int rank, nranks;
	const char *rendezvous; /* host:port */
	const char *token;      /* may be NULL */
	int timeout_ms;
	char *err;
	size_t errlen;
};

struct fr_boot;

/* Phase 1: rank 0 listens, accepts every other rank and reads its HELLO;
 * the others connect.  Afterwards fr_boot_local_ip() is the address of the
 * interface that reaches the rendezvous (for the transport to bind). */
int fr_boot_begin(const struct fr_boot_params *p, struct fr_boot **boot);
const char *fr_boot_local_ip(const struct fr_boot *boot);
/* Microseconds the TCP handshake with rank 0 took (a round trip; 0 on
 * rank 0), known after phase 1. */
uint32_t fr_boot_rtt_us(const struct fr_boot *boot);
/* Phase 2: trade cards.  cards[] has nranks entries; on success cards[r]
 * holds rank r's card and *nonce the job nonce. */
int fr_boot_exchange(struct fr_boot *boot, const char *config,
		     const struct fr_boot_card *mine, struct fr_boot_card *cards,
		     uint64_t *nonce);
void fr_boot_end(struct fr_boot *boot);

/*
 * Re-admission tickets (fr_comm_grow, fr_comm_join): before a grown
 * communicator is bootstrapped as usual, each newcomer learns its rank in
 * it from the grow's leader.  JOIN carries u16 token_len, token (the job
 * token); TICKET u32 rank, u32 nranks, u64 nonce; a wrong token gets a
 * REJECT.  The tickets go out together once all newcomers are in.
 *
 * fr_boot_tickets_serve: listen at addr and hand out tickets for ranks
 * first .. first + count - 1 (of nranks) to the first count newcomers
 * with the right token, until timeout_ms passes; *served says how many
 * got one.  0 when all did, FR_ETIMEDOUT (not all came) or FR_EPEER (one
 * left before its ticket), with a message, otherwise.
 * fr_boot_ticket_get: connect to addr (again and again until the leader
 * listens or timeout_ms passes) and take a ticket.  The leader calls
 * idle(arg), if not NULL, every 100 ms or so while it waits (600 ms at
 * most, behind a stranger that says nothing), so that its communicator
 * answers the peers that wait for it.
 */
struct fr_boot_ticket {
	uint32_t rank, nranks;
	uint64_t nonce;
};
int fr_boot_tickets_serve(const char *addr, const char *token, uint32_t first,
			  int count, uint32_t nranks, uint64_t nonce,
			  int timeout_ms, void (*idle)(void *), void *arg,
			  int *served, char *err, size_t errlen);
int fr_boot_ticket_get(const char *addr, const char *token, int timeout_ms,
		       struct fr_boot_ticket *t, char *err, size_t errlen);

/* Message codecs, exposed for the unit tests.  Each returns the number of
 * bytes written / 0, or FR_EPROTO / FR_EINVAL on bad input. */
int fr_boot_parse_header(const uint8_t *buf, size_t len, uint16_t *type,
			 uint32_t *plen);
size_t fr_boot_put_header(uint8_t *buf, uint16_t type, uint32_t plen);
int fr_boot_parse_hello(const uint8_t *p, size_t len, struct fr_boot_hello *h);
int fr_boot_build_hello(const struct fr_boot_hello *h, uint8_t *buf,
			size_t len);
int fr_boot_parse_welcome(const uint8_t *p, size_t len, uint32_t nranks,
			  uint64_t *nonce, struct fr_boot_card *cards);
int fr_boot_parse_reject(const uint8_t *p, size_t len, int32_t *code,
			 char *msg, size_t msglen);

#endif
