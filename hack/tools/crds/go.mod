// Pins the upstream CRDs the tests install: the Cluster API Cluster CRD (v1.10 stores
// v1beta1, the contract CAPT implements) and provider-terraform's Workspace CRD.
// hack/testenv.sh reads them from the Go module cache; nothing is copied into the repo.
module github.com/capt/status-management/hack/tools/crds

go 1.24.0

require (
	github.com/upbound/provider-terraform v0.18.0
	sigs.k8s.io/cluster-api v1.10.4
)
