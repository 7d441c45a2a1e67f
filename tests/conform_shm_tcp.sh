#!/bin/bash
# The transport conformance suite (tests/test_transport.c) over the mixed
# transport shm+tcp, through both of its sides: the suite's endpoints share
# a node, so they connect through shm; with FR_TEST_MUX_NODES=1 each has a
# node of its own (FR_NODE) and they connect through tcp.  Skipped (77)
# where the suite is not built (no cmocka) or shm+tcp is not usable here.
. "$(dirname "$0")/lib.sh"
conformance "FR_TEST_TRANSPORT=shm+tcp FR_TEST_MUX_NODES=0" \
	"FR_TEST_TRANSPORT=shm+tcp FR_TEST_MUX_NODES=1"
