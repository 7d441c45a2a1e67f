#!/bin/bash
# The transport conformance suite (tests/test_transport.c) over tcp,
# whatever FR_TEST_TRANSPORT says (tests/test_transport on its own runs the
# transport that FR_TEST_TRANSPORT names, tcp by default).  Skipped (77)
# where the suite is not built (no cmocka).
. "$(dirname "$0")/lib.sh"
conformance "FR_TEST_TRANSPORT=tcp"
