#!/usr/bin/env bash
# The tests that involve Cluster API core, against another core version than the one
# hack/tools/cluster-api pins (the other supported minor, e.g. v1.13.6): not part of CI.
#
#   hack/core-suite.sh v1.13.6 [cargo test arguments...]
#
# It writes a module like hack/tools/cluster-api pinning that version into
# .core-suite/<version>/module, resolves it through the Go module proxy, and runs the test
# binaries below in their own state directory (.core-suite/<version>/testenv, and the -nocore
# and -move-* directories beside it), with core built from that module (hack/testenv.sh
# CAPT_CORE_MODULE; cached in ~/.cache/capt-testenv by its go.mod and go.sum like the default
# build). The environments are stopped at the end, pass or fail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

version=${1:?usage: hack/core-suite.sh <Cluster API version, e.g. v1.13.6> [cargo test arguments...]}
shift
[[ "$version" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "not a Cluster API release: $version" >&2; exit 2; }
# The binaries whose subject involves core (docs/testenv.md).
TESTS=(core replicas clusterctl clusterctl_move fault_leader fault_endpoint audit e2e hostile_tenant kubeconfig available clusterclass)

dir=$ROOT/.core-suite/$version
mkdir -p "$dir/module"
(
	cd "$dir/module"
	export GOFLAGS=-mod=mod
	src=$(go mod download -json "sigs.k8s.io/cluster-api@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -n "$src" ]] || { echo "sigs.k8s.io/cluster-api $version: not served by the Go module proxy" >&2; exit 1; }
	# v1.14 moved the manager's main package to core/ and its API types into the module
	# sigs.k8s.io/cluster-api/api, which its go.mod replaces locally (a replace that does not
	# apply here): that module is required at the same version. v1.13 has neither.
	main=sigs.k8s.io/cluster-api api=""
	if [[ -f "$src/core/main.go" ]]; then
		main+=/core
		api="sigs.k8s.io/cluster-api/api $version"
	fi
	printf '%s\n' "module github.com/capt/status-management/hack/core-suite/$version" "" "go 1.24.0" "" \
		"require (" "	sigs.k8s.io/cluster-api $version" "	$api" ")" >go.mod
	printf '%s\n' "//go:build tools" "" "package tools" "" "import (" \
		"	_ \"sigs.k8s.io/cluster-api/cmd/clusterctl\"" "	_ \"$main\"" ")" >tools.go
	rm -f go.sum
	go mod tidy
)
grep -q "sigs.k8s.io/cluster-api $version" "$dir/module/go.mod" || {
	echo "the module in $dir/module does not pin sigs.k8s.io/cluster-api $version" >&2
	exit 1
}

export CAPT_CORE_MODULE=$dir/module CAPT_TESTENV_DIR=$dir/testenv
trap 'for d in "$CAPT_TESTENV_DIR" "$CAPT_TESTENV_DIR"-nocore "$CAPT_TESTENV_DIR"-move-source "$CAPT_TESTENV_DIR"-move-target; do
	CAPT_TESTENV_DIR=$d hack/testenv.sh stop 2>/dev/null || true; done' EXIT
# Not `eval "$(…)"` alone: that would hide a failed start (eval of nothing succeeds).
exports=$(hack/testenv.sh start)
eval "$exports"
echo "== beside Cluster API core $version (clusterctl $(CLUSTERCTL_DISABLE_VERSIONCHECK=true clusterctl version -o short))"
args=()
for t in "${TESTS[@]}"; do args+=(--test "$t"); done
host=$(rustc -vV | sed -n 's/^host: //p')
export "CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER=$ROOT/hack/test-runner.sh"
cargo test -p capt-tests "${args[@]}" "$@"
echo "== the core suite passed beside Cluster API core $version"
