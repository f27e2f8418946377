// Pins the real Terraform provider the tests and hack/demo.sh can run (hack/real-provider.sh):
// Crossplane's provider-terraform and OpenTofu, the `terraform` it runs. Each is built from a
// writable copy of its own module (its go.mod and go.sum pin its dependencies; OpenTofu's
// go.mod has a replace, which `go install` refuses); this go.sum pins the two modules' hashes.
module github.com/capt/status-management/hack/tools/provider-terraform

go 1.24.0

require (
	github.com/opentofu/opentofu v1.10.10
	github.com/upbound/provider-terraform v0.18.0
)
