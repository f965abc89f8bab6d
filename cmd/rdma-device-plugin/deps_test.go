package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lean build links neither the CDI library's cache with its YAML
// parser (specs are written by internal/cdiwrite: the library's write
// raised the 1024-VF daemon's peak RSS, docs/benchmarks.md) nor the DRA
// driver's socket for the CNI (internal/netdata). It links client_golang
// with its process and Go collectors: /metrics serves process_* and go_*,
// as every Kubernetes node component does.
func TestLeanBuildDeps(t *testing.T) {
	deps := goListDeps(t, "nodra,grpcnotrace", ".")
	for _, pkg := range deps {
		for _, heavy := range []string{"go.yaml.in/yaml/v3", "tags.cncf.io/container-device-interface/pkg/cdi", "github.com/fastpath-k8s/fastpath/internal/netdata"} {
			require.False(t, strings.HasPrefix(pkg, heavy), "the lean build links %s", pkg)
		}
	}
	require.Contains(t, deps, "github.com/prometheus/client_golang/prometheus/collectors")
}

// goListDeps are the packages pkg links when built with tags.
func goListDeps(t *testing.T, tags, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", tags, "-deps", pkg).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// BenchmarkDaemonRSSDRA's floor is regfloor as the DRA build is built: it
// links the kubelet plugin library and client-go's clientset, as
// rdma-device-plugin-dra does, and the lean regfloor (BenchmarkDaemonStart's,
// BenchmarkDaemonRSS's) links neither.
func TestRegFloorDeps(t *testing.T) {
	draLibs := []string{"k8s.io/dynamic-resource-allocation/kubeletplugin", "k8s.io/client-go/kubernetes"}
	for _, tc := range []struct {
		pkg, tags string
		want      bool
	}{
		{regfloorPkg, "grpcnotrace", true},
		{".", "grpcnotrace", true},
		{regfloorPkg, "nodra,grpcnotrace", false},
	} {
		deps := goListDeps(t, tc.tags, tc.pkg)
		for _, lib := range draLibs {
			require.Equal(t, tc.want, slices.Contains(deps, lib), "%s -tags %s links %s", tc.pkg, tc.tags, lib)
		}
	}
}

// regfloor -dra, the path that keeps the library's Start linked in, needs
// a cluster: outside one it ends with the client's error before it serves.
func TestRegFloorDRAOutsideCluster(t *testing.T) {
	cmd := exec.Command(regfloorDRABinary(t), "-dra", "floor.example.com", t.TempDir(), "example.com/floor")
	cmd.Env = []string{"NODE_NAME=node-a"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	require.Equal(t, 1, exit.ExitCode())
	require.Contains(t, string(out), "regfloor: unable to load in-cluster configuration")
}
