#!/usr/bin/env bash
# What the API server spends on a status apply to a CAPTControlPlane, by its own audit
# timestamps (received → response complete), for three applies made in turn N times each:
#   bare  the floor's two-field apply ({status: {ready}}) to a control plane with no status;
#   full  the same apply to one carrying a provisioned control plane's status;
#   ours  that whole status applied by one manager, as the status-applier applies ours (under
#         a manager of its own: under ours, the running status-applier would answer each).
# Each apply flips `ready`, so each is a real change. Needs a local environment with a ready
# CAPTControlPlane to copy and its audit log, e.g. after `hack/demo.sh --fake-provider --keep`:
#   KUBECONFIG=.testenv/kubeconfig PATH=<testenv bin>:$PATH hack/apply-cost.sh [N]
# It works in a namespace of its own (apply-cost), deleted at the end.
set -euo pipefail
N=${1:-200}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AUDIT=${AUDIT:-$ROOT/.testenv/audit.log}
[ -r "$AUDIT" ] || { echo "no audit log at $AUDIT (set AUDIT)" >&2; exit 2; }
ns=apply-cost
sample=$(kubectl get captcontrolplane -A -o json | jq '[.items[] | select(.status.ready == true)][0]')
[ "$sample" != null ] || { echo "no ready CAPTControlPlane to copy (run hack/demo.sh --fake-provider --keep first)" >&2; exit 1; }
echo "copied status: $(jq -c .status <<<"$sample" | wc -c) bytes, from $(jq -r '.metadata.namespace + "/" + .metadata.name' <<<"$sample")"
kubectl create namespace $ns >/dev/null
trap 'kubectl delete namespace $ns --wait=false >/dev/null' EXIT
for name in bare full ours; do
	jq --arg n $name --arg ns $ns '{apiVersion, kind, metadata: {name: $n, namespace: $ns, annotations: {"cluster.x-k8s.io/paused": "true"}}, spec: {version: .spec.version, workspaceTemplateRef: .spec.workspaceTemplateRef}}' <<<"$sample" |
		kubectl apply --server-side --field-manager=apply-cost -f - >/dev/null
done
# The copied status, less the Paused condition (a paused object's, kept by our controller).
status() { jq --arg n "$1" --arg ns $ns --argjson ready "$2" '{apiVersion, kind, metadata: {name: $n, namespace: $ns}, status: (.status | del(.conditions[]? | select(.type == "Paused")) | .ready = $ready)}' <<<"$sample"; }
ready() { jq -n --arg n "$1" --arg ns $ns --argjson ready "$2" '{apiVersion: "controlplane.cluster.x-k8s.io/v1beta1", kind: "CAPTControlPlane", metadata: {name: $n, namespace: $ns}, status: {ready: $ready}}'; }
apply() { kubectl apply --server-side --subresource=status --field-manager="$1" -f - >/dev/null; }
status full true | jq 'del(.status.ready)' | apply apply-cost
start=$(date -u +%Y-%m-%dT%H:%M:%S.%6N)
for i in $(seq 1 "$N"); do
	r=$([ $((i % 2)) = 0 ] && echo true || echo false)
	ready bare "$r" | apply capt-floor
	ready full "$r" | apply capt-floor
	status ours "$r" | apply apply-cost-document
done
python3 - "$AUDIT" $ns "$start" <<'PY'
import json, sys
from datetime import datetime
audit, ns, start = sys.argv[1:]
ts = lambda s: datetime.strptime(s.rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
ms = {}
for line in open(audit):
    if ns not in line or '"ResponseComplete"' not in line:
        continue
    e = json.loads(line)
    o = e.get("objectRef", {})
    if o.get("namespace") != ns or o.get("subresource") != "status" or e["verb"] != "patch":
        continue
    if e["requestReceivedTimestamp"] < start:
        continue
    ms.setdefault(o["name"], []).append((ts(e["stageTimestamp"]) - ts(e["requestReceivedTimestamp"])) * 1000)
pct = lambda v, p: sorted(v)[min(len(v) - 1, int(round(p * (len(v) - 1))))]
for name in ("bare", "full", "ours"):
    v = ms.get(name, [])
    if v:
        print(f"{name}: {len(v)} applies, p50 {pct(v, .5):.2f} / p90 {pct(v, .9):.2f} / p99 {pct(v, .99):.2f} ms")
PY
