#!/usr/bin/env bash
# The main job on the embedded default: a local API server with the CAPT CRDs and the real
# Cluster API and provider-terraform CRDs. (The status-applier, the controller and a sample
# Cluster join it as they are built; see the README.)
#
#   hack/demo.sh          start, show what is installed, stop
#   hack/demo.sh --keep   leave it running and print how to point kubectl at it
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
keep=false
[[ "${1:-}" == "--keep" ]] && keep=true

$keep || trap 'hack/testenv.sh stop' EXIT
exports=$(hack/testenv.sh start)
eval "$exports"
echo "== API server: $(kubectl config view -o jsonpath='{.clusters[0].cluster.server}') ($(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
kubectl get crd
if $keep; then
	echo
	echo "Still running. Point kubectl at it with:"
	echo "$exports"
	echo "Stop it with: hack/testenv.sh stop"
fi
