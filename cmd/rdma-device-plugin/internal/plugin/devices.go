package plugin

import (
	"fmt"
	"slices"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// slot is one device as the kubelet sees it: a VF of an exclusive pool, or
// one of the RdmaHcaMax shares of a shared pool.
type slot struct {
	ID string
	// NUMA nodes reported as TopologyInfo (empty: none).
	Topology []int
	// NUMA is the node used to group devices for preferred allocation
	// (-1: unknown); it is set even when ExcludeTopology hides it.
	NUMA int
	// PF groups VFs by physical function (rail) for pack/spread.
	PF string
	// Functions are the PCI functions the slot hands out: the VF itself,
	// or all of a shared pool's HCAs.
	Functions []*nic.Device
	Healthy   bool
}

// healthFunc reports whether a PCI function is usable now.
type healthFunc func(d *nic.Device) bool

// buildSlots turns a pool into the kubelet's device list. The order is
// stable: exclusive slots by PCI address, shared slots by index.
func buildSlots(p *pool.Pool, healthy healthFunc) []slot {
	devs := make([]*nic.Device, len(p.Devices))
	for i := range p.Devices {
		devs[i] = &p.Devices[i]
	}
	slices.SortFunc(devs, func(a, b *nic.Device) int {
		switch {
		case a.PCIAddress < b.PCIAddress:
			return -1
		case a.PCIAddress > b.PCIAddress:
			return 1
		}
		return 0
	})
	if p.Kind == pool.Shared {
		return sharedSlots(p, devs, healthy)
	}
	out := make([]slot, 0, len(devs))
	for _, d := range devs {
		s := slot{ID: d.PCIAddress, NUMA: d.NUMANode, PF: d.PFAddress, Functions: []*nic.Device{d}, Healthy: healthy(d)}
		if s.PF == "" {
			s.PF = d.PCIAddress
		}
		if d.NUMANode >= 0 && !p.ExcludeTopology {
			s.Topology = []int{d.NUMANode}
		}
		out = append(out, s)
	}
	return out
}

func sharedSlots(p *pool.Pool, hcas []*nic.Device, healthy healthFunc) []slot {
	if len(hcas) == 0 {
		return nil
	}
	var nodes []int
	anyHealthy := false
	for _, d := range hcas {
		if d.NUMANode >= 0 && !slices.Contains(nodes, d.NUMANode) {
			nodes = append(nodes, d.NUMANode)
		}
		anyHealthy = anyHealthy || healthy(d)
	}
	slices.Sort(nodes)
	allKnown := true
	for _, d := range hcas {
		allKnown = allKnown && d.NUMANode >= 0
	}
	numa := -1
	if len(nodes) == 1 && allKnown {
		numa = nodes[0]
	}
	var topo []int
	if !p.ExcludeTopology {
		topo = nodes
	}
	out := make([]slot, p.RdmaHcaMax)
	for i := range out {
		id := fmt.Sprintf("%s-%03d", p.Name, i)
		if numa >= 0 {
			id = fmt.Sprintf("%s-numa%d-%03d", p.Name, numa, i)
		}
		out[i] = slot{ID: id, Topology: topo, NUMA: numa, Functions: hcas, Healthy: anyHealthy}
	}
	return out
}

// sameSlots reports whether two device lists look the same to the kubelet.
func sameSlots(a, b []slot) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Healthy != b[i].Healthy || !slices.Equal(a[i].Topology, b[i].Topology) {
			return false
		}
	}
	return true
}
