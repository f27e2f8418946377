#!/usr/bin/env bash
# Benchmark of the status-applier hop: intent → applied through the sidecar vs a direct
# kube-rs server-side apply, in one run against the real API server of hack/testenv.sh.
#   hack/bench-applier.sh [APPLIES=2000] [OBJECTS=50]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
trap 'hack/testenv.sh stop' EXIT
eval "$(hack/testenv.sh start)"
cargo build --release -p status-applier -p capt-tests --bins
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m); $(date -u +%Y-%m-%d)"
# The binary finds the repository as cargo would tell a test (repo_root in tests/src/lib.rs).
CARGO_MANIFEST_DIR="$ROOT/tests" "${CARGO_TARGET_DIR:-target}/release/bench-applier" "$@"
