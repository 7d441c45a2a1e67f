#!/bin/sh
# Test driver wrapper: every test gets a wall-clock bound (FR_TEST_TIMEOUT,
# seconds, default 900; the Soft-RoCE VM suite FR_VM_TEST_TIMEOUT, default
# 3000) so that a hang fails the test instead of CI.
t=${FR_TEST_TIMEOUT:-900}
case "$1" in
*verbs_vm.sh) exec timeout -k 10 "${FR_VM_TEST_TIMEOUT:-3000}" bash "$@" ;;
*.sh) exec timeout -k 10 "$t" bash "$@" ;;
*) exec timeout -k 10 "$t" "$@" ;;
esac
