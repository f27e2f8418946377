#!/usr/bin/env bash
# Runs every fuzz target of status-applier/fuzz for a bounded time each (cargo fuzz,
# libFuzzer), starting from the committed seeds of status-applier/fuzz/seeds/<target>/ (valid
# intents, managedFields of real objects) beside the local corpus (fuzz/corpus/<target>/,
# not committed: what libFuzzer finds goes there). A crash, a build failure or a target
# without seeds fails the run; a crashing input is left in status-applier/fuzz/artifacts/.
#   hack/fuzz.sh [SECONDS_PER_TARGET=60]
# Without a nightly toolchain it says so and does nothing, except in CI (CI=true), where that
# fails: a fuzz step that cannot run must not pass.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
if ! cargo +nightly --version >/dev/null 2>&1; then
	if [[ ${CI:-} == true ]]; then
		echo "fuzz: FAILED: cargo fuzz needs a nightly toolchain (rustup toolchain install nightly), and this machine has none" >&2
		exit 1
	fi
	echo "fuzz: skipped: cargo fuzz needs a nightly toolchain, and this machine has none"
	exit 0
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Builds are cached outside the clone, like the other builds of .ci/run.
target_dir=${CAPT_FUZZ_TARGET_DIR:-$HOME/.cache/capt-fuzz-target}
cd "$ROOT/status-applier"
targets=$(cargo +nightly fuzz list)
[[ -n $targets ]] || { echo "fuzz: FAILED: cargo fuzz lists no target" >&2; exit 1; }
for target in $targets; do
	seeds="fuzz/seeds/$target"
	if ! compgen -G "$seeds/*" >/dev/null; then
		echo "fuzz: FAILED: $target has no seeds in status-applier/$seeds" >&2
		exit 1
	fi
	# Crashes of earlier runs stay for the developer; this run's are those it adds.
	before=$(ls "fuzz/artifacts/$target" 2>/dev/null || true)
	echo "== fuzz $target for $seconds s ($(ls "$seeds" | wc -l) seeds)"
	mkdir -p "fuzz/corpus/$target"
	# libFuzzer reads every corpus directory given and writes new inputs to the first.
	set +e
	cargo +nightly fuzz run --target-dir "$target_dir" "$target" "fuzz/corpus/$target" "$seeds" -- \
		-max_total_time="$seconds" -print_final_stats=1 2>&1 |
		grep -E "^(#[0-9]+[[:space:]]+(INITED|DONE)|Done|INFO: seed corpus|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|.*panicked|error)"
	status=${PIPESTATUS[0]}
	set -e
	# A crash leaves its input in fuzz/artifacts and fails cargo fuzz; a failed build fails
	# it too, leaving none.
	found=$(comm -13 <(echo "$before") <(ls "fuzz/artifacts/$target" 2>/dev/null || true))
	if [[ -n $found ]]; then
		echo "fuzz: FAILED: $target found a crash: status-applier/fuzz/artifacts/$target/$found" >&2
		exit 1
	fi
	if ((status != 0)); then
		echo "fuzz: FAILED: cargo fuzz run $target exited with $status" >&2
		exit 1
	fi
done
echo "fuzz: every target ran $seconds s without a crash"
