#!/usr/bin/env bash
# Runs every fuzz target of status-applier/fuzz for a bounded time each (cargo fuzz,
# libFuzzer). A crash fails the run and leaves its input in status-applier/fuzz/artifacts/.
#   hack/fuzz.sh [SECONDS_PER_TARGET=60]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
if ! cargo +nightly --version >/dev/null 2>&1; then
	echo "fuzz: skipped: cargo fuzz needs a nightly toolchain, and this machine has none"
	exit 0
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Builds are cached outside the clone, like the other builds of .ci/run.
target_dir=${CAPT_FUZZ_TARGET_DIR:-$HOME/.cache/capt-fuzz-target}
cd "$ROOT/status-applier"
for target in $(cargo +nightly fuzz list); do
	echo "== fuzz $target for $seconds s"
	mkdir -p "fuzz/corpus/$target"
	cargo +nightly fuzz run --target-dir "$target_dir" "$target" "fuzz/corpus/$target" -- -max_total_time="$seconds" -print_final_stats=1 2>&1 |
		grep -E "^(#[0-9]+ *DONE|Done|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|.*panicked)" || true
	# A crash leaves its input in fuzz/artifacts: that, not the filtered output, decides.
	if compgen -G "fuzz/artifacts/$target/*" >/dev/null; then
		echo "fuzz: $target found a crash: $(ls fuzz/artifacts/$target)"
		exit 1
	fi
done
echo "fuzz: every target ran $seconds s without a crash"
