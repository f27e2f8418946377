//go:build tools

// Package tools pins the Cluster API commands hack/testenv.sh builds, so go.sum covers them.
// Since v1.11 the core manager's main package is sigs.k8s.io/cluster-api/core.
package tools

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/core"
)
