package main

import (
	"log/slog"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// counterCollector exports the RDMA port counters of the pools' HCAs,
// read at scrape time. rdmamap reads the real /sys only, so with a
// --host-root other than / the collector exports nothing (and says so
// once).
type counterCollector struct {
	src     *plugin.Source
	enabled bool
	log     *slog.Logger
	read    func(dev string) ([]rdma.PortCounters, error)

	std, hw *prometheus.Desc

	mu     sync.Mutex // guards failed
	failed map[string]bool
}

func newCounterCollector(src *plugin.Source, realHost bool, log *slog.Logger) *counterCollector {
	if !realHost {
		log.Info("RDMA port counters are read from the real /sys only; not exported with --host-root")
	}
	labels := []string{"device", "port", "counter"}
	return &counterCollector{
		src: src, enabled: realHost, log: log, read: rdma.HostCounters, failed: map[string]bool{},
		std: prometheus.NewDesc("fastpath_rdma_port_counter", "RDMA port counter (ports/N/counters) of a pool's HCA.", labels, nil),
		hw:  prometheus.NewDesc("fastpath_rdma_port_hw_counter", "RDMA port hardware counter (ports/N/hw_counters) of a pool's HCA.", labels, nil),
	}
}

func (c *counterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.std
	ch <- c.hw
}

func (c *counterCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.enabled {
		return
	}
	for _, dev := range c.src.HCAs() {
		ports, err := c.read(dev)
		c.mu.Lock()
		if err != nil && !c.failed[dev] {
			c.log.Warn("read RDMA port counters", "device", dev, "err", err)
		}
		c.failed[dev] = err != nil
		c.mu.Unlock()
		for _, p := range ports {
			for _, k := range p.Counters {
				desc := c.std
				if k.Hardware {
					desc = c.hw
				}
				ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(k.Value), dev, strconv.Itoa(p.Port), k.Name)
			}
		}
	}
}
