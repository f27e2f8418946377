#!/usr/bin/env bash
# The real test environment: etcd, kube-apiserver and kube-controller-manager (garbage
# collector and namespace controller only) on free 127.0.0.1 ports, built from the Go module
# proxy by hack/tools/kubernetes, with our CRDs, all Cluster API core CRDs and the Workspace
# CRD; and the real Cluster API core manager (hack/tools/cluster-api) with its admission and
# conversion webhooks, served on 127.0.0.1 with a self-signed certificate (see docs/testenv.md).
#
#   hack/testenv.sh build   build the binaries (cached; the first build takes many minutes)
#   hack/testenv.sh start [--no-core]   build if needed, start everything, install CRDs and
#                           the webhook configurations, print exports
#   hack/testenv.sh stop    stop everything started by `start`; leaves no process behind
#   hack/testenv.sh env     print the exports of a running environment
#   hack/testenv.sh crds    print the paths of the upstream CRD files in the module cache
#   hack/testenv.sh workload-samples   the sample WorkspaceTemplates (JSON) pointed at the
#                           workload cluster's API server (started with core; see start_workload)
#   hack/testenv.sh apiserver-stop|apiserver-start   fault injection: the API server alone
#   hack/testenv.sh apiserver-freeze|apiserver-thaw   fault injection: the API server paused
#                           (SIGSTOP) and resumed: connections stay open, nothing is answered
#   hack/testenv.sh core-stop|core-start   the Cluster API core manager alone; its webhook
#                           configurations stay, so Cluster API writes fail while it is stopped
#
# Environment: CAPT_TESTENV_DIR (state; default .testenv in the repo), CAPT_CORE_MODULE (see
# CAPI_TOOLS below), CAPT_CACHE_DIR
# (built binaries; default ~/.cache/capt-testenv), CAPT_TESTENV_CORE (1: with the Cluster API
# core manager and its webhooks, the default; 0: without both, like `start --no-core`).
# `start` on a running environment reuses it; it fails if CAPT_TESTENV_CORE or --no-core asks
# for the other core setting than the one running (stop it first).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/hack/tools/kubernetes"
# CAPT_CORE_MODULE: another module pinning the Cluster API version to build core from and
# read its CRDs and webhooks from (hack/core-suite.sh; hack/tools/crds then gives the
# Workspace CRD only).
CAPI_TOOLS=${CAPT_CORE_MODULE:-$ROOT/hack/tools/cluster-api}
CRD_MODULE="$ROOT/hack/tools/crds"
STATE=${CAPT_TESTENV_DIR:-$ROOT/.testenv}
CACHE=${CAPT_CACHE_DIR:-$HOME/.cache/capt-testenv}
KUBE_VERSION=v1.34.4
# provider-terraform is not in the checksum database; go.sum in hack/tools/crds pins its hash.
export GONOSUMDB=github.com/upbound/provider-terraform
export GOFLAGS=-mod=mod

# The real provider-terraform (build_provider, provider-start/stop): hack/real-provider.sh.
# shellcheck source=hack/real-provider.sh
source "$ROOT/hack/real-provider.sh"

log() { printf '[testenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

bin_dir() {
	local key
	key=$(cat "$TOOLS/go.mod" "$TOOLS/go.sum" <(go env GOVERSION) | sha256sum | cut -c1-16)
	echo "$CACHE/bin-$key"
}

capi_bin_dir() {
	local key
	key=$(cat "$CAPI_TOOLS/go.mod" "$CAPI_TOOLS/go.sum" <(go env GOVERSION) | sha256sum | cut -c1-16)
	echo "$CACHE/capi-$key"
}

# Builds one command of the module in directory $1 with `go build -v`, printing how many of
# its packages it has compiled every 20 s, so a cold build (many minutes on two cores) visibly
# progresses. (`go build -v` names the packages it compiles, not those it finds cached, so a
# partly cached build ends below the total.)
build_one() {
	local dir=$1 pkg=$2 out=$3 ldflags=$4 name started logf ticker
	name=$(basename "$out")
	logf="$out.build.log"
	started=$(date +%s)
	log "building $name ($pkg)"
	(
		total=$(cd "$dir" && go list -deps "$pkg" 2>/dev/null | wc -l)
		log "  $name: $total packages (with its dependencies)"
		while sleep 20; do
			log "  $name: $(wc -l <"$logf" 2>/dev/null || echo 0) of $total packages compiled, $(($(date +%s) - started)) s"
		done
	) &
	ticker=$!
	if ! (cd "$dir" && go build -v -trimpath -ldflags "$ldflags" -o "$out" "$pkg" 2>"$logf"); then
		kill "$ticker" 2>/dev/null || true
		tail -n 30 "$logf" >&2
		die "building $name failed (log: $logf)"
	fi
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	log "built $name in $(($(date +%s) - started)) s"
}

build_kubernetes() {
	local bin tmp vflags
	bin=$(bin_dir)
	if [[ -x "$bin/kube-apiserver" && -x "$bin/kubectl" && -x "$bin/etcd" && -x "$bin/kube-controller-manager" ]]; then
		return
	fi
	log "cold build into $bin (Kubernetes $KUBE_VERSION, etcd 3.6; progress every 20 s)"
	tmp="$bin.partial"
	mkdir -p "$tmp"
	local started
	started=$(date +%s)
	vflags=""
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		vflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=34 -X $p.gitTreeState=clean"
	done
	[[ -x "$tmp/etcd" ]] || build_one "$TOOLS" go.etcd.io/etcd/server/v3 "$tmp/etcd" "-s -w"
	[[ -x "$tmp/kube-apiserver" ]] || build_one "$TOOLS" k8s.io/kubernetes/cmd/kube-apiserver "$tmp/kube-apiserver" "-s -w $vflags"
	[[ -x "$tmp/kube-controller-manager" ]] || build_one "$TOOLS" k8s.io/kubernetes/cmd/kube-controller-manager "$tmp/kube-controller-manager" "-s -w $vflags"
	[[ -x "$tmp/kubectl" ]] || build_one "$TOOLS" k8s.io/kubernetes/cmd/kubectl "$tmp/kubectl" "-s -w $vflags"
	rm -f "$tmp"/*.build.log
	mv "$tmp" "$bin"
	log "environment built in $(($(date +%s) - started)) s"
}

# The Cluster API core manager, named `manager` as in the upstream image (/manager): client-go
# takes the default field manager and the user agent from the binary's name, so managedFields
# and the audit log show `manager` as on a production cluster. clusterctl beside it.
build_capi() {
	local bin tmp vflags version info commit
	bin=$(capi_bin_dir)
	[[ -x "$bin/manager" && -x "$bin/clusterctl" ]] && return
	version=$(capi_version "$CAPI_TOOLS")
	log "cold build into $bin (Cluster API $version core manager and clusterctl; progress every 20 s)"
	tmp="$bin.partial"
	mkdir -p "$tmp"
	local started
	started=$(date +%s)
	# The release's commit, from the module cache's record of the tag (as the upstream build
	# stamps it; it ends up in the user agent).
	info=$(cd "$CAPI_TOOLS" && go mod download -json sigs.k8s.io/cluster-api | sed -n 's/.*"Info": "\(.*\)".*/\1/p')
	commit=$(sed -n 's/.*"Hash": *"\([0-9a-f]*\)".*/\1/p' "$info" 2>/dev/null || true)
	local major=${version#v} minor
	minor=${major#*.}
	minor=${minor%%.*}
	major=${major%%.*}
	vflags="-X sigs.k8s.io/cluster-api/version.gitVersion=$version -X sigs.k8s.io/cluster-api/version.gitMajor=$major"
	vflags+=" -X sigs.k8s.io/cluster-api/version.gitMinor=$minor -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
	[[ -n "$commit" ]] && vflags+=" -X sigs.k8s.io/cluster-api/version.gitCommit=$commit"
	local main=sigs.k8s.io/cluster-api
	[[ "$(capi_core_dir)" == */core ]] && main+=/core
	[[ -x "$tmp/manager" ]] || build_one "$CAPI_TOOLS" "$main" "$tmp/manager" "-s -w $vflags"
	[[ -x "$tmp/clusterctl" ]] || build_one "$CAPI_TOOLS" sigs.k8s.io/cluster-api/cmd/clusterctl "$tmp/clusterctl" "-s -w $vflags"
	rm -f "$tmp"/*.build.log
	mv "$tmp" "$bin"
	log "Cluster API built in $(($(date +%s) - started)) s"
}

# Builds what is missing and prints the directory of the Kubernetes binaries.
cmd_build() {
	command -v go >/dev/null || die "go is not installed (see .ci/run)"
	build_kubernetes
	build_capi
	build_provider
	bin_dir
}

# The version of sigs.k8s.io/cluster-api that the module in directory $1 pins.
capi_version() {
	grep -oE 'sigs\.k8s\.io/cluster-api v[^ ]+' "$1/go.mod" | head -n 1 | cut -d' ' -f2
}

# The Cluster API module's source in the Go module cache (downloaded if missing).
capi_module_dir() {
	(cd "$CAPI_TOOLS" && go mod download -json sigs.k8s.io/cluster-api | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
}

# The core provider in the module: its main package and config/ are under core/ since v1.14
# (at the module's root before, as in v1.13).
capi_core_dir() {
	local dir
	dir=$(capi_module_dir)
	if [[ -f "$dir/core/main.go" ]]; then echo "$dir/core"; else echo "$dir"; fi
}

# The core provider's directory in the Cluster API module's source in the Go module cache:
# the one the manager is built from, so its CRDs (config/crd/bases) and webhook
# configurations (config/webhook) match the manager.
capi_dir() {
	local dir
	[[ -n "${CAPT_CORE_MODULE:-}" || "$(capi_version "$CAPI_TOOLS")" == "$(capi_version "$CRD_MODULE")" ]] ||
		die "hack/tools/cluster-api and hack/tools/crds pin different Cluster API versions"
	dir=$(capi_core_dir)
	[[ -f "$dir/config/crd/bases/cluster.x-k8s.io_clusters.yaml" ]] || die "Cluster CRD not found under $dir"
	[[ -f "$dir/config/webhook/manifests.yaml" ]] || die "webhook configurations not found under $dir"
	echo "$dir"
}

# All Cluster API core CRDs (config/crd/bases of the core provider the manager is built from) and
# provider-terraform's Workspace CRD.
cmd_crds() {
	local capi tf
	capi=$(capi_dir)
	tf=$(cd "$CRD_MODULE" && go mod download -json github.com/upbound/provider-terraform |
		sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -f "$tf/package/crds/tf.upbound.io_workspaces.yaml" ]] || die "Workspace CRD not found under $tf"
	ls "$capi"/config/crd/bases/*.yaml
	echo "$tf/package/crds/tf.upbound.io_workspaces.yaml"
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

is_running() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# The Kubernetes binaries stay first in PATH (tests read that directory from it).
print_env() {
	local path core=0
	path=$(cat "$STATE/bin-dir")
	[[ -f "$STATE/capi-dir" ]] && path+=":$(cat "$STATE/capi-dir")"
	[[ -f "$STATE/core" ]] && core=$(cat "$STATE/core")
	echo "export KUBECONFIG=$STATE/kubeconfig"
	echo "export PATH=$path:\$PATH"
	echo "export CAPT_TESTENV_CORE=$core"
	print_provider_env
}

wait_for() {
	local what=$1 tries=$2
	shift 2
	for ((i = 0; i < tries; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	die "$what did not become ready; see logs in $STATE"
}

# The core setting asked for: CAPT_TESTENV_CORE or `start --no-core`; empty when not asked.
CORE_REQUESTED=""
# `start --real-provider`: also start the real provider-terraform (hack/real-provider.sh).
REAL_PROVIDER=""

cmd_start() {
	local arg
	case "${CAPT_TESTENV_CORE:-}" in
	"") ;;
	0 | 1) CORE_REQUESTED=$CAPT_TESTENV_CORE ;;
	*) die "CAPT_TESTENV_CORE must be 1 or 0, not '$CAPT_TESTENV_CORE'" ;;
	esac
	for arg in "$@"; do
		case "$arg" in
		--no-core) CORE_REQUESTED=0 ;;
		--core) CORE_REQUESTED=1 ;;
		--real-provider) REAL_PROVIDER=1 ;;
		*) die "start: unknown argument $arg (--no-core, --core, --real-provider)" ;;
		esac
	done
	if is_running kube-apiserver; then
		local running=0
		[[ -f "$STATE/core" ]] && running=$(cat "$STATE/core")
		if [[ -n "$CORE_REQUESTED" && "$CORE_REQUESTED" != "$running" ]]; then
			die "the environment in $STATE runs with CAPT_TESTENV_CORE=$running, not $CORE_REQUESTED as asked; stop it first (hack/testenv.sh stop)"
		fi
		log "already running (CAPT_TESTENV_CORE=$running)"
		[[ "$running" == 1 ]] && ! is_running cluster-api-manager && log "warning: the Cluster API core manager is stopped (hack/testenv.sh core-start)"
		[[ -n "$REAL_PROVIDER" ]] && cmd_provider_start
		print_env
		return
	fi
	local core=${CORE_REQUESTED:-1}
	cmd_stop >/dev/null 2>&1 || true
	local bin
	bin=$(cmd_build)
	rm -rf "$STATE"
	mkdir -p "$STATE/certs"
	echo "$bin" >"$STATE/bin-dir"
	capi_bin_dir >"$STATE/capi-dir"
	echo "$core" >"$STATE/core"
	local etcd_port peer_port api_port started
	etcd_port=$(free_port)
	peer_port=$(free_port)
	api_port=$(free_port)
	started=$(date +%s.%N)

	"$bin/etcd" --name testenv --data-dir "$STATE/etcd" --unsafe-no-fsync \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
		--initial-cluster "testenv=http://127.0.0.1:$peer_port" --log-level warn \
		>"$STATE/etcd.log" 2>&1 &
	echo $! >"$STATE/etcd.pid"
	wait_for etcd 150 curl -sf "http://127.0.0.1:$etcd_port/health"

	# A service-account key pair and an admin token (system:masters); nothing leaves 127.0.0.1.
	openssl genrsa -out "$STATE/certs/sa.key" 2048 2>/dev/null
	openssl rsa -in "$STATE/certs/sa.key" -pubout -out "$STATE/certs/sa.pub" 2>/dev/null
	local token
	token=$(openssl rand -hex 24)
	echo "$token,admin,admin,system:masters" >"$STATE/certs/tokens.csv"
	# An audit log of every write and every read (not Events, not Leases): hack/bench.sh counts
	# API writes per field manager, and the LIST and GET requests of a restart, from it; the
	# tests count writes (tests/src/audit_log.rs keeps the write verbs only). Metadata level:
	# no request or response bodies (Secrets stay out); never rotated (the benchmark reads it
	# by offset). A watch is recorded when its response starts and when it ends.
	cat >"$STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources: [{group: "", resources: [events]}, {group: coordination.k8s.io, resources: [leases]}]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: Metadata
  verbs: [get, list, watch]
- level: None
EOF
	local apiserver=("$bin/kube-apiserver" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port"
		--etcd-servers "http://127.0.0.1:$etcd_port" --cert-dir "$STATE/certs"
		--token-auth-file "$STATE/certs/tokens.csv" --authorization-mode RBAC
		--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$STATE/certs/sa.pub"
		--service-account-signing-key-file "$STATE/certs/sa.key" --service-cluster-ip-range 10.0.0.0/24
		--disable-admission-plugins ServiceAccount --enable-priority-and-fairness=false
		--audit-policy-file "$STATE/audit-policy.yaml" --audit-log-path "$STATE/audit.log" --audit-log-format json --audit-log-maxsize 1000000)
	# Kept so that fault tests can stop and restart the API server alone (apiserver-stop/start).
	printf '%q ' "${apiserver[@]}" >"$STATE/kube-apiserver.cmd"
	"${apiserver[@]}" >"$STATE/kube-apiserver.log" 2>&1 &
	echo $! >"$STATE/kube-apiserver.pid"

	cat >"$STATE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: testenv
  context: {cluster: testenv, user: admin, namespace: default}
current-context: testenv
EOF
	export KUBECONFIG="$STATE/kubeconfig" PATH="$bin:$PATH"
	wait_for kube-apiserver 600 kubectl get --raw /readyz
	log "kube-apiserver ready on https://127.0.0.1:$api_port in $(printf '%.1f' "$(echo "$(date +%s.%N) - $started" | bc)") s"

	"$bin/kube-controller-manager" --kubeconfig "$STATE/kubeconfig" --controllers garbagecollector,namespace \
		--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials=false \
		>"$STATE/kube-controller-manager.log" 2>&1 &
	echo $! >"$STATE/kube-controller-manager.pid"

	if [[ "$core" == 1 ]]; then
		# The core CRDs name core's conversion webhook, so its port and CA come first.
		webhook_certs
		free_port >"$STATE/webhook/port"
	fi
	install_crds "$core"
	if [[ "$core" == 1 ]]; then
		start_workload "$bin" "$etcd_port"
		start_core
		wait_workload
	else
		log "without the Cluster API core manager and its webhooks (CAPT_TESTENV_CORE=0)"
	fi
	[[ -n "$REAL_PROVIDER" ]] && cmd_provider_start
	print_env
}

# The workload cluster's API server: a second kube-apiserver that plays the EKS control plane
# of the sample Cluster, so core's cluster cache and RemoteConnectionProbe really connect
# with the `<cluster>-kubeconfig` Secret. It shares etcd under its own prefix (no second etcd
# to run) and has its own CA, serving certificate and admin token; none of them is logged.
# $STATE/workload/outputs.json holds what the sample EKS module outputs for it (endpoint, CA,
# token): hack/demo.sh and the tests put them into the sample template (docs/testenv.md).
start_workload() {
	local bin=$1 etcd_port=$2 dir=$STATE/workload port token
	mkdir -p "$dir"
	port=$(free_port)
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=capt-testenv-workload-ca \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
	openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 3650 \
		-extfile <(printf '%s\n' subjectAltName=IP:127.0.0.1 basicConstraints=CA:FALSE \
			keyUsage=critical,digitalSignature,keyEncipherment extendedKeyUsage=serverAuth) \
		-out "$dir/tls.crt" 2>/dev/null
	rm -f "$dir/tls.csr"
	token=$(openssl rand -hex 24)
	echo "$token,workload-admin,workload-admin,system:masters" >"$dir/tokens.csv"
	local apiserver=("$bin/kube-apiserver" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port"
		--etcd-servers "http://127.0.0.1:$etcd_port" --etcd-prefix /workload
		--tls-cert-file "$dir/tls.crt" --tls-private-key-file "$dir/tls.key" --cert-dir "$dir"
		--token-auth-file "$dir/tokens.csv" --authorization-mode RBAC
		--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$STATE/certs/sa.pub"
		--service-account-signing-key-file "$STATE/certs/sa.key" --service-cluster-ip-range 10.0.1.0/24
		--disable-admission-plugins ServiceAccount --enable-priority-and-fairness=false)
	"${apiserver[@]}" >"$STATE/workload-apiserver.log" 2>&1 &
	echo $! >"$STATE/workload-apiserver.pid"
	echo "https://127.0.0.1:$port" >"$dir/endpoint"
	ENDPOINT="https://127.0.0.1:$port" CA=$(base64 -w0 "$dir/ca.crt") TOKEN=$token python3 -c '
import json, os
print(json.dumps({"cluster_endpoint": os.environ["ENDPOINT"],
                  "cluster_certificate_authority_data": os.environ["CA"],
                  "cluster_token": os.environ["TOKEN"]}))' >"$dir/outputs.json"
	chmod 600 "$dir/outputs.json" "$dir/tokens.csv" "$dir"/*.key
}

# Ready: the workload API server answers /readyz to its admin token, verified with its CA.
wait_workload() {
	local dir=$STATE/workload
	wait_for "the workload cluster's kube-apiserver" 600 curl -sf --cacert "$dir/ca.crt" \
		-H @<(printf 'Authorization: Bearer %s\n' "$(cut -d, -f1 "$dir/tokens.csv")") "$(cat "$dir/endpoint")/readyz"
	log "workload cluster's kube-apiserver ready on $(cat "$dir/endpoint") (etcd prefix /workload; outputs for the sample in $dir/outputs.json)"
}

# manifests/samples/templates.yaml as a JSON List, its EKS template pointed at the workload
# API server: the module's variables `endpoint`, `certificate_authority_data` and `token`,
# and the fake provider's outputs to match (what that module then outputs). The token, a
# credential of this local environment alone, is in the printed template: pipe it to
# kubectl, do not log it.
cmd_workload_samples() {
	[[ -f "$STATE/workload/outputs.json" ]] || die "no workload cluster (hack/testenv.sh start, with core)"
	kubectl create --dry-run=client -o json -f "$ROOT/manifests/samples/templates.yaml" |
		OUTPUTS="$STATE/workload/outputs.json" python3 -c '
import json, os, sys
text, at, items = sys.stdin.read(), 0, []
while text[at:].strip():  # kubectl prints one JSON object after the other
    at += len(text[at:]) - len(text[at:].lstrip())
    item, at = json.JSONDecoder().raw_decode(text, at)
    items += item["items"] if item.get("kind") == "List" else [item]
workload = json.load(open(os.environ["OUTPUTS"]))
for item in items:
    if item["metadata"]["name"] != "eks":
        continue
    template = item["spec"]["template"]
    template["spec"]["forProvider"]["vars"] += [
        {"key": "endpoint", "value": workload["cluster_endpoint"]},
        {"key": "certificate_authority_data", "value": workload["cluster_certificate_authority_data"]},
        {"key": "token", "value": workload["cluster_token"]}]
    notes = template["metadata"]["annotations"]
    outputs = json.loads(notes["fake.tf.upbound.io/outputs"])
    outputs["cluster_endpoint"] = workload["cluster_endpoint"]
    outputs["cluster_certificate_authority_data"] = workload["cluster_certificate_authority_data"]
    notes["fake.tf.upbound.io/outputs"] = json.dumps(outputs)
    notes["fake.tf.upbound.io/sensitive-outputs"] = json.dumps({"cluster_token": workload["cluster_token"]})
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
'
}

# Our CRDs, core's and the Workspace. Core's CRDs serve v1beta1 and v1beta2 and store v1beta2
# (since v1.11). With core ($1 = 1) they convert through core's conversion webhook (/convert,
# as a release's kustomize patches configure it), called at https://127.0.0.1:<webhook port>
# with our CA. Without core there is no conversion webhook, and upstream's strategy (None:
# only apiVersion changes) would prune a v1beta1 Cluster to the v1beta2 schema (its
# references lose apiVersion), so they keep v1beta2 alone, stored: the Cluster API that the
# tests without core write and our controller reads (core v1.16 plans to serve no other).
install_crds() {
	local core=$1 files=("$ROOT"/manifests/crds/*.yaml) upstream args=() f
	mapfile -t upstream < <(cmd_crds)
	((${#upstream[@]} > 1)) || die "no upstream CRDs found"
	local core_crds=("${upstream[@]:0:${#upstream[@]}-1}") workspace=${upstream[-1]} ca=""
	for f in "${files[@]}"; do args+=(-f "$f"); done
	[[ "$core" == 1 ]] && ca=$(base64 -w0 "$STATE/webhook/ca.crt")
	for f in "${core_crds[@]}"; do printf -- '-f\0%s\0' "$f"; done | xargs -0 kubectl create --dry-run=client -o json |
		CORE=$core CA_BUNDLE=$ca PORT=$(cat "$STATE/webhook/port" 2>/dev/null || true) python3 -c '
import json, os, sys
text, at, items = sys.stdin.read(), 0, []
while text[at:].strip():  # kubectl prints one JSON object after the other
    at += len(text[at:]) - len(text[at:].lstrip())
    item, at = json.JSONDecoder().raw_decode(text, at)
    items += item["items"] if item.get("kind") == "List" else [item]
for crd in items:
    versions = crd["spec"]["versions"]
    if os.environ["CORE"] == "1":
        crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:%s/convert" % os.environ["PORT"],
                             "caBundle": os.environ["CA_BUNDLE"]}}}
    elif len(versions) > 1 and any(v["name"] == "v1beta2" for v in versions):
        crd["spec"]["versions"] = [dict(v, storage=True) for v in versions if v["name"] == "v1beta2"]
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
' >"$STATE/core-crds.json"
	args+=(-f "$STATE/core-crds.json" -f "$workspace")
	kubectl apply --server-side --field-manager testenv "${args[@]}" >/dev/null
	kubectl wait --for condition=Established --timeout 60s crd --all >/dev/null
	log "installed $((${#files[@]} + ${#upstream[@]})) CRDs: ${#files[@]} ours from manifests/crds, ${#core_crds[@]} Cluster API core and the Workspace from the Go module cache"
	log "  (${files[*]} ${upstream[*]})"
	if [[ "$core" == 1 ]]; then
		log "  core's with its conversion webhook: $STATE/core-crds.json"
	else
		log "  core's serving and storing v1beta2 alone (no conversion webhook without core): $STATE/core-crds.json"
	fi
}

# A CA and a serving certificate for 127.0.0.1, where the API server calls the webhooks.
webhook_certs() {
	local dir=$STATE/webhook
	mkdir -p "$dir"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=capt-testenv-webhook-ca \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
	openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 3650 \
		-extfile <(printf '%s\n' subjectAltName=IP:127.0.0.1 basicConstraints=CA:FALSE \
			keyUsage=critical,digitalSignature,keyEncipherment extendedKeyUsage=serverAuth) \
		-out "$dir/tls.crt" 2>/dev/null
	rm -f "$dir/tls.csr"
}

# The upstream Mutating and ValidatingWebhookConfiguration (config/webhook/manifests.yaml),
# named as a release installs them (capi-…), each webhook's clientConfig turned from the
# in-cluster Service into https://127.0.0.1:<webhook port><its path> with our CA.
apply_webhook_configurations() {
	local port=$1 capi
	capi=$(capi_dir)
	kubectl create --dry-run=client -o json -f "$capi/config/webhook/manifests.yaml" |
		CA_BUNDLE=$(base64 -w0 "$STATE/webhook/ca.crt") PORT=$port python3 -c '
import json, os, sys
text, at, items = sys.stdin.read(), 0, []
while text[at:].strip():  # kubectl prints one JSON object after the other
    at += len(text[at:]) - len(text[at:].lstrip())
    item, at = json.JSONDecoder().raw_decode(text, at)
    items += item["items"] if item.get("kind") == "List" else [item]
for item in items:
    item["metadata"]["name"] = "capi-" + item["metadata"]["name"]
    for hook in item["webhooks"]:
        path = hook["clientConfig"]["service"].get("path", "/")
        hook["clientConfig"] = {
            "url": "https://127.0.0.1:%s%s" % (os.environ["PORT"], path),
            "caBundle": os.environ["CA_BUNDLE"],
        }
json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
' >"$STATE/webhook/configurations.json"
	kubectl apply --server-side --field-manager testenv -f "$STATE/webhook/configurations.json" >/dev/null
	log "webhook configurations: $(kubectl get mutatingwebhookconfigurations,validatingwebhookconfigurations -o name | tr '\n' ' ')"
}

# The Cluster API core manager: its webhooks on the port the CRDs name, health and diagnostics
# on 127.0.0.1. Returns when its readyz is OK and its webhooks answer the API server.
start_core() {
	local capi webhook_port health_port diag_port started
	capi=$(cat "$STATE/capi-dir")
	webhook_port=$(cat "$STATE/webhook/port")
	health_port=$(free_port)
	diag_port=$(free_port)
	started=$(date +%s.%N)
	local manager=("$capi/manager" --kubeconfig "$STATE/kubeconfig" --leader-elect=false
		--webhook-port "$webhook_port" --webhook-cert-dir "$STATE/webhook"
		--health-addr "127.0.0.1:$health_port" --diagnostics-address "127.0.0.1:$diag_port" --insecure-diagnostics
		# ClusterClass: core's topology controller (alpha, off by default; clusterctl's
		# CLUSTER_TOPOLOGY=true on a real management cluster).
		--feature-gates ClusterTopology=true)
	# Core's client rate limit (its defaults: 20 requests/s, bursts of 30) unless
	# CAPT_TESTENV_CORE_QPS says otherwise: hack/bench.sh raises it, or provisioning 1,000
	# stacks at once waits on core's ~19 writes per stack at 20/s.
	if [[ -n "${CAPT_TESTENV_CORE_QPS:-}" ]]; then
		manager+=(--kube-api-qps "$CAPT_TESTENV_CORE_QPS" --kube-api-burst "$((CAPT_TESTENV_CORE_QPS * 3 / 2))")
	fi
	# Kept for core-start, on the same ports (the webhook configurations name the port).
	printf '%q ' "${manager[@]}" >"$STATE/cluster-api-manager.cmd"
	echo "$health_port" >"$STATE/cluster-api-manager.health-port"
	"${manager[@]}" >"$STATE/cluster-api-manager.log" 2>&1 &
	echo $! >"$STATE/cluster-api-manager.pid"
	apply_webhook_configurations "$webhook_port"
	wait_core
	log "Cluster API core manager ready (webhooks on https://127.0.0.1:$webhook_port) in $(printf '%.1f' "$(echo "$(date +%s.%N) - $started" | bc)") s"
}

# Ready: the manager's readyz, then a server-side dry run of a Cluster create in the stored
# v1beta2, which passes the defaulting and the validating webhook (since v1.11 a Cluster needs
# a reference or a topology). The conversion webhook is served by the same server, its
# handler registered before the server listens, so it answers too.
wait_core() {
	cat >"$STATE/webhook/probe-cluster.yaml" <<EOF
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: testenv-webhook-probe, namespace: default}
spec:
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: CAPTCluster, name: testenv-webhook-probe}
EOF
	local readyz i
	readyz="http://127.0.0.1:$(cat "$STATE/cluster-api-manager.health-port")/readyz"
	for ((i = 0; i < 900; i++)); do
		if ! is_running cluster-api-manager; then
			tail -n 20 "$STATE/cluster-api-manager.log" >&2
			die "the Cluster API core manager exited; see $STATE/cluster-api-manager.log"
		fi
		if curl -sf "$readyz" >/dev/null 2>&1 &&
			kubectl create --dry-run=server -f "$STATE/webhook/probe-cluster.yaml" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	kubectl create --dry-run=server -f "$STATE/webhook/probe-cluster.yaml" >&2 || true
	die "the Cluster API core manager did not become ready; see $STATE/cluster-api-manager.log"
}

cmd_stop() {
	local name pid
	cmd_provider_stop
	for name in cluster-api-manager workload-apiserver kube-controller-manager kube-apiserver etcd; do
		[[ -f "$STATE/$name.pid" ]] || continue
		pid=$(cat "$STATE/$name.pid")
		if kill -0 "$pid" 2>/dev/null; then
			kill "$pid" 2>/dev/null || true
			for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$STATE/$name.pid"
	done
	log "stopped"
}

# Fault injection: the API server alone goes down and comes back on the same port and data.
cmd_apiserver_stop() {
	local pid
	pid=$(cat "$STATE/kube-apiserver.pid")
	kill "$pid"
	for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true # its graceful shutdown can outlast a fault test
	for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	log "kube-apiserver stopped"
}

cmd_apiserver_start() {
	is_running kube-apiserver && die "kube-apiserver is running"
	eval "exec $(cat "$STATE/kube-apiserver.cmd")" >>"$STATE/kube-apiserver.log" 2>&1 &
	echo $! >"$STATE/kube-apiserver.pid"
	PATH="$(cat "$STATE/bin-dir"):$PATH"
	export KUBECONFIG="$STATE/kubeconfig" PATH
	wait_for kube-apiserver 600 kubectl get --raw /readyz
	log "kube-apiserver started again"
}

# The API server paused (SIGSTOP): it accepts nothing new and answers nothing until thawed
# (SIGCONT), as one stalled by its host, a long garbage collection or a draining load balancer.
cmd_apiserver_freeze() {
	is_running kube-apiserver || die "kube-apiserver is not running"
	kill -STOP "$(cat "$STATE/kube-apiserver.pid")"
	log "kube-apiserver frozen"
}

cmd_apiserver_thaw() {
	kill -CONT "$(cat "$STATE/kube-apiserver.pid")"
	log "kube-apiserver thawed"
}

# The Cluster API core manager alone. Its webhook configurations stay: while it is stopped,
# every write of a Cluster API kind they cover fails (failurePolicy: Fail), as on a cluster
# whose core manager is down.
cmd_core_stop() {
	[[ "$(cat "$STATE/core" 2>/dev/null)" == 1 ]] || die "the environment in $STATE runs without core (CAPT_TESTENV_CORE=0)"
	is_running cluster-api-manager || die "the Cluster API core manager is not running"
	local pid
	pid=$(cat "$STATE/cluster-api-manager.pid")
	kill "$pid"
	for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	rm -f "$STATE/cluster-api-manager.pid"
	log "Cluster API core manager stopped (its webhook configurations stay)"
}

cmd_core_start() {
	[[ "$(cat "$STATE/core" 2>/dev/null)" == 1 ]] || die "the environment in $STATE runs without core (CAPT_TESTENV_CORE=0)"
	is_running kube-apiserver || die "not running (hack/testenv.sh start)"
	is_running cluster-api-manager && die "the Cluster API core manager is running"
	local started
	started=$(date +%s.%N)
	eval "exec $(cat "$STATE/cluster-api-manager.cmd")" >>"$STATE/cluster-api-manager.log" 2>&1 &
	echo $! >"$STATE/cluster-api-manager.pid"
	PATH="$(cat "$STATE/bin-dir"):$PATH"
	export KUBECONFIG="$STATE/kubeconfig" PATH
	wait_core
	log "Cluster API core manager started again, ready in $(printf '%.1f' "$(echo "$(date +%s.%N) - $started" | bc)") s"
}

case "${1:-}" in
build) cmd_build ;;
apiserver-stop) cmd_apiserver_stop ;;
apiserver-start) cmd_apiserver_start ;;
apiserver-freeze) cmd_apiserver_freeze ;;
apiserver-thaw) cmd_apiserver_thaw ;;
core-stop) cmd_core_stop ;;
core-start) cmd_core_start ;;
start) shift; cmd_start "$@" ;;
stop) cmd_stop ;;
env) is_running kube-apiserver || die "not running (hack/testenv.sh start)"; print_env ;;
crds) cmd_crds ;;
provider-start) cmd_provider_start ;;
workload-samples) cmd_workload_samples ;;
provider-stop) cmd_provider_stop ;;
*) echo "usage: $0 build|start [--no-core]|stop|env|crds|apiserver-stop|apiserver-start|apiserver-freeze|apiserver-thaw|core-stop|core-start" >&2; exit 2 ;;
esac
