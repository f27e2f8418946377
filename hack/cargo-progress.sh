#!/usr/bin/env bash
# Runs `cargo COMMAND ARGS...` (a build: `build`, or `test --no-run`) and says how far along it
# is every 20 s (crates compiled of the crates the workspace resolves, and the time), so a
# cold build (docs/testing.md, "What the first run builds") is never silent. A warm build prints only its
# result. Exits with cargo's status and shows cargo's last lines when it fails.
#
#   hack/cargo-progress.sh LABEL COMMAND [args...]      e.g. hack/cargo-progress.sh demo build --bins
set -euo pipefail
label=$1
shift
say() { printf '[%s %s] %s\n' "$label" "$(date +%H:%M:%S)" "$*"; }
logf=$(mktemp)
trap 'rm -f "$logf"' EXIT
total=$(cargo metadata --format-version 1 --locked 2>/dev/null |
	python3 -c 'import json,sys; print(len(json.load(sys.stdin)["resolve"]["nodes"]))' 2>/dev/null || echo '?')
started=$(date +%s)
(
	while sleep 20; do
		say "cargo $1: $(grep -c '^ *Compiling ' "$logf" || true) of about $total crates compiled, $(($(date +%s) - started)) s"
	done
) &
ticker=$!
status=0
cargo "$@" 2>"$logf" || status=$?
kill "$ticker" 2>/dev/null || true
wait "$ticker" 2>/dev/null || true
if ((status != 0)); then
	tail -n 40 "$logf" >&2
	say "cargo $1 failed"
	exit "$status"
fi
compiled=$(grep -c '^ *Compiling ' "$logf" || true)
say "cargo $1: done in $(($(date +%s) - started)) s ($compiled crates compiled, the rest cached)"
