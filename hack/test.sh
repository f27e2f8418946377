#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests against the real kube-apiserver
# of hack/testenv.sh, which this script starts and always stops (also when a test fails).
# Extra arguments go to `cargo test` (e.g. `hack/test.sh -p capt-tests`). Each test binary
# runs under a time limit of CAPT_TEST_TIMEOUT seconds (default 600; hack/test-runner.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Tests that must not see Cluster API core get an environment of their own, and so do the
# tests against the real provider-terraform (tests/tests/real_provider.rs; see tests/src/lib.rs).
trap 'hack/testenv.sh stop; CAPT_TESTENV_DIR=${CAPT_TESTENV_DIR:-$ROOT/.testenv}-nocore hack/testenv.sh stop; CAPT_TESTENV_DIR=${CAPT_TESTENV_DIR:-$ROOT/.testenv}-real hack/testenv.sh stop' EXIT
eval "$(hack/testenv.sh start)"
echo "== cargo test (API server: $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}'))"
hack/cargo-progress.sh test build --workspace --bins
hack/cargo-progress.sh test test --workspace --no-run
# Every test binary runs under a time limit (hack/test-runner.sh; CAPT_TEST_TIMEOUT seconds,
# default 600): a hang fails its binary, by name, instead of stalling the run.
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER"
export "$runner_var=$ROOT/hack/test-runner.sh"
cargo test --workspace --no-fail-fast "$@"
