package rdma_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// countersChild is set in the re-executed test binary that runs inside a
// private mount namespace with a fixture over /sys.
const countersChild = "FASTPATH_TEST_COUNTERS_SYS"

// TestHostCountersInMountNamespace checks the rdmamap-backed reader against
// a fixture bind-mounted over /sys in a private mount namespace (rdmamap
// reads fixed /sys paths). Root only.
func TestHostCountersInMountNamespace(t *testing.T) {
	if sys := os.Getenv(countersChild); sys != "" {
		countersInChild(t, sys)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind-mounts a fixture over /sys in a private mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1) from util-linux")
	}
	root := t.TempDir()
	require.NoError(t, fixture.Write(root, "roce-cx6dx"))
	port := filepath.Join(root, "sys", "class", "infiniband", "mlx5_0", "ports", "1")
	for dir, files := range map[string]map[string]string{
		"counters":    {"port_rcv_data": "123456789\n", "port_xmit_data": "42\n"},
		"hw_counters": {"out_of_sequence": "7\n", "rx_write_requests": "0\n"},
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(port, dir), 0o755))
		for name, v := range files {
			require.NoError(t, os.WriteFile(filepath.Join(port, dir, name), []byte(v), 0o444))
		}
	}
	out := filepath.Join(t.TempDir(), "result.json")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0],
		"-test.run", "^TestHostCountersInMountNamespace$", "-test.count", "1")
	cmd.Env = append(os.Environ(), countersChild+"="+filepath.Join(root, "sys"), "FASTPATH_TEST_COUNTERS_OUT="+out)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", b)

	data, err := os.ReadFile(out)
	require.NoError(t, err, "child wrote no result: %s", b)
	var got struct {
		Counters map[string][]rdma.PortCounters
		Errors   map[string]string
	}
	require.NoError(t, json.Unmarshal(data, &got))
	require.Equal(t, []rdma.PortCounters{{Port: 1, Counters: []rdma.Counter{
		{Name: "port_rcv_data", Value: 123456789},
		{Name: "port_xmit_data", Value: 42},
		{Name: "out_of_sequence", Value: 7, Hardware: true},
		{Name: "rx_write_requests", Value: 0, Hardware: true},
	}}}, got.Counters["mlx5_0"])
	require.Equal(t, []rdma.PortCounters{{Port: 1}}, got.Counters["mlx5_1"], "a port without counter directories has none")
	require.Contains(t, got.Errors["nosuch"], "no ports")
}

func countersInChild(t *testing.T, sys string) {
	require.NoError(t, unix.Mount(sys, "/sys", "", unix.MS_BIND|unix.MS_REC, ""))
	got := struct {
		Counters map[string][]rdma.PortCounters
		Errors   map[string]string
	}{map[string][]rdma.PortCounters{}, map[string]string{}}
	for _, dev := range []string{"mlx5_0", "mlx5_1"} {
		c, err := rdma.HostCounters(dev)
		require.NoError(t, err)
		got.Counters[dev] = c
	}
	if _, err := rdma.HostCounters("nosuch"); err != nil {
		got.Errors["nosuch"] = err.Error()
	}
	data, err := json.Marshal(got)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(os.Getenv("FASTPATH_TEST_COUNTERS_OUT"), data, 0o644))
}
