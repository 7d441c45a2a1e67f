#!/bin/bash
# The transport conformance suite (tests/test_transport.c) over shared
# memory.  Skipped (77) where the suite is not built (no cmocka) or shm is
# not usable here (no memfd or AF_UNIX sockets: its probe says which).
. "$(dirname "$0")/lib.sh"
conformance "FR_TEST_TRANSPORT=shm"
