package plugin

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/version"
)

// Every metric family the plugin exports passes client_golang's own lint
// (names, units, _total on counters and only there, help text) on what
// /metrics serves, parsed by Prometheus' own text parser, and the list
// below is all of them: a new family is linted by this test or fails it.
func TestMetricsLint(t *testing.T) {
	m := NewMetrics(version.Info{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.26"})
	// Give every family a sample: only families with samples are served.
	m.setDevices("mellanox.com/rails", 32, 31)
	m.allocated("mellanox.com/rails", 2)
	m.registered("mellanox.com/rails", nil)
	m.registered("mellanox.com/rails", errors.New("refused"))
	m.rescanned(3 * time.Millisecond)
	m.SetVFs("0000:18:00.0", "ib-rails", 8, 8)
	m.reloadRejected()

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	require.Equal(t, expfmt.TypeTextPlain, expfmt.ResponseFormat(rec.Header()).FormatType())
	body := rec.Body.Bytes()

	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	var names []string
	for name := range families {
		if strings.HasPrefix(name, "fastpath_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	// client_golang's process and Go collectors, which dashboards and
	// alerts for every Go node daemon watch.
	for _, name := range []string{"process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total", "go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds"} {
		require.Contains(t, families, name)
	}
	require.Equal(t, []string{
		"fastpath_build_info",
		"fastpath_config_reload_errors_total",
		"fastpath_device_plugin_allocated_devices_total",
		"fastpath_device_plugin_devices",
		"fastpath_device_plugin_healthy_devices",
		"fastpath_device_plugin_registrations_total",
		"fastpath_device_plugin_rescan_duration_seconds",
		"fastpath_provision_vfs",
		"fastpath_provision_vfs_desired",
	}, names)
	// docs/device-plugin.md's metrics table lists exactly these.
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "device-plugin.md"))
	require.NoError(t, err)
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(fastpath_[a-z_]+)`").FindAllStringSubmatch(string(page), -1) {
		documented = append(documented, m[1])
	}
	sort.Strings(documented)
	require.Equal(t, names, documented, "docs/device-plugin.md's metrics table against what /metrics serves")

	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)

	alloc := families["fastpath_device_plugin_allocated_devices_total"].GetMetric()
	require.Len(t, alloc, 1)
	require.Equal(t, 2.0, alloc[0].GetCounter().GetValue())
	rescan := families["fastpath_device_plugin_rescan_duration_seconds"].GetMetric()
	require.Len(t, rescan, 1)
	require.Equal(t, uint64(1), rescan[0].GetHistogram().GetSampleCount())
	require.Contains(t, string(body), `fastpath_device_plugin_registrations_total{resource="mellanox.com/rails",result="error"} 1`)

	// The provisioning gauges once set; a forgotten resource goes.
	m.SetVFs("0000:18:00.0", "ib-rails", 8, 4)
	m.forget("mellanox.com/rails")
	rec = httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := rec.Body
	require.Contains(t, out.String(), `fastpath_provision_vfs_desired{pf="0000:18:00.0",policy="ib-rails"} 8`)
	require.Contains(t, out.String(), `fastpath_provision_vfs{pf="0000:18:00.0"} 4`)
	require.NotContains(t, out.String(), `fastpath_device_plugin_devices{`)
	problems, err = promlint.New(out).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
}
