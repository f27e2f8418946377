#!/usr/bin/env bash
# Runs the seeded replay (tests/tests/replay_seeded.rs) with N new random seeds against the
# real API server, J at a time, and ends with `N passed, M failed` and a `record:` line for
# docs/concurrency.md's table (command, commit, result). Each seed is printed as it is drawn;
# each failing seed is listed with the command that reruns it: keep it as a named
# regression test.
#
#   hack/soak.sh [N] [-j J] [--applier-args "ARGS"] [--writes all|limited]
#
#   N                 seeds to run (default 100)
#   -j J              replays at once (default 4; each runs its own status-applier)
#   --applier-args    extra arguments of the replays' status-applier, for example
#                     "--apply-lone-intents-at-once=false"
#   --writes          the generator: all (default), or limited (what the pure model covers,
#                     the generator the named regression seeds were found with)
#
# Uses the test environment of CAPT_TESTENV_DIR (hack/testenv.sh; default .testenv) when it
# runs, else starts it before any seed and stops it at the end. Logs: .soak/<run>/<seed>.log.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

count=100 jobs=4 applier_args="" writes=all
while (($#)); do
	case $1 in
	-j) jobs=$2; shift 2 ;;
	--applier-args) applier_args=$2; shift 2 ;;
	--writes) writes=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*)
		[[ $1 =~ ^[0-9]+$ ]] || { echo "soak: unexpected argument '$1' (see --help)" >&2; exit 2; }
		count=$1; shift ;;
	esac
done
((count > 0 && jobs > 0)) || { echo "soak: N and J must be positive" >&2; exit 2; }
[[ $writes == all || $writes == limited ]] || { echo "soak: --writes takes all or limited, not '$writes'" >&2; exit 2; }

log() { printf '[soak %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The replays find the environment through hack/testenv.sh themselves: it must run before
# they start, or each would try to start it.
if ! hack/testenv.sh env >/dev/null 2>&1; then
	trap 'hack/testenv.sh stop' EXIT
fi
eval "$(hack/testenv.sh start)"

# The commit the binaries are built from (-dirty: with uncommitted changes), for the record.
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':!.soak' 2>/dev/null || commit="$commit-dirty"
export commit
log "building the status-applier and the replay test (commit $commit)"
hack/cargo-progress.sh soak build --workspace --bins
binary=$(cargo test --quiet -p capt-tests --test replay_seeded --no-run --message-format=json 2>/dev/null |
	python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "replay_seeded":
        print(m["executable"])')
[[ -x $binary ]] || { echo "soak: the replay test binary was not built" >&2; exit 1; }

run="$ROOT/.soak/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run/bin"
# The soak runs the binaries as they are now, whatever is built meanwhile: the replay finds
# status-applier beside its own executable.
cp "$binary" "$run/bin/replay_seeded"
cp "$(dirname "$(dirname "$binary")")/status-applier" "$run/bin/status-applier"
binary="$run/bin/replay_seeded"
log "$count seeds, $jobs at a time, applier args '${applier_args}', writes: $writes; logs in $run"
seeds=()
for ((i = 0; i < count; i++)); do
	seeds+=("$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')")
done
log "seeds: ${seeds[*]}"

# The replay finds the repository as cargo would tell a test (repo_root in tests/src/lib.rs),
# not by the path compiled in, which names whichever clone last built into a shared target.
export CARGO_MANIFEST_DIR="$ROOT/tests"
export REPLAY_APPLIER_ARGS="$applier_args" REPLAY_WRITES="$writes" binary run
one() {
	local seed=$1
	if REPLAY_SEED=$seed "$binary" --exact a_seeded_replay_of_intents_and_foreign_writes_keeps_at_provider \
		>"$run/$seed.log" 2>&1; then
		echo "ok $seed"
	else
		echo "FAILED $seed"
	fi
}
export -f one
started=$(date +%s)
printf '%s\n' "${seeds[@]}" | xargs -P "$jobs" -I{} bash -c 'one {}' | {
	passed=0 failed=0 failures=()
	while read -r verdict seed; do
		if [[ $verdict == ok ]]; then passed=$((passed + 1)); else
			failed=$((failed + 1)); failures+=("$seed")
			log "seed $seed FAILED: $(grep -m1 -A2 'panicked' "$run/$seed.log" | tail -n 2 | cut -c1-300)"
		fi
		done=$((passed + failed))
		((done % 10 == 0 || done == count)) && log "$done of $count done, $failed failed, $(($(date +%s) - started)) s"
	done
	for seed in "${failures[@]}"; do
		echo "rerun: REPLAY_SEED=$seed REPLAY_WRITES=$writes REPLAY_APPLIER_ARGS='$applier_args' cargo test -p capt-tests --test replay_seeded a_seeded_replay (log: $run/$seed.log)"
	done
	echo "soak: $passed passed, $failed failed"
	# The row docs/concurrency.md's table takes as it is: the command, the commit the
	# binaries were built from, the result.
	args=""
	[[ -n $applier_args ]] && args+=" --applier-args '$applier_args'"
	[[ $writes != all ]] && args+=" --writes $writes"
	echo "record: | \`hack/soak.sh $count -j $jobs$args\` | $commit | $passed passed, $failed failed ($(($(date +%s) - started)) s) |"
	((failed == 0))
}
