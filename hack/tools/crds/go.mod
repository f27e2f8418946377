// Pins the upstream CRDs the tests install: provider-terraform's Workspace CRD, and Cluster
// API (v1.14: its CRDs serve v1beta1, the contract CAPT implements, and store v1beta2), whose
// CRDs hack/testenv.sh reads from hack/tools/cluster-api, which must pin the same version
// (the script checks).
// hack/testenv.sh reads them from the Go module cache; nothing is copied into the repo.
module github.com/capt/status-management/hack/tools/crds

go 1.26.0

require (
	github.com/upbound/provider-terraform v0.18.0
	sigs.k8s.io/cluster-api v1.14.2
)
