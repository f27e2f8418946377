//go:build tools

// Package tools pins the Cluster API commands hack/testenv.sh builds, so go.sum covers them.
package tools

import (
	_ "sigs.k8s.io/cluster-api"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
)
