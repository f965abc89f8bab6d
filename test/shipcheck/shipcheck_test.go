// Package shipcheck checks that no production binary links test support:
// a package under internal/testsupport, or one named …test beside its
// subject (pkg/provision/provisiontest, pkg/sriov/sriovtest,
// cmd/sriov-cni/internal/plugin/failpointtest).
package shipcheck

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/fastpath-k8s/fastpath/"

// testSupport is a package of this module that only tests may link.
func testSupport(pkg string) bool {
	rel, ok := strings.CutPrefix(pkg, module)
	if !ok {
		return false
	}
	elems := strings.Split(rel, "/")
	return strings.HasPrefix(rel, "internal/testsupport/") || strings.HasSuffix(elems[len(elems)-1], "test")
}

// linked are the test-support packages that pkg links when built with tags
// (go list -deps).
func linked(t *testing.T, tags, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, module+pkg).Output()
	require.NoError(t, err, "go list -deps -tags %q %s", tags, pkg)
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		if testSupport(dep) {
			bad = append(bad, dep)
		}
	}
	return bad
}

// TestProductionBinariesLinkNoTestSupport covers every binary the Makefile
// ships (make build: both device-plugin builds, with and without the DRA
// driver, each with grpcnotrace as shipped and without it, and the CNI),
// and a test build that must be caught: the CNI with -tags failpoints.
func TestProductionBinariesLinkNoTestSupport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the binaries' dependencies")
	}
	for _, tc := range []struct {
		pkg, tags string
		want      []string
	}{
		{pkg: "cmd/rdma-device-plugin", tags: ""},
		{pkg: "cmd/rdma-device-plugin", tags: "grpcnotrace"},
		{pkg: "cmd/rdma-device-plugin", tags: "nodra"},
		{pkg: "cmd/rdma-device-plugin", tags: "nodra,grpcnotrace"},
		{pkg: "cmd/sriov-cni", tags: ""},
		{pkg: "cmd/sriov-cni", tags: "grpcnotrace"},
		{pkg: "cmd/sriov-cni", tags: "failpoints", want: []string{module + "cmd/sriov-cni/internal/plugin/failpointtest"}},
	} {
		t.Run(tc.pkg+"/tags="+tc.tags, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, linked(t, tc.tags, tc.pkg), "test-support packages linked by %s (-tags %q); a production binary takes nothing from internal/testsupport or a …test package", tc.pkg, tc.tags)
		})
	}
}

func TestTestSupport(t *testing.T) {
	for pkg, want := range map[string]bool{
		module + "internal/testsupport/fixture":                true,
		module + "pkg/provision/provisiontest":                 true,
		module + "cmd/sriov-cni/internal/plugin/failpointtest": true,
		module + "internal/sysfs":                              false,
		module + "pkg/provision":                               false,
		"github.com/stretchr/testify/require":                  false,
	} {
		require.Equal(t, want, testSupport(pkg), pkg)
	}
}
