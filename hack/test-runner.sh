#!/usr/bin/env bash
# Cargo's runner for test binaries in hack/test.sh (CARGO_TARGET_<triple>_RUNNER): runs one
# test binary under a time limit, so that a hang fails that binary, named, instead of
# stalling the whole run until CI's own limit.
#
#   hack/test-runner.sh BINARY [ARGS...]     (cargo adds BINARY and its arguments)
#
# CAPT_TEST_TIMEOUT: seconds per binary (default 600; the slowest binary takes about 2 min on
# a warm checkout). On expiry the binary's process group gets SIGTERM (the processes it
# started, which share the group, with it), SIGKILL 10 s later, and the run fails with the
# binary's name.
set -uo pipefail
limit=${CAPT_TEST_TIMEOUT:-600}
binary=$1
# Cargo names test binaries `<target>-<16 hex digits>`.
name=$(basename "$binary" | sed -E 's/-[0-9a-f]{16}$//')
started=$SECONDS
timeout --kill-after=10 "$limit" "$@"
status=$?
# 124: timed out (TERM); 137 after the limit: killed (KILL) after the grace period.
if ((status == 124 || (status == 137 && SECONDS - started >= limit))); then
	echo "hack/test-runner.sh: test binary '$name' ($binary) did not finish within $limit s (CAPT_TEST_TIMEOUT): killed" >&2
fi
exit "$status"
