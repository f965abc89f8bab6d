package rdma

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// Counter is one RDMA port counter.
type Counter struct {
	Name  string // "port_rcv_data", "out_of_sequence", …
	Value uint64
	// Hardware is set for hw_counters (driver-specific), unset for the
	// standard counters.
	Hardware bool
}

// PortCounters are the counters of one port.
type PortCounters struct {
	Port     int
	Counters []Counter
}

// HostCounters reads the port counters of RDMA device dev on the running
// host, through rdmamap, which reads the fixed /sys/class/infiniband
// (never an injected root: counters only exist on a real host). A port
// without a counters or hw_counters directory has fewer counters, not an
// error; a device without ports is an error.
func HostCounters(dev string) ([]PortCounters, error) {
	if err := checkName(dev); err != nil {
		return nil, err
	}
	ports := rdmamap.GetPorts(dev)
	if len(ports) == 0 {
		return nil, fmt.Errorf("rdma %s: no ports under /sys/class/infiniband/%s/ports", dev, dev)
	}
	var out []PortCounters
	for _, p := range ports {
		n, err := strconv.Atoi(p)
		if err != nil {
			continue
		}
		pc := PortCounters{Port: n}
		if stats, err := rdmamap.GetRdmaSysfsStats(dev, n); err == nil {
			for _, s := range stats {
				pc.Counters = append(pc.Counters, Counter{Name: s.Name, Value: s.Value})
			}
		}
		if stats, err := rdmamap.GetRdmaSysfsHwStats(dev, n); err == nil {
			for _, s := range stats {
				pc.Counters = append(pc.Counters, Counter{Name: s.Name, Value: s.Value, Hardware: true})
			}
		}
		sort.Slice(pc.Counters, func(i, j int) bool {
			if pc.Counters[i].Hardware != pc.Counters[j].Hardware {
				return !pc.Counters[i].Hardware
			}
			return pc.Counters[i].Name < pc.Counters[j].Name
		})
		out = append(out, pc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// checkName refuses device names that would build paths outside sysfs.
func checkName(dev string) error {
	if dev == "" || strings.ContainsAny(dev, "/\x00") || dev == "." || dev == ".." {
		return fmt.Errorf("rdma: invalid device name %q", dev)
	}
	return nil
}
