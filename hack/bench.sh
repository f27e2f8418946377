#!/usr/bin/env bash
# Whole-system benchmark: N CAPT stacks with the system as deployed (status-applier +
# capt-controller) against the naive baseline (full status updates, as upstream CAPT did),
# on a fresh API server of its own (CAPT_TESTENV_DIR=.benchenv, stopped at the end), with
# release builds. Prints markdown tables; not part of the test run.
#   hack/bench.sh [--clusters 100,1000] [--steady-seconds 60] [--changes 100] [--burst 100] ...
#   (target/release/bench-system --help lists every flag)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CAPT_TESTENV_DIR="$ROOT/.benchenv"
trap 'hack/testenv.sh stop' EXIT
hack/testenv.sh stop >/dev/null 2>&1 || true
eval "$(hack/testenv.sh start)"
cargo build --release -p status-applier -p capt-controller -p capt-tests --bins
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -m); $(date -u +%Y-%m-%d); commit $(git rev-parse --short HEAD)"
echo "command: hack/bench.sh $*"
"${CARGO_TARGET_DIR:-target}/release/bench-system" "$@"
