#!/usr/bin/env bash
# The real test environment: etcd, kube-apiserver and kube-controller-manager (garbage
# collector and namespace controller only) on free 127.0.0.1 ports, built from the Go module
# proxy by hack/tools/kubernetes, with our CRDs and the upstream Cluster and Workspace CRDs.
#
#   hack/testenv.sh build   build the binaries (cached; the first build takes many minutes)
#   hack/testenv.sh start   build if needed, start everything, install CRDs, print exports
#   hack/testenv.sh stop    stop everything started by `start`; leaves no process behind
#   hack/testenv.sh env     print the exports of a running environment
#   hack/testenv.sh crds    print the paths of the upstream CRD files in the module cache
#   hack/testenv.sh apiserver-stop|apiserver-start   fault injection: the API server alone
#
# Environment: CAPT_TESTENV_DIR (state; default .testenv in the repo), CAPT_CACHE_DIR
# (built binaries; default ~/.cache/capt-testenv).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/hack/tools/kubernetes"
CRD_MODULE="$ROOT/hack/tools/crds"
STATE=${CAPT_TESTENV_DIR:-$ROOT/.testenv}
CACHE=${CAPT_CACHE_DIR:-$HOME/.cache/capt-testenv}
KUBE_VERSION=v1.34.4
# provider-terraform is not in the checksum database; go.sum in hack/tools/crds pins its hash.
export GONOSUMDB=github.com/upbound/provider-terraform
export GOFLAGS=-mod=mod

log() { printf '[testenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

bin_dir() {
	local key
	key=$(cat "$TOOLS/go.mod" "$TOOLS/go.sum" <(go env GOVERSION) | sha256sum | cut -c1-16)
	echo "$CACHE/bin-$key"
}

# Builds one command with `go build -v`, printing how many packages it has compiled every
# 30 s, so a cold build (many minutes on two cores) visibly progresses.
build_one() {
	local pkg=$1 out=$2 ldflags=$3 name started logf ticker
	name=$(basename "$out")
	logf="$out.build.log"
	started=$(date +%s)
	log "building $name ($pkg)"
	(
		while sleep 30; do
			log "  $name: $(wc -l <"$logf" 2>/dev/null || echo 0) packages compiled, $(($(date +%s) - started)) s"
		done
	) &
	ticker=$!
	if ! (cd "$TOOLS" && go build -v -trimpath -ldflags "$ldflags" -o "$out" "$pkg" 2>"$logf"); then
		kill "$ticker" 2>/dev/null || true
		tail -n 30 "$logf" >&2
		die "building $name failed (log: $logf)"
	fi
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	log "built $name in $(($(date +%s) - started)) s"
}

cmd_build() {
	command -v go >/dev/null || die "go is not installed (see .ci/run)"
	local bin tmp vflags
	bin=$(bin_dir)
	if [[ -x "$bin/kube-apiserver" && -x "$bin/kubectl" && -x "$bin/etcd" && -x "$bin/kube-controller-manager" ]]; then
		echo "$bin"
		return
	fi
	log "cold build into $bin (Kubernetes $KUBE_VERSION, etcd 3.6; progress every 30 s)"
	tmp="$bin.partial"
	mkdir -p "$tmp"
	local started=$(date +%s)
	vflags=""
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		vflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=34 -X $p.gitTreeState=clean"
	done
	[[ -x "$tmp/etcd" ]] || build_one go.etcd.io/etcd/server/v3 "$tmp/etcd" "-s -w"
	[[ -x "$tmp/kube-apiserver" ]] || build_one k8s.io/kubernetes/cmd/kube-apiserver "$tmp/kube-apiserver" "-s -w $vflags"
	[[ -x "$tmp/kube-controller-manager" ]] || build_one k8s.io/kubernetes/cmd/kube-controller-manager "$tmp/kube-controller-manager" "-s -w $vflags"
	[[ -x "$tmp/kubectl" ]] || build_one k8s.io/kubernetes/cmd/kubectl "$tmp/kubectl" "-s -w $vflags"
	rm -f "$tmp"/*.build.log
	mv "$tmp" "$bin"
	log "environment built in $(($(date +%s) - started)) s"
	echo "$bin"
}

cmd_crds() {
	local dirs
	dirs=$(cd "$CRD_MODULE" && go mod download -json sigs.k8s.io/cluster-api github.com/upbound/provider-terraform |
		sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	local capi tf
	capi=$(grep cluster-api <<<"$dirs")
	tf=$(grep provider-terraform <<<"$dirs")
	[[ -f "$capi/config/crd/bases/cluster.x-k8s.io_clusters.yaml" ]] || die "Cluster CRD not found under $capi"
	[[ -f "$tf/package/crds/tf.upbound.io_workspaces.yaml" ]] || die "Workspace CRD not found under $tf"
	echo "$capi/config/crd/bases/cluster.x-k8s.io_clusters.yaml"
	echo "$tf/package/crds/tf.upbound.io_workspaces.yaml"
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

is_running() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

print_env() {
	echo "export KUBECONFIG=$STATE/kubeconfig"
	echo "export PATH=$(cat "$STATE/bin-dir"):\$PATH"
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

cmd_start() {
	if is_running kube-apiserver; then
		log "already running"
		print_env
		return
	fi
	cmd_stop >/dev/null 2>&1 || true
	local bin
	bin=$(cmd_build)
	rm -rf "$STATE"
	mkdir -p "$STATE/certs"
	echo "$bin" >"$STATE/bin-dir"
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
	# An audit log of every write (not Events, not Leases): hack/bench.sh counts API writes per
	# field manager from it. Metadata level: no request or response bodies (Secrets stay out);
	# never rotated (the benchmark reads it by offset).
	cat >"$STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources: [{group: "", resources: [events]}, {group: coordination.k8s.io, resources: [leases]}]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
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

	install_crds
	print_env
}

install_crds() {
	local files=("$ROOT"/manifests/crds/*.yaml) upstream args=()
	mapfile -t upstream < <(cmd_crds)
	for f in "${files[@]}" "${upstream[@]}"; do args+=(-f "$f"); done
	kubectl apply --server-side --field-manager testenv "${args[@]}" >/dev/null
	kubectl wait --for condition=Established --timeout 60s crd --all >/dev/null
	log "installed $((${#args[@]} / 2)) CRDs: ours from manifests/crds, Cluster and Workspace from the Go module cache"
	log "  (${args[*]})"
}

cmd_stop() {
	local name pid
	for name in kube-controller-manager kube-apiserver etcd; do
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
	export KUBECONFIG="$STATE/kubeconfig" PATH="$(cat "$STATE/bin-dir"):$PATH"
	wait_for kube-apiserver 600 kubectl get --raw /readyz
	log "kube-apiserver started again"
}

case "${1:-}" in
build) cmd_build ;;
apiserver-stop) cmd_apiserver_stop ;;
apiserver-start) cmd_apiserver_start ;;
start) cmd_start ;;
stop) cmd_stop ;;
env) is_running kube-apiserver || die "not running (hack/testenv.sh start)"; print_env ;;
crds) cmd_crds ;;
*) echo "usage: $0 build|start|stop|env|crds|apiserver-stop|apiserver-start" >&2; exit 2 ;;
esac
