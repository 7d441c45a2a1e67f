/* SPDX-License-Identifier: MIT */
/*
 * test_errors.c - error codes, version, datatype and operation names
 * (include/fastreduce.h, src/errors.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastreduce.h"

/* ---- error codes ------------------------------------------------------------ */

struct code {
	const char *name; /* "FR_EINVAL" */
	int map_value;    /* the value written in FR_ERRNO_MAP */
	int enum_value;   /* the enumerator */
	const char *msg;  /* the message written in FR_ERRNO_MAP */
};

static const struct code codes[] = {
#define CODE_(name, val, msg) { "FR_" #name, (val), FR_##name, (msg) },
	FR_ERRNO_MAP(CODE_)
#undef CODE_
};
#define NCODES ((int)(sizeof(codes) / sizeof(codes[0])))

static void test_codes_negative_and_distinct(void **state)
{
	(void)state;
	/* The map is not empty and its enumerators are its values. */
	assert_true(NCODES >= 15);
	for (int i = 0; i < NCODES; i++) {
		assert_int_equal(codes[i].enum_value, codes[i].map_value);
		assert_true(codes[i].enum_value < 0);
		assert_int_not_equal(codes[i].enum_value, FR_OK);
		for (int j = i + 1; j < NCODES; j++) {
			assert_int_not_equal(codes[i].enum_value,
					     codes[j].enum_value);
			assert_string_not_equal(codes[i].name, codes[j].name);
		}
	}
	/* A few values are part of the stable ABI. */
	assert_int_equal(FR_OK, 0);
	assert_int_equal(FR_EINVAL, -1);
	assert_int_equal(FR_ETIMEDOUT, -4);
	assert_int_equal(FR_EAUTH, -13);
	assert_int_equal(FR_ERANGE, -14);
	assert_int_equal(FR_EREVOKED, -15);
	/* the codes are -1 .. -NCODES, no gap: the library recognises a
	 * code on the wire by that range (FR_ERRNO_LOWEST) */
	for (int i = 0; i < NCODES; i++)
		assert_true(codes[i].enum_value >= -NCODES);
}

static void test_strerror_errname(void **state)
{
	(void)state;
	for (int i = 0; i < NCODES; i++) {
		const char *s = fr_strerror(codes[i].enum_value);
		const char *n = fr_errname(codes[i].enum_value);

		assert_non_null(s);
		assert_non_null(n);
		assert_string_equal(s, codes[i].msg);
		assert_string_equal(n, codes[i].name);
		assert_true(strlen(s) > 0);
		assert_string_not_equal(s, "unknown error");
		assert_string_not_equal(n, "FR_E?");
		assert_string_not_equal(s, fr_strerror(FR_OK));
		assert_string_not_equal(n, fr_errname(FR_OK));
		for (int j = 0; j < NCODES; j++) {
			if (i == j)
				continue;
			assert_string_not_equal(s,
						fr_strerror(codes[j].enum_value));
			assert_string_not_equal(n,
						fr_errname(codes[j].enum_value));
		}
	}
}

static void test_ok(void **state)
{
	(void)state;
	assert_non_null(fr_strerror(FR_OK));
	assert_non_null(fr_errname(FR_OK));
	assert_string_equal(fr_errname(FR_OK), "FR_OK");
	assert_string_not_equal(fr_strerror(FR_OK), "unknown error");
	assert_true(strlen(fr_strerror(FR_OK)) > 0);
}

static void test_unknown_codes(void **state)
{
	int lowest = 0;

	(void)state;
	for (int i = 0; i < NCODES; i++)
		if (codes[i].enum_value < lowest)
			lowest = codes[i].enum_value;
	const int unknown[] = { 1, 2, 100, INT_MAX, INT_MIN, INT_MIN + 1,
				lowest - 1, lowest - 100, -1000 };

	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		const char *s = fr_strerror(unknown[i]);
		const char *n = fr_errname(unknown[i]);

		assert_non_null(s);
		assert_non_null(n);
		assert_string_equal(s, "unknown error");
		assert_string_equal(n, "FR_E?");
	}
}

/* ---- version ------------------------------------------------------------------ */

static void test_version(void **state)
{
	unsigned maj, min, pat;
	char tail;

	(void)state;
	assert_non_null(fr_version());
	assert_string_equal(fr_version(), FR_VERSION_STRING);
	assert_int_equal(fr_version_number(), FR_VERSION_NUMBER);
	/* The string, the components and the number agree. */
	assert_int_equal(sscanf(FR_VERSION_STRING, "%u.%u.%u%c", &maj, &min,
				&pat, &tail),
			 3);
	assert_int_equal(maj, FR_VERSION_MAJOR);
	assert_int_equal(min, FR_VERSION_MINOR);
	assert_int_equal(pat, FR_VERSION_PATCH);
	assert_int_equal(fr_version_number(), (maj << 16) | (min << 8) | pat);
	assert_true(maj < 256 && min < 256 && pat < 256);
}

/* ---- datatypes ------------------------------------------------------------------ */

static const struct {
	fr_dtype_t dtype;
	size_t size;
	const char *name;
	const char *alias[3];
} dtypes[] = {
	{ FR_F32, sizeof(float), "f32", { "float", "float32", NULL } },
	{ FR_F64, sizeof(double), "f64", { "double", "float64", NULL } },
	{ FR_F16, 2, "f16", { "half", "float16", NULL } },
	{ FR_BF16, 2, "bf16", { "bfloat16", NULL, NULL } },
	{ FR_I8, sizeof(int8_t), "i8", { "int8", NULL, NULL } },
	{ FR_U8, sizeof(uint8_t), "u8", { "uint8", NULL, NULL } },
	{ FR_I32, sizeof(int32_t), "i32", { "int32", "int", NULL } },
	{ FR_U32, sizeof(uint32_t), "u32", { "uint32", NULL, NULL } },
	{ FR_I64, sizeof(int64_t), "i64", { "int64", NULL, NULL } },
	{ FR_U64, sizeof(uint64_t), "u64", { "uint64", NULL, NULL } },
};
#define NDTYPES ((int)(sizeof(dtypes) / sizeof(dtypes[0])))

static void upper(char *dst, const char *src, size_t len)
{
	snprintf(dst, len, "%s", src);
	for (char *p = dst; *p; p++)
		*p = (char)toupper((unsigned char)*p);
}

/* "FlOaT": alternate case, starting upper. */
static void mixed(char *dst, const char *src, size_t len)
{
	snprintf(dst, len, "%s", src);
	for (size_t i = 0; dst[i]; i++)
		dst[i] = (char)(i % 2 ? tolower((unsigned char)dst[i]) :
					toupper((unsigned char)dst[i]));
}

static void expect_dtype(const char *name, fr_dtype_t want)
{
	fr_dtype_t got = (fr_dtype_t)-1;

	if (fr_dtype_from_name(name, &got) != 0)
		fail_msg("fr_dtype_from_name(\"%s\") failed", name);
	if (got != want)
		fail_msg("fr_dtype_from_name(\"%s\") = %d, want %d", name,
			 (int)got, (int)want);
}

static void test_dtype_table(void **state)
{
	(void)state;
	assert_int_equal(NDTYPES, FR_DTYPE_COUNT);
	for (int i = 0; i < NDTYPES; i++) {
		fr_dtype_t d = dtypes[i].dtype;

		assert_int_equal(fr_dtype_size(d), dtypes[i].size);
		assert_non_null(fr_dtype_name(d));
		assert_string_equal(fr_dtype_name(d), dtypes[i].name);
		for (int j = i + 1; j < NDTYPES; j++)
			assert_string_not_equal(fr_dtype_name(d),
						fr_dtype_name(dtypes[j].dtype));
	}
}

static void test_dtype_parse_roundtrip(void **state)
{
	char buf[64];

	(void)state;
	for (int d = 0; d < FR_DTYPE_COUNT; d++) {
		/* Every name printed parses back to its dtype. */
		expect_dtype(fr_dtype_name((fr_dtype_t)d), (fr_dtype_t)d);
		upper(buf, fr_dtype_name((fr_dtype_t)d), sizeof(buf));
		expect_dtype(buf, (fr_dtype_t)d);
		mixed(buf, fr_dtype_name((fr_dtype_t)d), sizeof(buf));
		expect_dtype(buf, (fr_dtype_t)d);
	}
	for (int i = 0; i < NDTYPES; i++) {
		for (int a = 0; a < 3 && dtypes[i].alias[a]; a++) {
			expect_dtype(dtypes[i].alias[a], dtypes[i].dtype);
			upper(buf, dtypes[i].alias[a], sizeof(buf));
			expect_dtype(buf, dtypes[i].dtype);
			mixed(buf, dtypes[i].alias[a], sizeof(buf));
			expect_dtype(buf, dtypes[i].dtype);
		}
	}
}

static void test_dtype_invalid(void **state)
{
	static const char *const bad[] = {
		"", "f", "f8", "f128", "f322", "f3", " f32", "f32 ",
		"float 32", "float32x", "int16", "i16", "u16", "bf", "bf160",
		"doubles", "?", "sum", "f32\n", "uint", "bfloat",
	};
	fr_dtype_t d = FR_F64;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (fr_dtype_from_name(bad[i], &d) != FR_EINVAL)
			fail_msg("fr_dtype_from_name(\"%s\") accepted", bad[i]);
	assert_int_equal(fr_dtype_from_name(NULL, &d), FR_EINVAL);
	assert_int_equal(fr_dtype_from_name("f32", NULL), FR_EINVAL);
	assert_int_equal(fr_dtype_from_name(NULL, NULL), FR_EINVAL);

	/* Out-of-range values: size 0 and name "?". */
	const int out[] = { FR_DTYPE_COUNT, FR_DTYPE_COUNT + 1, 100, -1,
			    INT_MIN };
	for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++) {
		assert_int_equal(fr_dtype_size((fr_dtype_t)out[i]), 0);
		assert_non_null(fr_dtype_name((fr_dtype_t)out[i]));
		assert_string_equal(fr_dtype_name((fr_dtype_t)out[i]), "?");
	}
}

/* ---- operations ------------------------------------------------------------------ */

static void expect_op(const char *name, fr_op_t want)
{
	fr_op_t got = (fr_op_t)-1;

	if (fr_op_from_name(name, &got) != 0)
		fail_msg("fr_op_from_name(\"%s\") failed", name);
	if (got != want)
		fail_msg("fr_op_from_name(\"%s\") = %d, want %d", name,
			 (int)got, (int)want);
}

static void test_op_names(void **state)
{
	static const struct {
		fr_op_t op;
		const char *name;
	} ops[] = {
		{ FR_SUM, "sum" }, { FR_PROD, "prod" }, { FR_MIN, "min" },
		{ FR_MAX, "max" }, { FR_AVG, "avg" },
	};
	char buf[32];

	(void)state;
	assert_int_equal(sizeof(ops) / sizeof(ops[0]), FR_OP_COUNT);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		assert_non_null(fr_op_name(ops[i].op));
		assert_string_equal(fr_op_name(ops[i].op), ops[i].name);
		for (size_t j = i + 1; j < sizeof(ops) / sizeof(ops[0]); j++)
			assert_string_not_equal(fr_op_name(ops[i].op),
						fr_op_name(ops[j].op));
	}
	for (int o = 0; o < FR_OP_COUNT; o++) {
		expect_op(fr_op_name((fr_op_t)o), (fr_op_t)o);
		upper(buf, fr_op_name((fr_op_t)o), sizeof(buf));
		expect_op(buf, (fr_op_t)o);
		mixed(buf, fr_op_name((fr_op_t)o), sizeof(buf));
		expect_op(buf, (fr_op_t)o);
	}
	expect_op("mean", FR_AVG);
	expect_op("MEAN", FR_AVG);
	expect_op("Mean", FR_AVG);
}

static void test_op_invalid(void **state)
{
	static const char *const bad[] = {
		"", "s", "su", "summ", "sum ", " sum", "average", "means",
		"product", "minimum", "f32", "?", "avg\n", "mea",
	};
	fr_op_t op = FR_MAX;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (fr_op_from_name(bad[i], &op) != FR_EINVAL)
			fail_msg("fr_op_from_name(\"%s\") accepted", bad[i]);
	assert_int_equal(fr_op_from_name(NULL, &op), FR_EINVAL);
	assert_int_equal(fr_op_from_name("sum", NULL), FR_EINVAL);
	const int out[] = { FR_OP_COUNT, FR_OP_COUNT + 7, -1, INT_MAX };
	for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++) {
		assert_non_null(fr_op_name((fr_op_t)out[i]));
		assert_string_equal(fr_op_name((fr_op_t)out[i]), "?");
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codes_negative_and_distinct),
		cmocka_unit_test(test_strerror_errname),
		cmocka_unit_test(test_ok),
		cmocka_unit_test(test_unknown_codes),
		cmocka_unit_test(test_version),
		cmocka_unit_test(test_dtype_table),
		cmocka_unit_test(test_dtype_parse_roundtrip),
		cmocka_unit_test(test_dtype_invalid),
		cmocka_unit_test(test_op_names),
		cmocka_unit_test(test_op_invalid),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
