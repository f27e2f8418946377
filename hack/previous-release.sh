#!/usr/bin/env bash
# Builds the two binaries of the previous release (capt-controller, status-applier) for the
# upgrade test (tests/tests/upgrade.rs), and prints the directory that holds them.
#
#   hack/previous-release.sh            the release CHANGELOG.md names below the unreleased one
#   hack/previous-release.sh COMMIT     another commit
#
# Cached by commit in ~/.cache/capt-previous-release/<commit>/bin (CAPT_PREVIOUS_RELEASE_CACHE
# overrides the directory): a second run prints the directory at once. The sources come from
# `git archive` of the commit: a shallow clone's history is fetched first. The build shares the
# current build's target directory (CARGO_TARGET_DIR, else target/), so the dependencies the
# two trees share are compiled once; cargo copies each tree's binaries to target/debug/ when
# it builds them, so the previous release's copies are removed from there once saved (the
# current tree's next `cargo build --bins` puts its own back, without compiling them again).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf '[previous-release %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The previous release: the commit of the first `## vX.Y.Z (<commit>)` heading of CHANGELOG.md.
commit=${1:-$(sed -n 's/^## v[0-9][0-9.]* (\([0-9a-f]\{7,40\}\))$/\1/p' "$ROOT/CHANGELOG.md" | head -1)}
[[ -n "$commit" ]] || { say "error: CHANGELOG.md names no released commit"; exit 2; }
# A shallow clone (`git clone --depth 1`) lacks the commit: its history is fetched (a few MiB)
# from the clone's remote, once.
if ! full=$(git -C "$ROOT" rev-parse --verify --quiet "$commit^{commit}") &&
	[[ $(git -C "$ROOT" rev-parse --is-shallow-repository) == true ]]; then
	say "commit $commit is not in this shallow clone: fetching its history (git fetch --unshallow)"
	git -C "$ROOT" fetch --quiet --unshallow >&2 ||
		say "git fetch --unshallow failed (no remote, or it is out of reach)"
fi
full=$(git -C "$ROOT" rev-parse --verify --quiet "$commit^{commit}") ||
	{ say "error: commit $commit is not in this clone, nor fetched from its remote (git fetch --unshallow, or fetch $commit from a clone that has it)"; exit 2; }
cache=${CAPT_PREVIOUS_RELEASE_CACHE:-$HOME/.cache/capt-previous-release}/$full
if [[ -x "$cache/bin/capt-controller" && -x "$cache/bin/status-applier" ]]; then
	echo "$cache/bin"
	exit 0
fi

say "building capt-controller and status-applier of $commit (${full:0:12}) into $cache/bin"
rm -rf "$cache/src"
mkdir -p "$cache/src"
git -C "$ROOT" archive "$full" | tar -x -C "$cache/src"
target=${CARGO_TARGET_DIR:-$ROOT/target}
(
	cd "$cache/src"
	CARGO_TARGET_DIR=$target "$ROOT/hack/cargo-progress.sh" previous-release \
		build --locked -p capt-controller -p status-applier --bins >&2
)
mkdir -p "$cache/bin.partial"
for bin in capt-controller status-applier; do
	cp "$target/debug/$bin" "$cache/bin.partial/$bin"
	rm -f "$target/debug/$bin"
done
rm -rf "$cache/bin" "$cache/src"
mv "$cache/bin.partial" "$cache/bin"
say "built; the current tree's binaries come back with its next cargo build --bins"
echo "$cache/bin"
