package plugin

import (
	"net/http"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/promtext"
	"github.com/fastpath-k8s/fastpath/internal/version"
)

// Metrics are the plugin's Prometheus metrics, on their own registry. A nil
// *Metrics records nothing. They are served by internal/promtext, in the
// text exposition format, and not by client_golang: its package init alone
// cost every start of the lean binary 10 package inits, 211 KB and 1,446
// allocations (docs/performance-ratios.md).
type Metrics struct {
	Registry      *promtext.Registry
	devices       *promtext.Family
	healthy       *promtext.Family
	allocations   *promtext.Family
	registrations *promtext.Family
	rescan        *promtext.Family
	vfsDesired    *promtext.Family
	vfsActual     *promtext.Family
}

// NewMetrics creates the metrics and fastpath_build_info for build.
//
// RDMA port counters are not among them: node_exporter's infiniband
// collector (on by default) exports every HCA's, VFs' included, under
// the names dashboards use (node_infiniband_port_data_received_bytes_total
// ...), in bytes where the kernel counts 4-octet words.
func NewMetrics(build version.Info) *Metrics {
	r := &promtext.Registry{}
	m := &Metrics{
		Registry: r,
		devices: r.Gauge("fastpath_device_plugin_devices",
			"Devices advertised to the kubelet, per resource.", "resource"),
		healthy: r.Gauge("fastpath_device_plugin_healthy_devices",
			"Healthy devices advertised to the kubelet, per resource.", "resource"),
		allocations: r.Counter("fastpath_device_plugin_allocated_devices_total",
			"Devices handed out by Allocate, per resource.", "resource"),
		registrations: r.Counter("fastpath_device_plugin_registrations_total",
			"Registrations with the kubelet, per resource and result.", "resource", "result"),
		rescan: r.Histogram("fastpath_device_plugin_rescan_duration_seconds",
			"Time to scan the host and rebuild the pools.", promtext.ExponentialBuckets(0.0005, 2, 14)),
		vfsDesired: r.Gauge("fastpath_provision_vfs_desired",
			"VFs the owning SriovNetworkNodePolicy wants on the PF (numVfs).", "pf", "policy"),
		vfsActual: r.Gauge("fastpath_provision_vfs",
			"VFs the PF has (sriov_numvfs), for the PFs a policy owns.", "pf"),
	}
	r.Gauge("fastpath_build_info", "Always 1; the labels say which build of fastpath runs.", "version", "revision", "goversion").
		Set(1, build.Version, build.Revision, build.GoVersion)
	return m
}

func (m *Metrics) setDevices(resource string, n, healthy int) {
	if m == nil {
		return
	}
	m.devices.Set(float64(n), resource)
	m.healthy.Set(float64(healthy), resource)
}

func (m *Metrics) forget(resource string) {
	if m == nil {
		return
	}
	m.devices.Delete(resource)
	m.healthy.Delete(resource)
}

func (m *Metrics) allocated(resource string, n int) {
	if m == nil {
		return
	}
	m.allocations.Add(float64(n), resource)
}

func (m *Metrics) registered(resource string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.registrations.Add(1, resource, result)
}

func (m *Metrics) rescanned(d time.Duration) {
	if m == nil {
		return
	}
	m.rescan.Observe(d.Seconds())
}

// SetVFs records a PF's VFs: what its policy wants and what it has.
func (m *Metrics) SetVFs(pf, policy string, desired, actual int) {
	if m == nil {
		return
	}
	m.vfsDesired.Set(float64(desired), pf, policy)
	m.vfsActual.Set(float64(actual), pf)
}

// Handler serves the metrics in the Prometheus text exposition format.
func (m *Metrics) Handler() http.Handler {
	return m.Registry.Handler()
}
