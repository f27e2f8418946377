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
# The previous release's programs for tests/tests/upgrade.rs, built before this tree's (which
# puts its own binaries back in target/debug/), cached by commit after the first run. A shallow
# clone fetches the history it needs; where that fails (no remote), the upgrade test alone is
# skipped, and said so at the start and at the end.
skipped_upgrade=
if ! hack/previous-release.sh >/dev/null; then
	skipped_upgrade="== SKIPPED tests/tests/upgrade.rs: the previous release's commit is not in this clone and could not be fetched (above); fetch it (git fetch --unshallow) and run: hack/test.sh -p capt-tests --test upgrade"
	echo "$skipped_upgrade"
fi
hack/cargo-progress.sh test build --workspace --bins
hack/cargo-progress.sh test test --workspace --no-run
# Every test binary runs under a time limit (hack/test-runner.sh; CAPT_TEST_TIMEOUT seconds,
# default 600): a hang fails its binary, by name, instead of stalling the run.
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER"
export "$runner_var=$ROOT/hack/test-runner.sh"
if (($#)); then
	cargo test --workspace --no-fail-fast "$@"
	exit
fi

# Two lanes. tests/tests/real_provider.rs spends its seven minutes mostly waiting for
# OpenTofu and for the provider's polls (1.5 min of CPU), in an environment of its own
# (.testenv-real), so it runs beside the other binaries instead of after them; its output
# follows theirs. Its time limit is about the other lane's length (CAPT_REAL_PROVIDER_TIMEOUT,
# default 1200 s), since the two share the machine: a hang still fails it by name. Every
# other test target is named, so that no binary runs twice and none is left out.
real_log=$(mktemp)
CAPT_TEST_TIMEOUT=${CAPT_REAL_PROVIDER_TIMEOUT:-1200} \
	cargo test -p capt-tests --test real_provider --no-fail-fast >"$real_log" 2>&1 &
real_pid=$!
others=()
while read -r target; do
	others+=(--test "$target")
done < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    if package["name"] == "capt-tests":
        for target in package["targets"]:
            if "test" in target["kind"] and target["name"] != "real_provider":
                print(target["name"])')
if [[ -n "$skipped_upgrade" ]]; then
	for i in "${!others[@]}"; do
		[[ "${others[i]}" == upgrade ]] && unset 'others[i-1]' 'others[i]'
	done
	others=("${others[@]}")
fi
status=0
cargo test --workspace --exclude capt-tests --no-fail-fast || status=1
cargo test -p capt-tests --lib --bins "${others[@]}" --no-fail-fast || status=1
cargo test -p capt-tests --doc --no-fail-fast || status=1
echo "== the real-provider lane (tests/tests/real_provider.rs), run beside the binaries above"
wait "$real_pid" || status=1
cat "$real_log"
rm -f "$real_log"
[[ -z "$skipped_upgrade" ]] || echo "$skipped_upgrade"
exit "$status"
