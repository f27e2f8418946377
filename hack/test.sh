#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests against the real kube-apiserver
# of hack/testenv.sh, which this script starts and always stops (also when a test fails).
# Extra arguments go to `cargo test` (e.g. `hack/test.sh -p capt-tests`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Tests that must not see Cluster API core get an environment of their own (see tests/src/lib.rs).
trap 'hack/testenv.sh stop; CAPT_TESTENV_DIR=${CAPT_TESTENV_DIR:-$ROOT/.testenv}-nocore hack/testenv.sh stop' EXIT
eval "$(hack/testenv.sh start)"
echo "== cargo test (API server: $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}'))"
hack/cargo-progress.sh test build --workspace --bins
hack/cargo-progress.sh test test --workspace --no-run
cargo test --workspace "$@"
