#!/usr/bin/env bash
# Whole-system benchmark: N CAPT stacks with the system as deployed (status-applier +
# capt-controller, started with the command and environment of manifests/deploy/deployment.yaml)
# against the baseline (upstream CAPT's write pattern) and the floor (a direct writer), beside the real
# Cluster API core manager, on fresh API servers of their own (CAPT_TESTENV_DIR=.benchenv,
# restarted for each round, stopped at the end), with release builds. Prints markdown tables,
# each with the commit, the machine and this command; not part of the test run.
#   hack/bench.sh [--clusters 100,1000,3000] [--baseline-clusters 100,1000] [--steady-seconds 60]
#                 [--changes 100] [--burst 100] [--provider-delay-ms 100] [--modes sidecar,baseline]
#   (target/release/bench-system --help lists every flag)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
for arg in "$@"; do
	case "$arg" in
	-h | --help) # every flag, from the benchmark itself; nothing is started
		sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
		cargo build --release -q -p capt-tests --bin bench-system
		exec "${CARGO_TARGET_DIR:-target}/release/bench-system" --help
		;;
	esac
done
export CAPT_TESTENV_DIR="$ROOT/.benchenv"
# Core's client rate limit raised from its default 20/s (a difference from production the
# tables list): at 1,000 stacks provisioning otherwise waits on core alone.
export CAPT_TESTENV_CORE_QPS="${CAPT_TESTENV_CORE_QPS:-200}"
trap 'hack/testenv.sh stop' EXIT
hack/testenv.sh stop >/dev/null 2>&1 || true
eval "$(hack/testenv.sh start)"
cargo build --release -p status-applier -p capt-controller -p capt-tests --bins
# The binary finds the repository as cargo would tell a test (repo_root in tests/src/lib.rs).
CARGO_MANIFEST_DIR="$ROOT/tests" CAPT_BENCH_COMMAND="hack/bench.sh $*" "${CARGO_TARGET_DIR:-target}/release/bench-system" --restart-environment "$@"
