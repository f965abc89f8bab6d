package plugin

import (
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/version"
)

// Every metric family the plugin exports passes client_golang's own lint
// (names, units, _total on counters and only there, help text), and the
// list below is all of them: a new family is linted by this test or fails
// it.
func TestMetricsLint(t *testing.T) {
	m := NewMetrics(version.Info{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.26"})
	// Give every family a sample: lint only sees families with samples.
	m.setDevices("mellanox.com/rails", 32, 31)
	m.allocated("mellanox.com/rails", 2)
	m.registered("mellanox.com/rails", nil)
	m.registered("mellanox.com/rails", errors.New("refused"))
	m.rescanned(3 * time.Millisecond)

	families, err := m.Registry.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	sort.Strings(names)
	require.Equal(t, []string{
		"fastpath_build_info",
		"fastpath_device_plugin_allocated_devices_total",
		"fastpath_device_plugin_devices",
		"fastpath_device_plugin_healthy_devices",
		"fastpath_device_plugin_registrations_total",
		"fastpath_device_plugin_rescan_duration_seconds",
	}, names)

	problems, err := testutil.GatherAndLint(m.Registry)
	require.NoError(t, err)
	require.Empty(t, problems)
	// And each collector on its own, as testutil.CollectAndLint sees it.
	for _, c := range []prometheus.Collector{m.devices, m.healthy, m.allocations, m.registrations, m.rescan} {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		require.Empty(t, problems)
	}

	require.Equal(t, 2.0, testutil.ToFloat64(m.allocations.WithLabelValues("mellanox.com/rails")))
}
