package plugin

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/version"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func TestSourceReload(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	write := func(s string) { require.NoError(t, os.WriteFile(cfg, []byte(s), 0o644)) }
	write(`{"periodicUpdateInterval": 30, "resourceList": [{"resourceName": "rails", "selectors": {"devices": ["101e"]}}]}`)
	var logs bytes.Buffer
	src, err := NewSource(cfg, nic.NewScanner(fixtureRoot("dgx-h100")), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	src.Metrics = NewMetrics(version.Info{})
	names := func(s Scan) map[string]int {
		out := map[string]int{}
		for _, p := range s.Pools {
			out[p.ResourceName()] = len(p.Devices)
		}
		return out
	}

	s, err := src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 32}, names(s))
	require.Equal(t, 30*time.Second, s.Interval)
	require.Equal(t, rdma.RDMACMPath, s.RDMACM)

	// A changed file is read only when asked to.
	write(`{"resourceList": [{"resourceName": "rails", "selectors": {"pfNames": ["ibp24s0"]}}]}`)
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 32}, names(s))
	s, err = src.Scan(true)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 4}, names(s))
	require.Equal(t, 60*time.Second, s.Interval, "the default interval")
	require.Contains(t, logs.String(), "config reloaded")

	// A broken edit keeps the last good config, and says why.
	write(`{"resourceList": [`)
	s, err = src.Scan(true)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"mellanox.com/rails": 4}, names(s))
	require.Contains(t, logs.String(), "config change rejected; keeping the last good config")
	reloadErrors := func() float64 {
		families, err := src.Metrics.Registry.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "fastpath_config_reload_errors_total" {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("fastpath_config_reload_errors_total not served")
		return 0
	}
	require.Equal(t, 1.0, reloadErrors(), "fastpath_config_reload_errors_total counts it")
	write(`{"resourceList": [{"resourceName": "rails", "selectors": {"pfNames": ["ibp24s0"]}}]}`)
	_, err = src.Scan(true)
	require.NoError(t, err)
	require.Equal(t, 1.0, reloadErrors(), "a good reload is no error")

	_, err = NewSource(filepath.Join(t.TempDir(), "none.json"), nic.NewScanner(fixtureRoot("dgx-h100")), slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "pool config file does not exist")
}

// A VF a CNI moved into a pod is out of the host's sysfs: its netdev and,
// in exclusive RDMA netns mode, its RDMA device. The source keeps it as
// the last scan saw it, so it stays in the pool that asks for RDMA (and in
// its CDI spec) while the pod runs, and says why once.
func TestSourceKeepsAVFInAPod(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(fixtureRoot("dgx-h100"))))
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"resourceList": [{"resourceName": "rails", "selectors": {"devices": ["101e"], "isRdma": true}}]}`), 0o644))
	var logs bytes.Buffer
	newSource := func() *Source {
		src, err := NewSource(cfg, nic.NewScanner(root), slog.New(slog.NewTextHandler(&logs, nil)))
		require.NoError(t, err)
		return src
	}
	src := newSource()
	const vf = "0000:18:00.1"
	find := func(s Scan) *nic.Device {
		require.Len(t, s.Pools, 1)
		for i := range s.Pools[0].Devices {
			if d := &s.Pools[0].Devices[i]; d.PCIAddress == vf {
				return d
			}
		}
		return nil
	}
	s, err := src.Scan(false)
	require.NoError(t, err)
	before := *find(s)
	require.Equal(t, "mlx5_12", before.RDMADevice)
	require.NotEmpty(t, before.CharDevices)

	back, err := fixture.MoveToPod(root, vf, true)
	require.NoError(t, err)
	for range 2 { // and on the rescan after
		s, err = src.Scan(false)
		require.NoError(t, err)
		require.Equal(t, 32, len(s.Pools[0].Devices))
		d := find(s)
		require.NotNil(t, d, "kept in the isRdma pool")
		require.Equal(t, before, *d)
	}
	require.Contains(t, logs.String(), vf+": netdev ibp24s0v0 and RDMA device mlx5_12 are not in the host's network namespace (moved into a pod?)")
	require.NotContains(t, logs.String(), vf+": no RDMA device")

	// A plugin started while the pod runs never saw them: the VF is left
	// out until it comes back.
	s, err = newSource().Scan(false)
	require.NoError(t, err)
	require.Equal(t, 31, len(s.Pools[0].Devices))
	require.Nil(t, find(s))

	require.NoError(t, back())
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, before, *find(s))

	// Shared RDMA netns mode: the netdev alone goes; the RDMA device is
	// read as it is.
	back, err = fixture.MoveToPod(root, vf, false)
	require.NoError(t, err)
	logs.Reset()
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.Equal(t, before, *find(s))
	require.Contains(t, logs.String(), vf+": netdev ibp24s0v0 is not in the host's network namespace (moved into a pod?)")
	require.NoError(t, back())

	// The RDMA devices gone with their netdevs in place (mlx5_ib
	// unloaded) is a fault: nothing is kept, the pool empties.
	require.NoError(t, fixture.UnloadModule(root, "mlx5_ib"))
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.Empty(t, s.Pools[0].Devices)
}

// The source asks for the node's default routes at each scan: their
// netdevs' functions stay out of exclusive pools; routes it cannot read
// leave nothing out, and say so.
func TestSourceLeavesOutTheNodesOwnNetwork(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"resourceList": [{"resourceName": "hostdev", "selectors": {"vendors": ["15b3"], "isRdma": true}}]}`), 0o644))
	var logs bytes.Buffer
	src, err := NewSource(cfg, nic.NewScanner(fixtureRoot("dgx-h100")), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	var routes []string
	var routesErr error
	src.DefaultRoutes = func() ([]string, error) { return routes, routesErr }
	has := func(s Scan, addr string) bool {
		for _, d := range s.Pools[0].Devices {
			if d.PCIAddress == addr {
				return true
			}
		}
		return false
	}

	s, err := src.Scan(false)
	require.NoError(t, err)
	require.True(t, has(s, "0000:29:00.0"))
	routes = []string{"enp41s0f0np0"}
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.False(t, has(s, "0000:29:00.0"))
	require.Contains(t, logs.String(), "0000:29:00.0 is selected but its netdev enp41s0f0np0 carries the node's default route")

	routes, routesErr = nil, errors.New("netlink: permission denied")
	s, err = src.Scan(false)
	require.NoError(t, err)
	require.True(t, has(s, "0000:29:00.0"))
	require.Contains(t, logs.String(), "the node's default routes: netlink: permission denied; no function is left out")
}
