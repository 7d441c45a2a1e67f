#!/bin/sh
# transport_fake.sh - the transport conformance suite (tests/test_transport)
# against the unit tests' in-process fake transport (tests/fake_tp.c): the
# fake must obey src/transport.h as the real transports do, or the engine
# and peer tests built on it (test_engine, test_peer) prove little.  The
# tests whose peer is a child process skip (its endpoints live in one
# process).
FR_TEST_TRANSPORT=fake exec "${FR_BUILDDIR:-.}/tests/test_transport"
