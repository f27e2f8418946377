#!/usr/bin/env bash
# The main job on the embedded default: a local API server with the real Cluster API core
# manager beside it (hack/testenv.sh), the whole system running on it (status-applier,
# capt-controller, and Crossplane's provider-terraform running OpenTofu, out of cluster), and
# the sample Cluster of manifests/samples/ going to Provisioned with its Ready condition True
# and Available (core connects to the environment's workload API server, which plays EKS).
# The sample modules need no cloud and no registry (terraform_data and outputs).
#
#   hack/demo.sh                  run until the Cluster is Provisioned, show it, stop everything
#   hack/demo.sh --keep           leave it all running and print how to point kubectl at it
#   hack/demo.sh --fake-provider  the tests' fake provider in place of provider-terraform
#                                 (nothing to build in Go beyond the API server; faster)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
keep=false
fake=false
for arg in "$@"; do
	case "$arg" in
	--keep) keep=true ;;
	--fake-provider) fake=true ;;
	*) echo "usage: $0 [--keep] [--fake-provider]" >&2; exit 2 ;;
	esac
done

RUN=${CAPT_DEMO_DIR:-$ROOT/.testenv/demo}
pids=()
say() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	hack/testenv.sh stop >/dev/null 2>&1 || true
}
if ! $keep; then trap cleanup EXIT; else trap 'cleanup; exit 130' INT TERM; fi

demo_started=$(date +%s)
say "building the binaries (cargo build; cold, how long: docs/testing.md, \"What the first run builds\"; cached after the first run)"
hack/cargo-progress.sh demo build --workspace --bins
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug
POLICY=$ROOT/manifests/deploy/status-applier-policy.yaml # CAPT's policy, as deployed
if $fake; then
	say "starting the local API server"
	exports=$(CAPT_TESTENV_CORE=1 hack/testenv.sh start) # with Cluster API core
else
	say "starting the local API server and provider-terraform (the first run builds it and OpenTofu from the Go module proxy; how long: docs/testing.md, \"What the first run builds\")"
	exports=$(CAPT_TESTENV_CORE=1 hack/testenv.sh start --real-provider)
fi
eval "$exports"
mkdir -p "$RUN" && rm -f "$RUN"/*.sock

"$BIN/status-applier" serve --socket "$RUN/applier.sock" --policy "$POLICY" \
	--allow-manager capt-captcluster,capt-captcontrolplane,capt-cluster,capt-workspacetemplateapply \
	--metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0 \
	>"$RUN/status-applier.log" 2>&1 &
pids+=($!)
if $fake; then
	"$BIN/fake-terraform-provider" --delay-ms 1500 >"$RUN/fake-terraform-provider.log" 2>&1 &
	pids+=($!)
	provider="fake-terraform-provider (log in $RUN)"
else
	provider="provider-terraform (log in $(dirname "$KUBECONFIG")/provider-terraform.log)"
fi
for _ in $(seq 100); do [[ -S "$RUN/applier.sock" ]] && break; sleep 0.1; done
# Templates are code: only those of the platform's namespace are used (manifests/samples/),
# which the install creates, labelled as the controller checks at start.
kubectl apply --server-side -f manifests/deploy/templates-namespace.yaml >/dev/null
"$BIN/capt-controller" --applier-socket "$RUN/applier.sock" --allow-template-namespace capt-templates \
	--metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0 \
	>"$RUN/capt-controller.log" 2>&1 &
pids+=($!)
say "status-applier and capt-controller (logs in $RUN), and $provider running"

# Cluster API core (started by hack/testenv.sh) adopts the CAPTCluster and CAPTControlPlane.
# The sample EKS module points at the environment's workload API server (its endpoint, CA and
# a token: hack/testenv.sh workload-samples), so core connects to the "EKS" cluster with the
# <cluster>-kubeconfig Secret and the Cluster becomes Available.
hack/testenv.sh workload-samples | kubectl apply --server-side -f - -f manifests/samples/cluster.yaml

started=$(date +%s)
said=$started
last=""
while true; do
	cc=$(kubectl get captcluster demo -o jsonpath='{.status.conditions[?(@.status=="True")].type}' 2>/dev/null || true)
	cp=$(kubectl get captcontrolplane demo -o jsonpath='{.status.phase}' 2>/dev/null || true)
	phase=$(kubectl get cluster demo -o jsonpath='{.status.phase}' 2>/dev/null || true)
	# Ready is a v1beta1 condition (v1beta2 keeps it under status.deprecated), so read as v1beta1.
	ready=$(kubectl get clusters.v1beta1.cluster.x-k8s.io demo -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
	# Core's v1beta2 conditions: Available, and RemoteConnectionProbe (its cluster cache
	# connected with the kubeconfig Secret).
	available=$(kubectl get clusters.v1beta2.cluster.x-k8s.io demo -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null || true)
	probe=$(kubectl get clusters.v1beta2.cluster.x-k8s.io demo -o jsonpath='{.status.conditions[?(@.type=="RemoteConnectionProbe")].status}' 2>/dev/null || true)
	now="CAPTCluster [${cc:-…}]  CAPTControlPlane ${cp:-…}  Cluster ${phase:-…} (Ready=${ready:-…} Available=${available:-…} RemoteConnectionProbe=${probe:-…})"
	if [[ "$now" != "$last" ]] || (($(date +%s) - said >= 15)); then
		say "$now ($(($(date +%s) - started)) s of at most 120 s)"
		last=$now said=$(date +%s)
	fi
	[[ "$phase" == Provisioned && "$ready" == True && "$available" == True && "$probe" == True ]] && break
	if (($(date +%s) - started > 120)); then
		say "the Cluster was not Provisioned, Ready and Available within 120 s; logs in $RUN"
		exit 1
	fi
	sleep 0.5
done
say "Cluster demo is Provisioned, Ready and Available (core connected to it) after $(($(date +%s) - started)) s"
echo
kubectl get cluster,captcluster,captcontrolplane,workspacetemplateapply,workspaces
echo
kubectl get clusters.v1beta2.cluster.x-k8s.io demo -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}'
echo
echo
say "ownership audit (status-applier audit): the control plane (the Cluster's status is Cluster API core's, manager 'manager'), then every object"
"$BIN/status-applier" audit captcontrolplane/demo -n default --policy "$POLICY"
if "$BIN/status-applier" audit -n default --policy "$POLICY" >"$RUN/audit.txt" 2>&1; then
	say "audit of every CAPT object: no violation (full report: $RUN/audit.txt)"
else
	say "audit found violations:"; grep VIOLATION "$RUN/audit.txt"
fi
say "demo done in $(($(date +%s) - demo_started)) s (build, environment, provisioning and audit)"
if $keep; then
	echo
	say "still running. Point kubectl at it with:"
	echo "$exports"
	echo "The status-applier's socket: $RUN/applier.sock (target/debug/status-applier show --socket $RUN/applier.sock -o yaml)"
	echo "Stop everything with Ctrl-C here, or: kill ${pids[*]}; hack/testenv.sh stop"
	wait
fi
