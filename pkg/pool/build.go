package pool

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// Pool is a resource and the functions that back it: VFs for an exclusive
// pool, HCAs for a shared one.
type Pool struct {
	Resource
	Devices []nic.Device
}

// Capacity is how many devices the pool advertises to the kubelet: one per
// VF for an exclusive pool, RdmaHcaMax for a shared pool that has HCAs.
func (p *Pool) Capacity() int {
	if p.Kind == Shared {
		if len(p.Devices) == 0 {
			return 0
		}
		return p.RdmaHcaMax
	}
	return len(p.Devices)
}

// BuildOption adds to what Build knows of the node.
type BuildOption func(*buildOptions)

type buildOptions struct {
	hostRoutes map[string]bool
}

// WithDefaultRoutes names the netdevs that carry the node's default route
// (IPv4 or IPv6): no exclusive pool takes their functions, as
// sriov-network-device-plugin leaves out a device that has one. A shared
// pool still may: sharing an HCA's RDMA device takes nothing from the
// node's netdev.
func WithDefaultRoutes(netdevs ...string) BuildOption {
	return func(o *buildOptions) {
		if o.hostRoutes == nil {
			o.hostRoutes = map[string]bool{}
		}
		for _, n := range netdevs {
			o.hostRoutes[n] = true
		}
	}
}

// Build assigns devices (a discovery snapshot, sorted by PCI address) to
// the config's pools, in config order. An exclusive pool takes bound
// functions that are not PFs with VFs; a function goes to the first
// exclusive pool that selects it. A shared pool takes functions with an
// RDMA device that no exclusive pool holds: a pod that owns a VF must not
// share its RDMA device. What was matched but left out is a warning.
func Build(cfg *Config, devices []nic.Device, opts ...BuildOption) ([]Pool, []string) {
	var o buildOptions
	for _, f := range opts {
		f(&o)
	}
	var warns []string
	pools := make([]Pool, len(cfg.Resources))
	// owner[i] is the exclusive resource that holds devices[i], "" for
	// none. Devices are taken by index and copied once, into a pool sized
	// for them: a node of a thousand VFs is a thousand large structs.
	owner := make([]string, len(devices))
	var matched []int // the indexes of the devices a resource selects
	for i := range cfg.Resources {
		r := &cfg.Resources[i]
		pools[i] = Pool{Resource: *r, Devices: []nic.Device{}}
		if r.Kind != Exclusive {
			continue
		}
		name := r.ResourceName()
		matched = matched[:0]
		taken := map[string][]string{} // earlier resource → addresses it already holds
		var takenOrder []string
		for j := range devices {
			d := &devices[j]
			if !r.matches(d) {
				continue
			}
			switch {
			case !d.IsVF() && d.NumVFs > 0:
				continue // a PF whose VFs are in use is not handed out whole
			case d.Driver == "":
				warns = append(warns, fmt.Sprintf("%s: %s is selected but bound to no driver: left out (bind it to its netdevice driver, e.g. mlx5_core or iavf, or to vfio-pci)", r.ResourceName(), d.PCIAddress))
				continue
			case d.Netdev != "" && o.hostRoutes[d.Netdev]:
				warns = append(warns, fmt.Sprintf("%s: %s is selected but its netdev %s carries the node's default route: left out (a pod given it would take the node's own network)", r.ResourceName(), d.PCIAddress, d.Netdev))
				continue
			}
			if prev := owner[j]; prev != "" {
				if taken[prev] == nil {
					takenOrder = append(takenOrder, prev)
				}
				taken[prev] = append(taken[prev], d.PCIAddress)
				continue
			}
			owner[j] = name
			matched = append(matched, j)
		}
		pools[i].Devices = take(devices, matched)
		for _, prev := range takenOrder {
			warns = append(warns, fmt.Sprintf("%s: %d selected functions are already in %s (the first pool that selects a function gets it): %s",
				r.ResourceName(), len(taken[prev]), prev, strings.Join(taken[prev], ", ")))
		}
	}
	for i := range pools {
		p := &pools[i]
		if p.Kind != Shared {
			continue
		}
		matched = matched[:0]
		var noRDMA []string // selected functions without an RDMA device
		hint := ""
		for j := range devices {
			d := &devices[j]
			if !p.matches(d) {
				continue
			}
			if d.RDMADevice == "" {
				if noRDMA = append(noRDMA, d.PCIAddress); hint == "" {
					hint = nic.RDMAHint(d.Driver)
				}
				continue
			}
			if prev := owner[j]; prev != "" {
				warns = append(warns, fmt.Sprintf("%s: %s is in exclusive pool %s: left out of the shared pool", p.ResourceName(), d.PCIAddress, prev))
				continue
			}
			matched = append(matched, j)
		}
		p.Devices = take(devices, matched)
		if len(noRDMA) > 0 {
			warns = append(warns, fmt.Sprintf("%s: %s selected but without an RDMA device: left out (%s; %s)",
				p.ResourceName(), countFunctions(len(noRDMA)), words.List(noRDMA, 4), hint))
		}
	}
	for i := range pools {
		if len(pools[i].Devices) == 0 {
			warns = append(warns, fmt.Sprintf("%s (%s): no device matches its selectors", pools[i].ResourceName(), pools[i].Source))
		}
	}
	return pools, warns
}

// take copies devices[idx...] into a slice of their own, never nil.
func take(devices []nic.Device, idx []int) []nic.Device {
	out := make([]nic.Device, len(idx))
	for k, j := range idx {
		out[k] = devices[j]
	}
	return out
}

// matches reports whether any of r's selectors matches d.
func (r *Resource) matches(d *nic.Device) bool {
	for i := range r.Selectors {
		if r.Selectors[i].Matches(d) {
			return true
		}
	}
	return false
}

// Matches reports whether every field of s that is set matches d.
func (s *Selector) Matches(d *nic.Device) bool {
	if len(s.Vendors) > 0 && !slices.Contains(s.Vendors, d.Vendor) {
		return false
	}
	if len(s.Devices) > 0 && !slices.Contains(s.Devices, d.DeviceID) {
		return false
	}
	if len(s.Drivers) > 0 && !slices.Contains(s.Drivers, d.Driver) {
		return false
	}
	if slices.Contains(s.NotDrivers, d.Driver) {
		return false
	}
	if len(s.PCIAddresses) > 0 && !slices.Contains(s.PCIAddresses, d.PCIAddress) {
		return false
	}
	if len(s.IfNames) > 0 && (d.Netdev == "" || !slices.Contains(s.IfNames, d.Netdev)) {
		return false
	}
	if len(s.LinkTypes) > 0 && !slices.Contains(s.LinkTypes, d.LinkType) {
		return false
	}
	if s.IsRdma && d.RDMADevice == "" {
		return false
	}
	if len(s.PFNames) > 0 && !inSets(s.PFNames, d, func(d *nic.Device) string { return d.PFNetdev }) {
		return false
	}
	if len(s.RootDevices) > 0 && !inSets(s.RootDevices, d, func(d *nic.Device) string {
		if d.IsVF() {
			return d.PFAddress
		}
		return d.PCIAddress
	}) {
		return false
	}
	return true
}

// inSets reports whether d is a VF in one of sets, or the PF itself of a
// set without a VF range.
func inSets(sets []VFSet, d *nic.Device, pf func(*nic.Device) string) bool {
	key := pf(d)
	if key == "" {
		return false
	}
	for _, set := range sets {
		if set.PF != key {
			continue
		}
		if !d.IsVF() {
			if set.Ranges == nil {
				return true
			}
			continue
		}
		if set.Contains(d.VFIndex) {
			return true
		}
	}
	return false
}

// countFunctions is "1 function is" or "n functions are".
func countFunctions(n int) string {
	if n == 1 {
		return "1 function is"
	}
	return fmt.Sprintf("%d functions are", n)
}
