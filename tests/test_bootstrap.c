/* SPDX-License-Identifier: MIT */
/*
 * test_bootstrap.c - the rendezvous (src/bootstrap.c): its message codecs,
 * including a deterministic fuzz loop (run it under ASan), and the real
 * thing over 127.0.0.1 with rank 0 in this process and the other ranks,
 * strangers and garbage senders in forked children that report back through
 * a pipe and their exit code.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "fastreduce.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* A copy in a buffer of exactly len bytes, so that ASan sees any overread. */
static uint8_t *exact(const uint8_t *p, size_t len)
{
	uint8_t *q = malloc(len ? len : 1);

	assert_non_null(q);
	if (len)
		memcpy(q, p, len);
	return q;
}

static int parse_hello_exact(const uint8_t *p, size_t len,
			     struct fr_boot_hello *h)
{
	uint8_t *q = exact(p, len);
	int rc = fr_boot_parse_hello(q, len, h);

	free(q);
	return rc;
}

static int parse_welcome_exact(const uint8_t *p, size_t len, uint32_t nranks,
			       uint64_t *nonce, struct fr_boot_card *cards)
{
	uint8_t *q = exact(p, len);
	int rc = fr_boot_parse_welcome(q, len, nranks, nonce, cards);

	free(q);
	return rc;
}

/* A little writer for hand-made payloads. */
struct wr {
	uint8_t buf[4096];
	size_t len;
};

static void w_u16(struct wr *w, uint16_t v)
{
	fr_put_le16(w->buf + w->len, v);
	w->len += 2;
}

static void w_u32(struct wr *w, uint32_t v)
{
	fr_put_le32(w->buf + w->len, v);
	w->len += 4;
}

static void w_u64(struct wr *w, uint64_t v)
{
	fr_put_le64(w->buf + w->len, v);
	w->len += 8;
}

static void w_bytes(struct wr *w, const void *p, size_t n)
{
	memcpy(w->buf + w->len, p, n);
	w->len += n;
}

static void w_fill(struct wr *w, uint8_t c, size_t n)
{
	memset(w->buf + w->len, c, n);
	w->len += n;
}

/* A hello payload with the given length prefixes and that many bytes. */
static void hand_hello(struct wr *w, uint16_t tl, uint16_t cl, uint16_t kl)
{
	w->len = 0;
	w_u32(w, 1);
	w_u32(w, 2);
	w_u16(w, tl);
	w_fill(w, 't', tl);
	w_u16(w, cl);
	w_fill(w, 'c', cl);
	w_u16(w, kl);
	w_fill(w, 0x5a, kl);
}

static void make_card(int r, struct fr_boot_card *c)
{
	memset(c, 0, sizeof(*c));
	/* Rank 1 the largest card, rank 2 an empty one. */
	c->len = (uint16_t)(r == 1   ? FR_BOOT_CARD_MAX
			    : r == 2 ? 0
				     : 17 + 5 * (r % 90));
	for (int i = 0; i < c->len; i++)
		c->data[i] = (uint8_t)(r * 31 + i * 7);
}

static bool card_equal(const struct fr_boot_card *a,
		       const struct fr_boot_card *b)
{
	return a->len == b->len && !memcmp(a->data, b->data, a->len);
}

static void fill_hello(struct fr_boot_hello *h, uint32_t rank,
		       uint32_t nranks, const char *token, const char *config,
		       int card_rank)
{
	memset(h, 0, sizeof(*h));
	h->rank = rank;
	h->nranks = nranks;
	h->token_len = (uint16_t)strlen(token);
	memcpy(h->token, token, h->token_len);
	h->config_len = (uint16_t)strlen(config);
	memcpy(h->config, config, h->config_len);
	make_card(card_rank, &h->card);
}

#define MSG_MAX (FR_BOOT_HDR + 16 + FR_BOOT_TOKEN_MAX + FR_BOOT_CONFIG_MAX + \
		 FR_BOOT_CARD_MAX)

/* ---- header ------------------------------------------------------------------------- */

static void test_header(void **state)
{
	uint8_t buf[FR_BOOT_HDR], m[FR_BOOT_HDR];
	uint16_t type;
	uint32_t plen;

	(void)state;
	for (uint16_t t = FR_BOOT_HELLO; t <= FR_BOOT_TICKET; t++) {
		assert_int_equal(fr_boot_put_header(buf, t, 1234), FR_BOOT_HDR);
		type = 0;
		plen = 0;
		assert_int_equal(fr_boot_parse_header(buf, sizeof(buf), &type,
						      &plen),
				 0);
		assert_int_equal(type, t);
		assert_int_equal(plen, 1234);
	}
	/* "FRB1", little-endian. */
	assert_memory_equal(buf, "FRB1", 4);
	fr_boot_put_header(buf, FR_BOOT_WELCOME, FR_BOOT_PAYLOAD_MAX);
	assert_int_equal(fr_boot_parse_header(buf, sizeof(buf), &type, &plen),
			 0);
	assert_int_equal(plen, FR_BOOT_PAYLOAD_MAX);
	fr_boot_put_header(buf, FR_BOOT_WELCOME, 0);
	assert_int_equal(fr_boot_parse_header(buf, sizeof(buf), &type, &plen),
			 0);
	assert_int_equal(plen, 0);

	/* bad magic: any bit of it */
	fr_boot_put_header(buf, FR_BOOT_HELLO, 10);
	for (int i = 0; i < 4; i++)
		for (int b = 0; b < 8; b++) {
			memcpy(m, buf, sizeof(m));
			m[i] ^= (uint8_t)(1u << b);
			assert_int_equal(fr_boot_parse_header(m, sizeof(m),
							      &type, &plen),
					 FR_EPROTO);
		}
	/* bad version */
	const uint16_t versions[] = { 0, FR_BOOT_VERSION + 1, 0x100, 0xffff };
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		memcpy(m, buf, sizeof(m));
		fr_put_le16(m + 4, versions[i]);
		assert_int_equal(fr_boot_parse_header(m, sizeof(m), &type,
						      &plen),
				 FR_EPROTO);
	}
	/* bad type */
	const uint16_t types[] = {0, FR_BOOT_TICKET + 1, 0x100, 0xffff};
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		fr_boot_put_header(m, types[i], 10);
		assert_int_equal(fr_boot_parse_header(m, sizeof(m), &type,
						      &plen),
				 FR_EPROTO);
	}
	/* oversized length */
	const uint32_t lens[] = { FR_BOOT_PAYLOAD_MAX + 1, 0x80000000u,
				  0xffffffffu };
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		fr_boot_put_header(m, FR_BOOT_HELLO, lens[i]);
		assert_int_equal(fr_boot_parse_header(m, sizeof(m), &type,
						      &plen),
				 FR_EPROTO);
	}
	/* short buffer */
	for (size_t len = 0; len < FR_BOOT_HDR; len++) {
		uint8_t *q = exact(buf, len);

		assert_int_equal(fr_boot_parse_header(q, len, &type, &plen),
				 FR_EPROTO);
		free(q);
	}
}

/* ---- hello ----------------------------------------------------------------------------- */

static void roundtrip_hello(const struct fr_boot_hello *in)
{
	uint8_t buf[MSG_MAX];
	struct fr_boot_hello out;
	uint16_t type;
	uint32_t plen;
	int n;

	n = fr_boot_build_hello(in, buf, sizeof(buf));
	assert_true(n >= FR_BOOT_HDR + 14);
	assert_int_equal(n, FR_BOOT_HDR + 14 + in->token_len + in->config_len +
				    in->card.len);
	assert_int_equal(fr_boot_parse_header(buf, (size_t)n, &type, &plen), 0);
	assert_int_equal(type, FR_BOOT_HELLO);
	assert_int_equal(plen, (uint32_t)n - FR_BOOT_HDR);
	memset(&out, 0x77, sizeof(out));
	assert_int_equal(parse_hello_exact(buf + FR_BOOT_HDR, plen, &out), 0);
	assert_int_equal(out.rank, in->rank);
	assert_int_equal(out.nranks, in->nranks);
	assert_int_equal(out.token_len, in->token_len);
	assert_int_equal(out.config_len, in->config_len);
	assert_memory_equal(out.token, in->token, in->token_len);
	assert_memory_equal(out.config, in->config, in->config_len);
	/* Strings come back terminated. */
	assert_int_equal(out.token[out.token_len], '\0');
	assert_int_equal(out.config[out.config_len], '\0');
	assert_true(card_equal(&out.card, &in->card));
	/* Exactly the size needed, not a byte less. */
	assert_int_equal(fr_boot_build_hello(in, buf, (size_t)n), n);
	assert_int_equal(fr_boot_build_hello(in, buf, (size_t)n - 1),
			 FR_EINVAL);
}

static void test_hello_roundtrip(void **state)
{
	struct fr_boot_hello h;
	char tok[FR_BOOT_TOKEN_MAX + 1], cfg[FR_BOOT_CONFIG_MAX + 1];

	(void)state;
	fill_hello(&h, 3, 4, "secret", "transport=tcp segment=524288 slots=8",
		   3);
	roundtrip_hello(&h);
	fill_hello(&h, 0, 0, "", "", 2); /* everything empty */
	roundtrip_hello(&h);
	memset(tok, 'T', FR_BOOT_TOKEN_MAX);
	tok[FR_BOOT_TOKEN_MAX] = '\0';
	memset(cfg, 'C', FR_BOOT_CONFIG_MAX);
	cfg[FR_BOOT_CONFIG_MAX] = '\0';
	fill_hello(&h, 0xffffffffu, 0xfffffffeu, tok, cfg, 1); /* all maximal */
	roundtrip_hello(&h);
	/* Cards are binary: NUL bytes and 0xff are fine there. */
	fill_hello(&h, 1, 2, "t", "c", 0);
	h.card.len = 4;
	memcpy(h.card.data, "\0\xff\0\x01", 4);
	roundtrip_hello(&h);
}

static void test_hello_build_invalid(void **state)
{
	struct fr_boot_hello h;
	uint8_t buf[MSG_MAX + 1024];

	(void)state;
	fill_hello(&h, 1, 2, "t", "c", 3);
	h.token_len = FR_BOOT_TOKEN_MAX + 1;
	assert_int_equal(fr_boot_build_hello(&h, buf, sizeof(buf)), FR_EINVAL);
	fill_hello(&h, 1, 2, "t", "c", 3);
	h.config_len = FR_BOOT_CONFIG_MAX + 1;
	assert_int_equal(fr_boot_build_hello(&h, buf, sizeof(buf)), FR_EINVAL);
	fill_hello(&h, 1, 2, "t", "c", 3);
	h.card.len = FR_BOOT_CARD_MAX + 1;
	assert_int_equal(fr_boot_build_hello(&h, buf, sizeof(buf)), FR_EINVAL);
	fill_hello(&h, 1, 2, "t", "c", 3);
	assert_int_equal(fr_boot_build_hello(&h, buf, 0), FR_EINVAL);
	assert_int_equal(fr_boot_build_hello(&h, buf, FR_BOOT_HDR), FR_EINVAL);
}

static void test_hello_truncated_and_trailing(void **state)
{
	struct fr_boot_hello in, out;
	uint8_t buf[MSG_MAX + 64];
	const uint8_t *pl = buf + FR_BOOT_HDR;
	size_t plen;
	int n;

	(void)state;
	fill_hello(&in, 2, 4, "job-token", "transport=tcp", 4);
	n = fr_boot_build_hello(&in, buf, sizeof(buf) - 64);
	assert_true(n > FR_BOOT_HDR);
	plen = (size_t)n - FR_BOOT_HDR;
	/* Every proper prefix of a valid hello is malformed. */
	for (size_t len = 0; len < plen; len++)
		if (parse_hello_exact(pl, len, &out) != FR_EPROTO)
			fail_msg("a hello truncated to %zu of %zu bytes was accepted",
				 len, plen);
	assert_int_equal(parse_hello_exact(pl, plen, &out), 0);
	/* So is a valid hello followed by anything. */
	for (size_t extra = 1; extra <= 64; extra++) {
		memset(buf + n, (int)extra, extra);
		if (parse_hello_exact(pl, plen + extra, &out) != FR_EPROTO)
			fail_msg("a hello with %zu trailing bytes was accepted",
				 extra);
	}
	/* And one whose empty card is followed by anything. */
	fill_hello(&in, 2, 4, "tok", "cfg", 2);
	n = fr_boot_build_hello(&in, buf, sizeof(buf) - 64);
	buf[n] = 0;
	assert_int_equal(parse_hello_exact(pl, (size_t)n - FR_BOOT_HDR + 1,
					   &out),
			 FR_EPROTO);
}

static void test_hello_lengths(void **state)
{
	struct wr w;
	struct fr_boot_hello out;

	(void)state;
	/* The limits themselves are fine... */
	hand_hello(&w, FR_BOOT_TOKEN_MAX, FR_BOOT_CONFIG_MAX, FR_BOOT_CARD_MAX);
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), 0);
	assert_int_equal(out.token_len, FR_BOOT_TOKEN_MAX);
	assert_int_equal(out.config_len, FR_BOOT_CONFIG_MAX);
	assert_int_equal(out.card.len, FR_BOOT_CARD_MAX);
	assert_int_equal(strlen(out.token), FR_BOOT_TOKEN_MAX);
	assert_int_equal(strlen(out.config), FR_BOOT_CONFIG_MAX);
	/* ... one byte more is not, even with the bytes present. */
	hand_hello(&w, FR_BOOT_TOKEN_MAX + 1, 1, 1);
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), FR_EPROTO);
	hand_hello(&w, 1, FR_BOOT_CONFIG_MAX + 1, 1);
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), FR_EPROTO);
	hand_hello(&w, 1, 1, FR_BOOT_CARD_MAX + 1);
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), FR_EPROTO);
	/* Lengths that point past the end. */
	w.len = 0;
	w_u32(&w, 1);
	w_u32(&w, 2);
	w_u16(&w, 0xffff);
	w_fill(&w, 'x', 20);
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), FR_EPROTO);
	hand_hello(&w, 3, 3, 3);
	fr_put_le16(w.buf + 8 + 2 + 3 + 2 + 3, 4); /* card says 4, has 3 */
	assert_int_equal(parse_hello_exact(w.buf, w.len, &out), FR_EPROTO);
}

static void test_hello_embedded_nul(void **state)
{
	struct fr_boot_hello in, out;
	uint8_t buf[MSG_MAX];
	int n;

	(void)state;
	fill_hello(&in, 1, 2, "abcde", "cfg", 3);
	in.token[2] = '\0'; /* "ab\0de": would compare equal to "ab" */
	n = fr_boot_build_hello(&in, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(parse_hello_exact(buf + FR_BOOT_HDR,
					   (size_t)n - FR_BOOT_HDR, &out),
			 FR_EPROTO);
	fill_hello(&in, 1, 2, "abcde", "cfg", 3);
	in.token[4] = '\0'; /* a trailing NUL too */
	n = fr_boot_build_hello(&in, buf, sizeof(buf));
	assert_int_equal(parse_hello_exact(buf + FR_BOOT_HDR,
					   (size_t)n - FR_BOOT_HDR, &out),
			 FR_EPROTO);
	fill_hello(&in, 1, 2, "tok", "a=1 b=2", 3);
	in.config[3] = '\0';
	n = fr_boot_build_hello(&in, buf, sizeof(buf));
	assert_int_equal(parse_hello_exact(buf + FR_BOOT_HDR,
					   (size_t)n - FR_BOOT_HDR, &out),
			 FR_EPROTO);
}

/* ---- welcome and reject ---------------------------------------------------------------- */

static void build_welcome(struct wr *w, uint64_t nonce, uint32_t nranks,
			  uint32_t ncards)
{
	struct fr_boot_card c;

	w->len = 0;
	w_u64(w, nonce);
	w_u32(w, nranks);
	for (uint32_t r = 0; r < ncards; r++) {
		make_card((int)r == 1 ? 5 : (int)r, &c); /* keep it small */
		w_u16(w, c.len);
		w_bytes(w, c.data, c.len);
	}
}

static void test_welcome(void **state)
{
	struct fr_boot_card cards[8], c;
	struct wr w;
	uint64_t nonce = 0;

	(void)state;
	build_welcome(&w, 0x0123456789abcdefull, 4, 4);
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 4, &nonce, cards),
			 0);
	assert_true(nonce == 0x0123456789abcdefull);
	for (int r = 0; r < 4; r++) {
		make_card(r == 1 ? 5 : r, &c);
		assert_true(card_equal(&cards[r], &c));
	}
	/* Wrong number of ranks, either way. */
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 3, &nonce, cards),
			 FR_EPROTO);
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 5, &nonce, cards),
			 FR_EPROTO);
	/* Says 5 ranks, carries 4 cards. */
	build_welcome(&w, 1, 5, 4);
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 5, &nonce, cards),
			 FR_EPROTO);
	/* Every truncation. */
	build_welcome(&w, 7, 4, 4);
	for (size_t len = 0; len < w.len; len++)
		if (parse_welcome_exact(w.buf, len, 4, &nonce, cards) !=
		    FR_EPROTO)
			fail_msg("a welcome truncated to %zu of %zu bytes was accepted",
				 len, w.len);
	/* Trailing bytes. */
	for (size_t extra = 1; extra <= 8; extra++) {
		build_welcome(&w, 7, 4, 4);
		w_fill(&w, 0, extra);
		assert_int_equal(parse_welcome_exact(w.buf, w.len, 4, &nonce,
						     cards),
				 FR_EPROTO);
	}
	/* An over-long card. */
	w.len = 0;
	w_u64(&w, 1);
	w_u32(&w, 1);
	w_u16(&w, FR_BOOT_CARD_MAX + 1);
	w_fill(&w, 1, FR_BOOT_CARD_MAX + 1);
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 1, &nonce, cards),
			 FR_EPROTO);
	/* The largest one is fine. */
	w.len = 0;
	w_u64(&w, 1);
	w_u32(&w, 1);
	w_u16(&w, FR_BOOT_CARD_MAX);
	w_fill(&w, 1, FR_BOOT_CARD_MAX);
	assert_int_equal(parse_welcome_exact(w.buf, w.len, 1, &nonce, cards),
			 0);
	assert_int_equal(cards[0].len, FR_BOOT_CARD_MAX);
}

static void test_reject(void **state)
{
	struct wr w;
	int32_t code;
	char msg[64];
	static const char text[] = "bad\x01\ttoken\x7f\xff\x80 \nend~";
	const size_t tlen = sizeof(text) - 1;

	(void)state;
	w.len = 0;
	w_u32(&w, (uint32_t)FR_EAUTH);
	w_u16(&w, (uint16_t)tlen);
	w_bytes(&w, text, tlen);
	memset(msg, 'Z', sizeof(msg));
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg,
					      sizeof(msg)),
			 0);
	assert_int_equal(code, FR_EAUTH);
	assert_string_equal(msg, "bad??token??? ?end~");
	for (const char *p = msg; *p; p++)
		assert_true(*p >= 0x20 && *p <= 0x7e);

	/* A non-negative code is no error code: it becomes FR_EBOOTSTRAP. */
	fr_put_le32(w.buf, 0);
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg,
					      sizeof(msg)),
			 0);
	assert_int_equal(code, FR_EBOOTSTRAP);
	fr_put_le32(w.buf, 12345);
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg,
					      sizeof(msg)),
			 0);
	assert_int_equal(code, FR_EBOOTSTRAP);

	/* A small message buffer truncates and terminates, no more. */
	memset(msg, 'Z', sizeof(msg));
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg, 4), 0);
	assert_string_equal(msg, "bad");
	assert_int_equal(msg[4], 'Z');
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg, 1), 0);
	assert_string_equal(msg, "");
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg, 0),
			 FR_EPROTO);

	/* Truncated and trailing. */
	for (size_t len = 0; len < w.len; len++) {
		uint8_t *q = exact(w.buf, len);

		assert_int_equal(fr_boot_parse_reject(q, len, &code, msg,
						      sizeof(msg)),
				 FR_EPROTO);
		free(q);
	}
	w_fill(&w, 'x', 1);
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg,
					      sizeof(msg)),
			 FR_EPROTO);
	/* Empty message. */
	w.len = 0;
	w_u32(&w, (uint32_t)FR_EBOOTSTRAP);
	w_u16(&w, 0);
	assert_int_equal(fr_boot_parse_reject(w.buf, w.len, &code, msg,
					      sizeof(msg)),
			 0);
	assert_string_equal(msg, "");
	assert_int_equal(code, FR_EBOOTSTRAP);
}

/* ---- fuzz ------------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static void mutate(uint8_t *buf, size_t *len, size_t cap)
{
	int nops = 1 + (int)(rng() % 4);

	for (int i = 0; i < nops; i++) {
		switch (rng() % 6) {
		case 0: /* a random byte */
			if (*len)
				buf[rng() % *len] = (uint8_t)rng();
			break;
		case 1: /* a bit */
			if (*len)
				buf[rng() % *len] ^= (uint8_t)(1u << (rng() % 8));
			break;
		case 2: { /* a 16-bit length-like value */
			static const uint16_t v[] = { 0,   1,   255, 256, 257,
						      511, 512, 513, 0x7fff,
						      0xffff };

			if (*len >= 2)
				fr_put_le16(buf + rng() % (*len - 1),
					    rng() % 2 ? v[rng() % 10] :
							(uint16_t)rng());
			break;
		}
		case 3: /* truncate */
			if (*len)
				*len = rng() % *len;
			break;
		case 4: { /* append */
			size_t n = rng() % 16;

			for (size_t j = 0; j < n && *len < cap; j++)
				buf[(*len)++] = (uint8_t)rng();
			break;
		}
		default: { /* insert or delete a byte */
			size_t at = *len ? rng() % *len : 0;

			if (rng() % 2 && *len < cap) {
				memmove(buf + at + 1, buf + at, *len - at);
				buf[at] = (uint8_t)rng();
				(*len)++;
			} else if (*len) {
				memmove(buf + at, buf + at + 1, *len - at - 1);
				(*len)--;
			}
			break;
		}
		}
	}
}

static void test_fuzz_hello(void **state)
{
	struct fr_boot_hello base, h;
	uint8_t msg[MSG_MAX], buf[MSG_MAX + 256], re[MSG_MAX];
	size_t blen, len;
	int n, accepted = 0;

	(void)state;
	rng_state = 0x9e3779b97f4a7c15ull;
	fill_hello(&base, 2, 4, "job-token", "transport=tcp segment=524288",
		   3);
	n = fr_boot_build_hello(&base, msg, sizeof(msg));
	assert_true(n > FR_BOOT_HDR);
	blen = (size_t)n - FR_BOOT_HDR;
	for (int it = 0; it < 20000; it++) {
		memcpy(buf, msg + FR_BOOT_HDR, blen);
		len = blen;
		mutate(buf, &len, sizeof(buf));
		int rc = parse_hello_exact(buf, len, &h);

		if (rc != 0 && rc != FR_EPROTO)
			fail_msg("iteration %d: parse returned %d", it, rc);
		if (rc)
			continue;
		accepted++;
		/* What is accepted is sane and is exactly what it encodes. */
		assert_true(h.token_len <= FR_BOOT_TOKEN_MAX);
		assert_true(h.config_len <= FR_BOOT_CONFIG_MAX);
		assert_true(h.card.len <= FR_BOOT_CARD_MAX);
		assert_int_equal(strlen(h.token), h.token_len);
		assert_int_equal(strlen(h.config), h.config_len);
		n = fr_boot_build_hello(&h, re, sizeof(re));
		assert_int_equal(n, FR_BOOT_HDR + (int)len);
		assert_memory_equal(re + FR_BOOT_HDR, buf, len);
	}
	/* The loop did try valid-looking messages too (e.g. rank changes). */
	assert_true(accepted > 0);
}

static void test_fuzz_other(void **state)
{
	struct fr_boot_card cards[4];
	struct wr w;
	uint8_t buf[4096 + 256];
	size_t len;
	uint64_t nonce;
	uint16_t type;
	uint32_t plen;
	int32_t code;
	char msg[32];

	(void)state;
	rng_state = 0x0123456789abcdefull;
	for (int it = 0; it < 20000; it++) {
		int rc;

		/* header */
		fr_boot_put_header(buf, (uint16_t)(1 + rng() % 3),
				   (uint32_t)rng() % 5000);
		len = FR_BOOT_HDR;
		mutate(buf, &len, sizeof(buf));
		uint8_t *q = exact(buf, len);

		rc = fr_boot_parse_header(q, len, &type, &plen);
		free(q);
		assert_true(rc == 0 || rc == FR_EPROTO);
		if (!rc) {
			assert_true(len >= FR_BOOT_HDR);
			assert_true(fr_get_le32(buf) == FR_BOOT_MAGIC);
			assert_true(type >= FR_BOOT_HELLO &&
				    type <= FR_BOOT_TICKET);
			assert_true(plen <= FR_BOOT_PAYLOAD_MAX);
		}
		/* welcome */
		build_welcome(&w, rng(), 4, 4);
		memcpy(buf, w.buf, w.len);
		len = w.len;
		mutate(buf, &len, sizeof(buf));
		rc = parse_welcome_exact(buf, len, 4, &nonce, cards);
		assert_true(rc == 0 || rc == FR_EPROTO);
		if (!rc) {
			size_t sum = 12;

			for (int r = 0; r < 4; r++) {
				assert_true(cards[r].len <= FR_BOOT_CARD_MAX);
				sum += 2 + cards[r].len;
			}
			assert_int_equal(sum, len);
		}
		/* reject */
		w.len = 0;
		w_u32(&w, (uint32_t)FR_EAUTH);
		w_u16(&w, 10);
		w_bytes(&w, "0123456789", 10);
		memcpy(buf, w.buf, w.len);
		len = w.len;
		mutate(buf, &len, sizeof(buf));
		q = exact(buf, len);
		rc = fr_boot_parse_reject(q, len, &code, msg,
					  1 + rng() % sizeof(msg));
		free(q);
		assert_true(rc == 0 || rc == FR_EPROTO);
		if (!rc) {
			assert_true(code < 0);
			for (const char *p = msg; *p; p++)
				assert_true(*p >= 0x20 && *p <= 0x7e);
		}
	}
}

/* ---- real rendezvous ------------------------------------------------------------------ */

#define TOKEN "job-token-1234"
#define CONFIG "transport=tcp segment=524288 slots=8"
#define WAIT_MS 15000 /* bound on every child */

static char rdv[64];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A port nobody listens on now. */
static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
	close(fd);
	return ntohs(a.sin_port);
}

static void new_rendezvous(void)
{
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%u", (unsigned)free_port());
}

struct spec {
	int rank, nranks;
	const char *token;
	const char *config;
	int timeout_ms;
	int card_rank; /* whose card to present (normally rank) */
	int gate_wait; /* children: wait for a byte on the gate first */
	int gate_post; /* children: bytes to write to the gate when done */
	bool gate_on_fail; /* ... only if the rendezvous failed */
	int mid_sleep_ms;  /* connected, sleep before the HELLO */
	bool begin_post;   /* post the gate once connected */
	bool mid_gate2;	   /* connected, wait for a byte on gate2 */
};

struct result {
	int begin_rc, exch_rc;
	uint64_t nonce;
	int cards_ok;
	char ip[64];
	char err[256];
};

struct child {
	pid_t pid;
	int fd; /* read end of its result pipe */
};

static int gate[2] = {-1, -1}, gate2[2] = {-1, -1};

static void gate_open(void)
{
	assert_int_equal(pipe(gate), 0);
}

static void gate_close(void)
{
	close(gate[0]);
	close(gate[1]);
	gate[0] = gate[1] = -1;
}

/* Wait (bounded) for a byte on the gate; go on regardless after that. */
static void gate_pass(void)
{
	struct pollfd p = { gate[0], POLLIN, 0 };
	char c;

	if (poll(&p, 1, 5000) == 1)
		(void)!read(gate[0], &c, 1);
}

static void gate_post(int n)
{
	for (int i = 0; i < n; i++)
		(void)!write(gate[1], "x", 1);
}

static void gate2_pass(void)
{
	struct pollfd p = {gate2[0], POLLIN, 0};
	char c;

	if (poll(&p, 1, 5000) == 1)
		(void)!read(gate2[0], &c, 1);
}

/* One rank's rendezvous; never asserts (it runs in children too). */
static void run_rank(const struct spec *s, struct result *res)
{
	struct fr_boot_params p;
	struct fr_boot *b = NULL;
	struct fr_boot_card mine, *cards, want;

	memset(res, 0, sizeof(*res));
	res->exch_rc = 1; /* "not reached" */
	p.rank = s->rank;
	p.nranks = s->nranks;
	p.rendezvous = rdv;
	p.token = s->token;
	p.timeout_ms = s->timeout_ms;
	p.err = res->err;
	p.errlen = sizeof(res->err);
	res->begin_rc = fr_boot_begin(&p, &b);
	if (res->begin_rc)
		return;
	snprintf(res->ip, sizeof(res->ip), "%s", fr_boot_local_ip(b));
	if (s->begin_post)
		gate_post(1);
	if (s->mid_gate2)
		gate2_pass();
	if (s->mid_sleep_ms)
		usleep((useconds_t)s->mid_sleep_ms * 1000u);
	cards = calloc((size_t)s->nranks, sizeof(*cards));
	make_card(s->card_rank, &mine);
	res->exch_rc = fr_boot_exchange(b, s->config, &mine, cards,
					&res->nonce);
	if (!res->exch_rc) {
		res->cards_ok = 1;
		for (int r = 0; r < s->nranks; r++) {
			make_card(r, &want);
			if (!card_equal(&cards[r], &want))
				res->cards_ok = 0;
		}
	}
	free(cards);
	fr_boot_end(b);
}

static struct child spawn(const struct spec *s)
{
	struct child c;
	int fds[2];

	assert_int_equal(pipe(fds), 0);
	fflush(NULL);
	c.pid = fork();
	assert_true(c.pid >= 0);
	if (c.pid == 0) {
		struct result res;
		int failed;

		close(fds[0]);
		signal(SIGPIPE, SIG_IGN);
		if (s->gate_wait)
			gate_pass();
		run_rank(s, &res);
		failed = res.begin_rc || res.exch_rc;
		if (!s->gate_on_fail || failed)
			gate_post(s->gate_post);
		_exit(write(fds[1], &res, sizeof(res)) == sizeof(res) ? 0 : 3);
	}
	close(fds[1]);
	c.fd = fds[0];
	return c;
}

/* Reap a child within the bound (killing it after); its exit status. */
static int reap(pid_t pid)
{
	uint64_t deadline = now_ms() + WAIT_MS;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -2;
		if (now_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(5000);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void collect(struct child *c, struct result *res)
{
	int st = reap(c->pid);
	ssize_t n;

	if (st == -1)
		fail_msg("child %d did not finish within %d ms", (int)c->pid,
			 WAIT_MS);
	if (st != 0)
		fail_msg("child %d exited with status %d", (int)c->pid, st);
	n = read(c->fd, res, sizeof(*res));
	close(c->fd);
	assert_int_equal(n, (ssize_t)sizeof(*res));
}

static struct spec genuine(int rank, int nranks)
{
	struct spec s = { .rank = rank, .nranks = nranks, .token = TOKEN,
			  .config = CONFIG, .timeout_ms = 10000,
			  .card_rank = rank };

	return s;
}

static void expect_success(const struct result *r, int rank)
{
	if (r->begin_rc || r->exch_rc)
		fail_msg("rank %d: begin %d exchange %d: %s", rank, r->begin_rc,
			 r->exch_rc, r->err);
	assert_int_equal(r->cards_ok, 1);
	assert_string_equal(r->ip, "127.0.0.1");
}

/* Rank 0 here, ranks 1..n-1 in children; returns the nonce. */
/* Rank 0 here, ranks 1..n-1 in children, each silent for mid_sleep_ms
 * between connecting and its HELLO; returns the nonce. */
static uint64_t run_job(int n, int mid_sleep_ms)
{
	struct child *kids = calloc((size_t)n, sizeof(*kids));
	struct result *res = calloc((size_t)n, sizeof(*res));
	uint64_t nonce;

	assert_non_null(kids);
	assert_non_null(res);
	new_rendezvous();
	for (int r = 1; r < n; r++) {
		struct spec s = genuine(r, n);

		s.mid_sleep_ms = mid_sleep_ms;
		kids[r] = spawn(&s);
	}
	struct spec s0 = genuine(0, n);

	run_rank(&s0, &res[0]);
	for (int r = 1; r < n; r++)
		collect(&kids[r], &res[r]);
	for (int r = 0; r < n; r++) {
		expect_success(&res[r], r);
		assert_true(res[r].nonce == res[0].nonce);
	}
	nonce = res[0].nonce;
	free(kids);
	free(res);
	return nonce;
}

static void test_rendezvous_ok(void **state)
{
	uint64_t a, b;

	(void)state;
	a = run_job(4, 0);
	b = run_job(4, 0);
	assert_true(a != b); /* a fresh random nonce per job */
	run_job(2, 0);
}

static void test_rendezvous_one_rank(void **state)
{
	struct spec s = genuine(0, 1);
	struct result res;

	(void)state;
	snprintf(rdv, sizeof(rdv), "127.0.0.1:1"); /* never used */
	run_rank(&s, &res);
	expect_success(&res, 0);
}

static void test_wrong_token(void **state)
{
	static const char *const bad_tokens[] = { "wrong-token", "",
						  TOKEN "x" };

	(void)state;
	for (size_t t = 0; t < 3; t++) {
		struct child kids[4], stranger;
		struct result res[4], sres;
		struct spec s;

		new_rendezvous();
		gate_open();
		/* A stranger claiming rank 1, first. */
		s = genuine(1, 4);
		s.token = bad_tokens[t][0] ? bad_tokens[t] : NULL;
		s.gate_post = 3;
		stranger = spawn(&s);
		/* The genuine ranks once the stranger is done. */
		for (int r = 1; r < 4; r++) {
			s = genuine(r, 4);
			s.gate_wait = 1;
			kids[r] = spawn(&s);
		}
		s = genuine(0, 4);
		run_rank(&s, &res[0]);
		collect(&stranger, &sres);
		for (int r = 1; r < 4; r++)
			collect(&kids[r], &res[r]);
		gate_close();
		assert_int_equal(sres.begin_rc, 0);
		if (sres.exch_rc != FR_EAUTH)
			fail_msg("stranger with token \"%s\": %d (%s), want FR_EAUTH",
				 bad_tokens[t], sres.exch_rc, sres.err);
		assert_non_null(strstr(sres.err, "token"));
		for (int r = 0; r < 4; r++) {
			expect_success(&res[r], r);
			assert_true(res[r].nonce == res[0].nonce);
		}
	}
}

static void test_tokenless_job(void **state)
{
	struct child kid, stranger;
	struct result res0, res1, sres;
	struct spec s;

	(void)state;
	/* A job without a token still refuses a client that has one. */
	new_rendezvous();
	gate_open();
	s = genuine(1, 2);
	s.token = NULL;
	s.gate_wait = 1;
	kid = spawn(&s);
	s = genuine(1, 2);
	s.gate_post = 1;
	stranger = spawn(&s);
	s = genuine(0, 2);
	s.token = NULL;
	run_rank(&s, &res0);
	collect(&stranger, &sres);
	collect(&kid, &res1);
	gate_close();
	assert_int_equal(sres.exch_rc, FR_EAUTH);
	expect_success(&res0, 0);
	expect_success(&res1, 1);
	assert_true(res0.nonce == res1.nonce);
}

static void test_config_mismatch(void **state)
{
	struct child kids[4];
	struct result res[4];

	(void)state;
	new_rendezvous();
	for (int r = 1; r < 4; r++) {
		struct spec s = genuine(r, 4);

		if (r == 2)
			s.config = "transport=tcp segment=1024 slots=8";
		kids[r] = spawn(&s);
	}
	struct spec s0 = genuine(0, 4);

	run_rank(&s0, &res[0]);
	for (int r = 1; r < 4; r++)
		collect(&kids[r], &res[r]);
	for (int r = 0; r < 4; r++) {
		assert_int_equal(res[r].begin_rc, 0);
		if (res[r].exch_rc != FR_EBOOTSTRAP)
			fail_msg("rank %d: %d (%s), want FR_EBOOTSTRAP", r,
				 res[r].exch_rc, res[r].err);
		/* Everybody is told who disagrees. */
		if (!strstr(res[r].err, "rank 2"))
			fail_msg("rank %d: \"%s\" does not name rank 2", r,
				 res[r].err);
	}
}

static void test_nranks_mismatch(void **state)
{
	struct child kids[4];
	struct result res[4];

	(void)state;
	new_rendezvous();
	for (int r = 1; r < 4; r++) {
		struct spec s = genuine(r, 4);

		if (r == 3)
			s.nranks = 5;
		s.timeout_ms = 3000;
		kids[r] = spawn(&s);
	}
	struct spec s0 = genuine(0, 4);

	s0.timeout_ms = 3000;
	run_rank(&s0, &res[0]);
	for (int r = 1; r < 4; r++)
		collect(&kids[r], &res[r]);
	/* Rank 0 and the odd one out fail with a reason; nobody succeeds. */
	assert_int_equal(res[0].begin_rc, FR_EBOOTSTRAP);
	assert_non_null(strstr(res[0].err, "rank 3"));
	assert_int_equal(res[3].begin_rc, 0);
	assert_int_equal(res[3].exch_rc, FR_EBOOTSTRAP);
	assert_non_null(strstr(res[3].err, "5"));
	for (int r = 1; r < 3; r++)
		if (!res[r].begin_rc && !res[r].exch_rc)
			fail_msg("rank %d completed a failed rendezvous", r);
}

static void test_rank0_missing(void **state)
{
	struct spec s = genuine(1, 2);
	struct result res;
	uint64_t t0, dt;

	(void)state;
	new_rendezvous(); /* nobody listens there */
	s.timeout_ms = 500;
	t0 = now_ms();
	run_rank(&s, &res);
	dt = now_ms() - t0;
	assert_int_equal(res.begin_rc, FR_ETIMEDOUT);
	assert_non_null(strstr(res.err, rdv));
	assert_true(dt >= 400);
	if (dt > 3000)
		fail_msg("timed out after %llu ms, not about 500",
			 (unsigned long long)dt);

	/* Rank 0 whose peer never comes times out too, naming it. */
	s = genuine(0, 2);
	s.timeout_ms = 300;
	t0 = now_ms();
	run_rank(&s, &res);
	dt = now_ms() - t0;
	assert_int_equal(res.begin_rc, FR_ETIMEDOUT);
	assert_non_null(strstr(res.err, "rank 1"));
	assert_true(dt >= 250 && dt < 3000);
}

static void test_bad_params(void **state)
{
	struct fr_boot_params p;
	struct fr_boot *b = NULL;
	char err[256], tok[FR_BOOT_TOKEN_MAX + 2], cfg[FR_BOOT_CONFIG_MAX + 2];
	struct fr_boot_card mine, cards[1];
	uint64_t nonce;

	(void)state;
	memset(tok, 'k', sizeof(tok) - 1);
	tok[sizeof(tok) - 1] = '\0';
	p = (struct fr_boot_params){ .rank = 1, .nranks = 2,
				     .rendezvous = "127.0.0.1:1", .token = tok,
				     .timeout_ms = 100, .err = err,
				     .errlen = sizeof(err) };
	err[0] = '\0';
	assert_int_equal(fr_boot_begin(&p, &b), FR_EINVAL);
	assert_true(strlen(err) > 0);
	p.token = NULL;
	p.rendezvous = "no-port-here";
	err[0] = '\0';
	assert_int_equal(fr_boot_begin(&p, &b), FR_EINVAL);
	assert_non_null(strstr(err, "no-port-here"));
	/* A config longer than the protocol carries. */
	p = (struct fr_boot_params){ .rank = 0, .nranks = 1,
				     .rendezvous = "127.0.0.1:1",
				     .timeout_ms = 100, .err = err,
				     .errlen = sizeof(err) };
	assert_int_equal(fr_boot_begin(&p, &b), 0);
	memset(cfg, 'c', sizeof(cfg) - 1);
	cfg[sizeof(cfg) - 1] = '\0';
	make_card(0, &mine);
	assert_int_equal(fr_boot_exchange(b, cfg, &mine, cards, &nonce),
			 FR_EINVAL);
	fr_boot_end(b);
	fr_boot_end(NULL);
}

/* ---- hostile clients ------------------------------------------------------------------ */

enum raw_kind { RAW_GARBAGE, RAW_HUGE, RAW_SILENT, RAW_BAD_RANK, RAW_HALF };

/* Connect to the rendezvous, retrying while rank 0 is not up yet. */
static int raw_connect(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	char host[64];
	uint16_t port;
	uint64_t deadline = now_ms() + 5000;

	if (fr_parse_hostport(rdv, host, sizeof(host), &port))
		return -1;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	while (now_ms() < deadline) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		if (fd < 0)
			return -1;
		if (!connect(fd, (struct sockaddr *)&a, sizeof(a)))
			return fd;
		close(fd);
		usleep(10000);
	}
	return -1;
}

/* Wait until rank 0 closes the connection: 0, or 1 on timeout. */
static int wait_closed(int fd, int ms)
{
	uint8_t buf[512];
	uint64_t deadline = now_ms() + (uint64_t)ms;

	while (now_ms() < deadline) {
		struct pollfd p = { fd, POLLIN, 0 };

		if (poll(&p, 1, 100) == 1) {
			ssize_t n = recv(fd, buf, sizeof(buf), 0);

			if (n <= 0)
				return 0;
		}
	}
	return 1;
}

/*
 * A child that speaks nonsense: it posts the gate once it has been dropped
 * (or, when silent, once connected) and exits 0 if rank 0 closed the
 * connection in time.
 */
static pid_t spawn_raw(enum raw_kind kind, int posts)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid)
		return pid;
	signal(SIGPIPE, SIG_IGN);
	int fd = raw_connect(), rc = 10;
	uint8_t buf[MSG_MAX];
	struct fr_boot_hello h;

	if (fd < 0)
		_exit(20);
	switch (kind) {
	case RAW_GARBAGE:
		for (int i = 0; i < 64; i++)
			buf[i] = (uint8_t)(i * 37 + 11);
		(void)!send(fd, buf, 64, MSG_NOSIGNAL);
		rc = wait_closed(fd, 5000);
		gate_post(posts);
		break;
	case RAW_HUGE: /* a valid header announcing a huge hello */
		fr_boot_put_header(buf, FR_BOOT_HELLO, FR_BOOT_PAYLOAD_MAX);
		(void)!send(fd, buf, FR_BOOT_HDR, MSG_NOSIGNAL);
		rc = wait_closed(fd, 5000);
		gate_post(posts);
		break;
	case RAW_HALF: /* half a header, then hang up */
		fr_boot_put_header(buf, FR_BOOT_HELLO, 100);
		(void)!send(fd, buf, 6, MSG_NOSIGNAL);
		close(fd);
		fd = -1;
		rc = 0;
		usleep(100000);
		gate_post(posts);
		break;
	case RAW_BAD_RANK: { /* the right token, a rank that does not exist */
		uint16_t type;
		uint32_t plen;
		int n;

		fill_hello(&h, 7, 4, TOKEN, CONFIG, 1);
		n = fr_boot_build_hello(&h, buf, sizeof(buf));
		(void)!send(fd, buf, (size_t)n, MSG_NOSIGNAL);
		/* Expect a REJECT, then the close. */
		struct pollfd p = { fd, POLLIN, 0 };

		rc = 11;
		if (poll(&p, 1, 5000) == 1 &&
		    recv(fd, buf, FR_BOOT_HDR, MSG_WAITALL) == FR_BOOT_HDR &&
		    !fr_boot_parse_header(buf, FR_BOOT_HDR, &type, &plen) &&
		    type == FR_BOOT_REJECT)
			rc = wait_closed(fd, 5000);
		gate_post(posts);
		break;
	}
	case RAW_SILENT: /* says nothing until rank 0 is done */
		gate_post(posts);
		rc = wait_closed(fd, WAIT_MS - 2000);
		break;
	}
	if (fd >= 0)
		close(fd);
	_exit(rc);
}

static void hostile_job(enum raw_kind kind)
{
	struct child kids[4];
	struct result res[4];
	pid_t raw;
	int st;

	new_rendezvous();
	gate_open();
	raw = spawn_raw(kind, 3);
	for (int r = 1; r < 4; r++) {
		struct spec s = genuine(r, 4);

		s.gate_wait = 1;
		kids[r] = spawn(&s);
	}
	struct spec s0 = genuine(0, 4);

	run_rank(&s0, &res[0]);
	for (int r = 1; r < 4; r++)
		collect(&kids[r], &res[r]);
	st = reap(raw);
	gate_close();
	for (int r = 0; r < 4; r++) {
		expect_success(&res[r], r);
		assert_true(res[r].nonce == res[0].nonce);
	}
	if (st != 0)
		fail_msg("hostile client %d: status %d (not dropped?)", kind,
			 st);
}

static void test_garbage_client(void **state)
{
	(void)state;
	hostile_job(RAW_GARBAGE);
}

static void test_huge_hello_client(void **state)
{
	(void)state;
	hostile_job(RAW_HUGE);
}

static void test_half_header_client(void **state)
{
	(void)state;
	hostile_job(RAW_HALF);
}

static void test_silent_client(void **state)
{
	(void)state;
	hostile_job(RAW_SILENT);
}

static void test_bad_rank_client(void **state)
{
	(void)state;
	hostile_job(RAW_BAD_RANK);
}

static void test_duplicate_rank(void **state)
{
	struct child kids[4], dup[2];
	struct result res[4], dres[2];

	(void)state;
	/* Two processes both say they are rank 1: one is refused. */
	new_rendezvous();
	gate_open();
	for (int i = 0; i < 2; i++) {
		struct spec s = genuine(1, 4);

		s.gate_post = 2;
		s.gate_on_fail = true;
		dup[i] = spawn(&s);
	}
	for (int r = 2; r < 4; r++) {
		struct spec s = genuine(r, 4);

		s.gate_wait = 1;
		kids[r] = spawn(&s);
	}
	struct spec s0 = genuine(0, 4);

	run_rank(&s0, &res[0]);
	for (int i = 0; i < 2; i++)
		collect(&dup[i], &dres[i]);
	for (int r = 2; r < 4; r++)
		collect(&kids[r], &res[r]);
	gate_close();
	int winner = dres[0].exch_rc == 0 ? 0 : 1, loser = 1 - winner;

	res[1] = dres[winner];
	for (int r = 0; r < 4; r++)
		expect_success(&res[r], r);
	assert_int_equal(dres[loser].begin_rc, 0);
	if (dres[loser].exch_rc != FR_EBOOTSTRAP)
		fail_msg("second rank 1: %d (%s), want FR_EBOOTSTRAP",
			 dres[loser].exch_rc, dres[loser].err);
	assert_non_null(strstr(dres[loser].err, "taken"));
}

/*
 * A rank connects as soon as it starts and says HELLO once its transport
 * is up: many ranks connected and silent at once are the normal start of
 * a large job on a busy host.  Rank 0 once kept 64 unidentified
 * connections and dropped the oldest beyond, genuine ranks included.
 */
static void test_many_slow_ranks(void **state)
{
	(void)state;
	run_job(150, 1500);
}

/*
 * Strangers that connect after the genuine ranks and say nothing make rank
 * 0 drop the oldest connections, the genuine ranks' (they have not said
 * HELLO yet): those connect again and the job still meets.
 */
static void test_stranger_flood(void **state)
{
	enum { N = 4, FLOOD = 100 };
	struct child kids[N];
	struct result res[N];
	pid_t raw;
	int st;

	(void)state;
	new_rendezvous();
	gate_open();
	assert_int_equal(pipe(gate2), 0);
	for (int r = 1; r < N; r++) {
		struct spec s = genuine(r, N);

		s.begin_post = true;
		s.mid_gate2 = true;
		kids[r] = spawn(&s);
	}
	fflush(NULL);
	raw = fork();
	assert_true(raw >= 0);
	if (raw == 0) {
		int fds[FLOOD], n = 0;

		for (int r = 1; r < N; r++)
			gate_pass(); /* every genuine rank is connected */
		while (n < FLOOD && (fds[n] = raw_connect()) >= 0)
			n++;
		usleep(300000); /* rank 0 accepts them, dropping the oldest */
		for (int r = 1; r < N; r++)
			(void)!write(gate2[1], "x", 1);
		usleep(2000000);
		_exit(n == FLOOD ? 0 : 10);
	}
	struct spec s0 = genuine(0, N);

	run_rank(&s0, &res[0]);
	for (int r = 1; r < N; r++)
		collect(&kids[r], &res[r]);
	st = reap(raw);
	gate_close();
	close(gate2[0]);
	close(gate2[1]);
	for (int r = 0; r < N; r++) {
		expect_success(&res[r], r);
		assert_true(res[r].nonce == res[0].nonce);
	}
	assert_int_equal(st, 0);
}

/* ---- re-admission tickets (fr_comm_grow / fr_comm_join) ---------------- */

struct ticket_res {
	int rc;
	struct fr_boot_ticket t;
};

/* A newcomer in a child: takes a ticket with token, reports on a pipe. */
static pid_t ticket_child(const char *token, int timeout_ms, int *rfd)
{
	int p[2];
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct ticket_res r = {0};
		char err[256];

		close(p[0]);
		r.rc = fr_boot_ticket_get(rdv, token, timeout_ms, &r.t, err,
					  sizeof(err));
		if (write(p[1], &r, sizeof(r)) != sizeof(r))
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	*rfd = p[0];
	return pid;
}

static struct ticket_res ticket_collect(pid_t pid, int fd)
{
	struct ticket_res r = {.rc = 12345};

	assert_int_equal(read(fd, &r, sizeof(r)), sizeof(r));
	close(fd);
	waitpid(pid, NULL, 0);
	return r;
}

static int idle_calls;

static void count_idle(void *arg)
{
	(void)arg;
	idle_calls++;
}

static void test_tickets(void **state)
{
	struct ticket_res a, b, c, d;
	int fa, fb, fc, fd, served = -1, rc;
	pid_t pa, pb, pc, pd;
	char err[256] = "";

	(void)state;
	new_rendezvous();
	/* wrong token first: refused, not counted; then two good ones; a
	 * wrong one that comes after them finds the leader gone */
	idle_calls = 0;
	pa = ticket_child("wrong", 1500, &fa);
	pb = ticket_child("secret", 5000, &fb);
	pc = ticket_child("secret", 5000, &fc);
	rc = fr_boot_tickets_serve(rdv, "secret", 5, 2, 7, 0x1234abcdull, 5000,
				   count_idle, NULL, &served, err, sizeof(err));
	assert_int_equal(rc, 0);
	assert_int_equal(served, 2);
	a = ticket_collect(pa, fa);
	b = ticket_collect(pb, fb);
	c = ticket_collect(pc, fc);
	/* the wrong token may come after both good ones: then the leader is
	 * gone: it times out, or its connection, queued by the kernel, is
	 * closed unread (an error of the exchange); if before, it is
	 * refused.  Never a ticket. */
	if (a.rc >= 0)
		fail_msg("the wrong token got %d", a.rc);
	assert_int_equal(b.rc, 0);
	assert_int_equal(c.rc, 0);
	assert_int_equal(b.t.nranks, 7);
	assert_int_equal(c.t.nranks, 7);
	assert_true(b.t.nonce == 0x1234abcdull && c.t.nonce == 0x1234abcdull);
	assert_true((b.t.rank == 5 && c.t.rank == 6) ||
		    (b.t.rank == 6 && c.t.rank == 5));

	/* nobody comes: FR_ETIMEDOUT with a message, idle called meanwhile */
	idle_calls = 0;
	new_rendezvous();
	rc = fr_boot_tickets_serve(rdv, NULL, 3, 1, 4, 1, 300, count_idle, NULL,
				   &served, err, sizeof(err));
	assert_int_equal(rc, FR_ETIMEDOUT);
	assert_int_equal(served, 0);
	assert_non_null(strstr(err, "0 of 1 newcomers"));
	assert_true(idle_calls >= 2);

	/* a newcomer with no leader: FR_ETIMEDOUT after its timeout */
	new_rendezvous();
	pd = ticket_child(NULL, 200, &fd);
	d = ticket_collect(pd, fd);
	assert_int_equal(d.rc, FR_ETIMEDOUT);
}

static void test_tickets_refused(void **state)
{
	struct ticket_res a, b;
	int fa, fb, served = -1, rc, s;
	pid_t pa, pb, ps;
	char err[256] = "";
	int p[2];

	(void)state;
	new_rendezvous();
	/* the leader in a child, so that the wrong token is surely
	 * refused (it comes first, the right one only after its answer) */
	assert_int_equal(pipe(p), 0);
	ps = fork();
	assert_true(ps >= 0);
	if (ps == 0) {
		close(p[0]);
		rc = fr_boot_tickets_serve(rdv, "secret", 1, 1, 2, 42, 5000,
					   NULL, NULL, &served, err,
					   sizeof(err));
		if (write(p[1], &rc, sizeof(rc)) != sizeof(rc))
			_exit(1);
		_exit(served == 1 ? 0 : 1);
	}
	close(p[1]);
	pa = ticket_child("wrong", 5000, &fa);
	a = ticket_collect(pa, fa);
	assert_int_equal(a.rc, FR_EAUTH);
	pb = ticket_child("secret", 5000, &fb);
	b = ticket_collect(pb, fb);
	assert_int_equal(b.rc, 0);
	assert_int_equal(b.t.rank, 1);
	assert_int_equal(b.t.nranks, 2);
	assert_true(b.t.nonce == 42);
	assert_int_equal(read(p[0], &rc, sizeof(rc)), sizeof(rc));
	close(p[0]);
	assert_int_equal(rc, 0);
	assert_int_equal(waitpid(ps, &s, 0), ps);
	assert_true(WIFEXITED(s) && WEXITSTATUS(s) == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tickets),
		cmocka_unit_test(test_tickets_refused),
		cmocka_unit_test(test_header),
		cmocka_unit_test(test_hello_roundtrip),
		cmocka_unit_test(test_hello_build_invalid),
		cmocka_unit_test(test_hello_truncated_and_trailing),
		cmocka_unit_test(test_hello_lengths),
		cmocka_unit_test(test_hello_embedded_nul),
		cmocka_unit_test(test_welcome),
		cmocka_unit_test(test_reject),
		cmocka_unit_test(test_fuzz_hello),
		cmocka_unit_test(test_fuzz_other),
		cmocka_unit_test(test_rendezvous_ok),
		cmocka_unit_test(test_rendezvous_one_rank),
		cmocka_unit_test(test_many_slow_ranks),
		cmocka_unit_test(test_stranger_flood),
		cmocka_unit_test(test_wrong_token),
		cmocka_unit_test(test_tokenless_job),
		cmocka_unit_test(test_config_mismatch),
		cmocka_unit_test(test_nranks_mismatch),
		cmocka_unit_test(test_rank0_missing),
		cmocka_unit_test(test_bad_params),
		cmocka_unit_test(test_garbage_client),
		cmocka_unit_test(test_huge_hello_client),
		cmocka_unit_test(test_half_header_client),
		cmocka_unit_test(test_silent_client),
		cmocka_unit_test(test_bad_rank_client),
		cmocka_unit_test(test_duplicate_rank),
	};

	/* A peer hanging up must not kill the test with SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
