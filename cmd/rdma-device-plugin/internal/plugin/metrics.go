package plugin

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fastpath-k8s/fastpath/internal/version"
)

// Metrics are the plugin's Prometheus metrics, on their own registry with
// client_golang's process and Go collectors, as every Kubernetes node
// component serves them. A nil *Metrics records nothing.
type Metrics struct {
	Registry      *prometheus.Registry
	devices       *prometheus.GaugeVec
	healthy       *prometheus.GaugeVec
	allocations   *prometheus.CounterVec
	registrations *prometheus.CounterVec
	rescan        prometheus.Histogram
	vfsDesired    *prometheus.GaugeVec
	vfsActual     *prometheus.GaugeVec
	reloadErrors  prometheus.Counter
}

// NewMetrics creates the metrics, fastpath_build_info for build and the
// process_* and go_* series.
//
// RDMA port counters are not among them: node_exporter's infiniband
// collector (on by default) exports every HCA's, VFs' included, under
// the names dashboards use (node_infiniband_port_data_received_bytes_total
// ...), in bytes where the kernel counts 4-octet words.
func NewMetrics(build version.Info) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "fastpath", Subsystem: "device_plugin", Name: "devices",
			Help: "Devices advertised to the kubelet, per resource.",
		}, []string{"resource"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "fastpath", Subsystem: "device_plugin", Name: "healthy_devices",
			Help: "Healthy devices advertised to the kubelet, per resource.",
		}, []string{"resource"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "fastpath", Subsystem: "device_plugin", Name: "allocated_devices_total",
			Help: "Devices handed out by Allocate, per resource.",
		}, []string{"resource"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "fastpath", Subsystem: "device_plugin", Name: "registrations_total",
			Help: "Registrations with the kubelet, per resource and result.",
		}, []string{"resource", "result"}),
		rescan: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "fastpath", Subsystem: "device_plugin", Name: "rescan_duration_seconds",
			Help:    "Time to scan the host and rebuild the pools.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		vfsDesired: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "fastpath", Subsystem: "provision", Name: "vfs_desired",
			Help: "VFs the owning SriovNetworkNodePolicy wants on the PF (numVfs).",
		}, []string{"pf", "policy"}),
		vfsActual: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "fastpath", Subsystem: "provision", Name: "vfs",
			Help: "VFs the PF has (sriov_numvfs), for the PFs a policy owns.",
		}, []string{"pf"}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "fastpath", Subsystem: "config", Name: "reload_errors_total",
			Help: "Changes of the pool config file that did not load: the plugin kept its last good config.",
		}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "fastpath", Name: "build_info",
		Help:        "Always 1; the labels say which build of fastpath runs.",
		ConstLabels: prometheus.Labels{"version": build.Version, "revision": build.Revision, "goversion": build.GoVersion},
	})
	info.Set(1)
	m.Registry.MustRegister(info, m.devices, m.healthy, m.allocations, m.registrations, m.rescan, m.vfsDesired, m.vfsActual, m.reloadErrors,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector())
	return m
}

func (m *Metrics) setDevices(resource string, n, healthy int) {
	if m == nil {
		return
	}
	m.devices.WithLabelValues(resource).Set(float64(n))
	m.healthy.WithLabelValues(resource).Set(float64(healthy))
}

func (m *Metrics) forget(resource string) {
	if m == nil {
		return
	}
	m.devices.DeleteLabelValues(resource)
	m.healthy.DeleteLabelValues(resource)
}

func (m *Metrics) allocated(resource string, n int) {
	if m == nil {
		return
	}
	m.allocations.WithLabelValues(resource).Add(float64(n))
}

func (m *Metrics) registered(resource string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.registrations.WithLabelValues(resource, result).Inc()
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
	m.vfsDesired.WithLabelValues(pf, policy).Set(float64(desired))
	m.vfsActual.WithLabelValues(pf).Set(float64(actual))
}

// reloadRejected counts a config change that did not load.
func (m *Metrics) reloadRejected() {
	if m == nil {
		return
	}
	m.reloadErrors.Inc()
}

// Handler serves the metrics in the Prometheus exposition formats
// (promhttp: the text format unless the scraper asks for protobuf;
// gzipped when it accepts gzip).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
