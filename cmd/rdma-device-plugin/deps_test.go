package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lean build links neither client_golang (its /metrics is
// internal/promtext's) nor the CDI library's cache with its YAML parser
// (specs are written by internal/cdiwrite): their package inits ran at
// every start (docs/performance-ratios.md), nor the DRA driver's socket
// for the CNI (internal/netdata).
func TestLeanBuildDeps(t *testing.T) {
	deps, err := exec.Command("go", "list", "-tags", "nodra,grpcnotrace", "-deps", ".").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(deps)) {
		for _, heavy := range []string{"github.com/prometheus/", "go.yaml.in/yaml/v3", "tags.cncf.io/container-device-interface/pkg/cdi", "github.com/fastpath-k8s/fastpath/internal/netdata"} {
			require.False(t, strings.HasPrefix(pkg, heavy), "the lean build links %s", pkg)
		}
	}
}
